"""benchmarks/scaling_curves.py: where a curve bends and the term named, and its quick grid end to end."""

import pytest

from benchmarks.scaling_curves import Point, find_bend, main

TERMS = ("compute", "pipeline_bubble", "dp_communication_exposed")


def point(gpus: int, per_gpu: float, shares: tuple[float, float, float]) -> Point:
    return Point(gpus, per_gpu, shares=dict(zip(TERMS, shares)))


def test_a_curve_bends_at_the_first_fall_past_ten_percent_naming_the_term_that_grew_most():
    points = [
        point(64, 100.0, (0.90, 0.05, 0.05)),
        point(128, 95.0, (0.88, 0.05, 0.07)),  # 5% below the best: no bend
        Point(256, missing="memory"),  # a gap is skipped, not a bend
        point(512, 85.0, (0.70, 0.06, 0.24)),  # 15% below 100
    ]
    bend = find_bend(points)
    assert bend is not None
    assert (bend.gpus, bend.previous, bend.term) == (512, 128, "dp_communication_exposed")
    assert bend.fall == pytest.approx(0.15)
    assert (bend.share_before, bend.share_after) == pytest.approx((0.07, 0.24))
    assert find_bend(points[:3]) is None
    # the best so far, not the previous point: two falls of 6% make a bend of 12%
    slow = [point(64, 100.0, (1, 0, 0)), point(128, 94.0, (0.9, 0.1, 0)), point(256, 88.0, (0.8, 0.2, 0))]
    bend = find_bend(slow)
    assert bend is not None and (bend.gpus, bend.term) == (256, "pipeline_bubble")


@pytest.mark.slow
def test_the_quick_grid_prints_its_tables_and_draws_the_picture(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "curves.png"
    main(["--quick", "--plot", str(picture)])
    out = capsys.readouterr().out
    assert "llama2-7b on dgx-h100-80gb, global batch 1024 x 4096 tokens" in out
    assert "Where each curve bends" in out and "Published points" in out and "wall time" in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
