"""`plan profile` launched for real (gloo, CPU, every launch a subprocess with a timeout): three
hosts of one rank measure the network, and a profile of two processes that `plan solve` then
plans with. The fits, FLOP counts and refusals without a launch are
tests/unit/profiler/test_profile.py."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.specs import ClusterSpec, Collective

torch = pytest.importorskip("torch")

from tests.unit.profiler.test_profile import GPT  # noqa: E402


@pytest.mark.distributed
def test_three_hosts_of_one_rank_measure_the_network(tmp_path):
    """Three `plan profile` launches, one rank per host, on this machine: the tier across hosts
    holds every collective, point-to-point included, as measured (three ranks do not pair up
    evenly; the profile used to drop the tier and write 1e6 GB/s for every link)."""
    from planner.distributed.launch import free_port

    model = tmp_path / "tiny.json"
    model.write_text(GPT.model_copy(update={"num_layers": 2, "hidden_size": 64, "max_seq_len": 64}).model_dump_json())
    out = tmp_path / "profile.json"
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "planner.cli.main",
                "profile",
                "--model",
                str(model),
                "--quick",
                "--nnodes",
                "3",
                "--node-rank",
                str(i),
                "--nproc-per-node",
                "1",
                "--rdzv-endpoint",
                endpoint,
                "--backend",
                "gloo",
                "-o",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-1500:] for _, err in results]
    cluster = ClusterSpec.model_validate_json(out.read_text())
    assert cluster.num_nodes == 3 and cluster.gpus_per_node == 1
    fits = {f.collective: f for f in cluster.inter_node.collectives}
    assert set(fits) == set(Collective) and all(0 < f.bandwidth_gbps < 1e4 for f in fits.values()), fits
    measured = {(s.collective, s.group_size, s.inter_node) for s in cluster.measured.collectives}
    assert (Collective.p2p, 3, True) in measured and cluster.intra_node.collectives == cluster.inter_node.collectives


@pytest.mark.distributed
def test_profile_two_processes_then_solve(tmp_path):
    """`plan profile --nproc-per-node 2 --quick`, then `plan solve --cluster profile.json --gpus 2`."""
    model = tmp_path / "tiny.json"
    model.write_text(GPT.model_dump_json())
    out = tmp_path / "profile.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "profile",
            "--model",
            str(model),
            "--nproc-per-node",
            "2",
            "--quick",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    # stderr is a pipe: the estimate first, then plain lines, each item named as it starts, the end
    # at work_items' count, and the time it took (issue 18, 9: nothing showed off a terminal)
    err = run.stderr.splitlines()
    assert err[0].startswith("plan profile: estimate before starting: about "), run.stderr[-2000:]
    assert "gathering the measurements" in err[-3], run.stderr[
        -2000:
    ]  # the launcher follows the last line: quick items may not show
    done, total = err[-3].split("] ")[1].split(" ")[0].split("/")
    assert done == total and err[-2].startswith("plan profile: measured in "), run.stderr[-2000:]
    assert err[-1] == f"profile written to {out}" and "written" not in run.stdout  # on stderr, as every command's -o
    cluster = ClusterSpec.model_validate_json(out.read_text())  # round trip through the schema
    assert ClusterSpec.model_validate_json(cluster.model_dump_json()) == cluster
    m = cluster.measured
    assert m.environment.world_size == 2 and m.environment.backend == "gloo"
    assert {s.collective for s in m.collectives} == set(Collective)
    assert cluster.intra_node.has(
        Collective.all_to_all
    )  # measured (all_to_all_single on gloo), so the MoE exchange uses it
    assert all(s.bandwidth_gbps > 0 and s.latency_us >= 0 for s in m.collectives)
    # the TP and ZeRO-3 stacks, timed as plan run executes them, set each call's overhead
    overheads = cluster.intra_node.call_overhead_us
    assert set(overheads) == {Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter}
    assert all(v >= 0 for v in overheads.values())
    # every layer FLOP count equals the cost model's
    assert all(x.flops_forward == pytest.approx(x.analytic_flops_forward) for x in m.layers if x.kind != "embedding")
    solved = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "solve",
            "--model",
            str(model),
            "--cluster",
            str(out),
            "--gpus",
            "2",
            "--global-batch",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(solved.stdout)
    assert doc["cluster"]["measured"]["environment"]["world_size"] == 2
    assert doc["job"]["precision"] == "fp32"  # the profile's dtype
    shown = CliRunner().invoke(cli, ["profile", "--show", str(out)])
    assert shown.exit_code == 0 and "Per-layer measurements" in shown.output and "GEMM sweep" in shown.output
