"""benchmarks/solve_population.py's population is fixed: its clusters are a named list of presets,
so that a preset added later (dgx-b300, gb300-nvl72) changes no instance."""

from benchmarks.solve_population import ISSUE_CASES, POPULATION_CLUSTERS, population
from hardware_profiles import cluster_presets, load_cluster


def test_the_population_draws_from_its_named_presets_only():
    assert set(POPULATION_CLUSTERS) <= set(cluster_presets())
    assert {"dgx-b300", "gb300-nvl72"} <= set(cluster_presets()) - set(POPULATION_CLUSTERS)
    for name in POPULATION_CLUSTERS:
        load_cluster(name)
    cases = population(22, 60)
    drawn = cases[len(ISSUE_CASES) :]
    assert {c["cluster"] for c in drawn} == set(POPULATION_CLUSTERS)
    # draw i takes cluster i mod 9, in the list's order: the order the presets had when the population was fixed
    assert [c["cluster"] for c in drawn[:9]] == [POPULATION_CLUSTERS[(i + len(ISSUE_CASES)) % 9] for i in range(9)]
    assert population(22, 60) == cases
