"""`plan show`'s pictures are readable at every plan size (planner/draw.py): drawn with
matplotlib's Agg renderer, every text lies inside the figure, no two texts overlap, a legend
sits outside the data and off every label, and an op's micro-batch number lies inside its
box. Plans: the README's quick start (GPT-3 175B on 1,024 A100), Llama 3 8B on 16 GPUs
(tp 2, pp 4), one GPU, 32 pipeline ranks, 48 micro-batches on two, one that does not fit its
GPUs' memory, and a model with a very long name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out

pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from cost_models.estimate import estimate  # noqa: E402
from planner import draw, pictures  # noqa: E402
from planner.cli import show  # noqa: E402
from planner.plan_file import read_plan_file  # noqa: E402

LONG_NAME = "example-organisation/an-extremely-long-model-name-for-a-fine-tuned-llama-3-8b-instruct-v2-final"

_PLANS = {
    "quick-start": [
        "solve",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "1024",
        "--global-batch",
        "1536",
        "--seq-len",
        "2048",
    ],
    # The quick start as one free search once found it (dp 32 x tp 4 x pp 8, vpp 6, 24 micro-batches):
    # a fixed shape for the zoom tests, whatever the search's answer becomes.
    "generic-pp8": [
        "estimate",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "1024",
        "--global-batch",
        "1536",
        "--seq-len",
        "2048",
        "--target",
        "generic",
        "--tp",
        "4",
        "--pp",
        "8",
        "--vpp",
        "6",
        "--micro-batch-size",
        "2",
        "--zero",
        "1",
        "--sequence-parallel",
    ],
    "llama3-8b-16gpu": [
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "32",
        "--seq-len",
        "2048",
        "--tp",
        "2",
        "--pp",
        "4",
        "--recompute",
        "selective",
    ],
    "one-gpu": [
        "estimate",
        "--model",
        "gpt2-124m",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "1",
        "--global-batch",
        "8",
        "--seq-len",
        "1024",
        "--tp",
        "1",
        "--pp",
        "1",
        "--micro-batch-size",
        "1",
    ],
    "pp32": [
        "estimate",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "1024",
        "--global-batch",
        "1536",
        "--seq-len",
        "2048",
        "--tp",
        "8",
        "--pp",
        "32",
        "--micro-batch-size",
        "1",
        "--zero",
        "1",
    ],
    "two-stage": [
        "estimate",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "2",
        "--global-batch",
        "48",
        "--seq-len",
        "2048",
        "--tp",
        "1",
        "--pp",
        "2",
        "--micro-batch-size",
        "1",
    ],
    "over-memory": [
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100-40gb",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--seq-len",
        "2048",
        "--tp",
        "1",
        "--pp",
        "2",
        "--micro-batch-size",
        "1",
    ],
    "long-name": [
        "estimate",
        "--model",
        "MODEL_FILE",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "64",
        "--global-batch",
        "128",
        "--seq-len",
        "4096",
        "--tp",
        "2",
        "--pp",
        "8",
        "--schedule",
        "interleaved-1f1b",
        "--vpp",
        "2",
        "--micro-batch-size",
        "1",
    ],
}


def _cli(*args, fits: bool = True):
    """The command's result; a plan over its memory is still written, and `plan estimate` exits 1 for it."""
    res = subprocess.run([sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True)
    assert res.returncode == (0 if fits else 1), res.stderr
    return res


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Each plan's file, made by the CLI as a user makes it."""
    root = tmp_path_factory.mktemp("layout")
    spec = json.loads(_cli("estimate", *_PLANS["llama3-8b-16gpu"][1:], "--json").stdout)["model"]
    model_file = root / "long.json"
    model_file.write_text(json.dumps({**spec, "name": LONG_NAME}))
    paths = {}
    for name, args in _PLANS.items():
        paths[name] = root / f"{name}.json"
        _cli(
            *[str(model_file) if a == "MODEL_FILE" else a for a in args],
            "-o",
            str(paths[name]),
            fits=name != "over-memory",
        )
    return paths


def _figures(path, which):
    doc = read_plan_file(path)
    est = estimate(doc.model, doc.cluster, doc.job, doc.plan)
    title = show.picture_title(doc)
    if which == "timeline":
        tl = pictures.timeline(doc.model, doc.cluster, doc.job, doc.plan, est)
        return draw.timeline_figure(tl, title, est.step_time_s, est.time_breakdown_s.pipeline_bubble / est.step_time_s)
    if which == "memory":
        return draw.memory_figure(pictures.memory_bars(est), est.memory_capacity_gib, title)
    return draw.placement_figure(pictures.placement(doc.plan, doc.cluster), title)


def drawn_texts(fig):
    """(text, window extent in pixels) of every text the renderer actually draws (a tick
    outside the view or on a hidden axis is not drawn), after a full draw."""
    drawn = []
    original = Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return original(self, renderer)

    canvas = FigureCanvasAgg(fig)
    with mock.patch.object(Text, "draw", record):
        canvas.draw()
    renderer = canvas.get_renderer()
    return renderer, [(t, t.get_window_extent(renderer)) for t in drawn]


def _overlap(a, b, slack=0.5) -> bool:
    return a.x0 + slack < b.x1 and b.x0 + slack < a.x1 and a.y0 + slack < b.y1 and b.y0 + slack < a.y1


def _overlapping(boxes) -> list[tuple[int, int]]:
    """Index pairs of boxes that overlap (a sweep over x, not all pairs: placements hold 9,000 texts)."""
    order = sorted(range(len(boxes)), key=lambda i: boxes[i].x0)
    pairs = []
    for k, i in enumerate(order):
        for j in order[k + 1 :]:
            if boxes[j].x0 + 0.5 >= boxes[i].x1:
                break
            if _overlap(boxes[i], boxes[j]):
                pairs.append((i, j))
    return pairs


def _name(t) -> str:
    return repr(t.get_text()[:60])


def assert_readable(fig):
    """Every text inside the figure; no two texts overlap; every legend outside every axes'
    data area and off every text that is not its own."""
    renderer, texts = drawn_texts(fig)
    width, height = fig.bbox.width, fig.bbox.height
    for t, box in texts:
        assert box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= width + 0.5 and box.y1 <= height + 0.5, (
            f"{_name(t)} at {box.bounds} is cut by the {width:.0f} x {height:.0f} figure"
        )
    pairs = _overlapping([box for _, box in texts])
    assert not pairs, "overlapping texts: " + "; ".join(
        f"{_name(texts[i][0])} and {_name(texts[j][0])}" for i, j in pairs[:5]
    )
    legends = [leg for leg in fig.findobj(lambda a: a.__class__.__name__ == "Legend")]
    for leg in legends:
        box = leg.get_window_extent(renderer)
        own = set(map(id, leg.get_texts()))
        for ax in fig.axes:
            assert not _overlap(box, ax.bbox), f"the legend {box.bounds} lies over the data {ax.bbox.bounds}"
        for t, tb in texts:
            assert id(t) in own or not _overlap(box, tb), f"the legend lies over {_name(t)}"


@pytest.mark.parametrize("which", ["timeline", "memory", "placement"])
@pytest.mark.parametrize("plan", list(_PLANS))
def test_picture_is_not_clipped(plans, plan, which):
    fig = _figures(plans[plan], which)
    assert_readable(fig)
    assert fig.get_figwidth() <= 40 and fig.get_figheight() <= 60


@pytest.mark.parametrize("plan", ["quick-start", "one-gpu", "over-memory"])
def test_memory_device_label_off_the_bars(plans, plan):
    """The device's capacity is labelled where no bar covers it, also when the plan does not fit
    (the legend and the other texts: test_picture_is_not_clipped)."""
    fig = _figures(plans[plan], "memory")
    renderer, texts = drawn_texts(fig)
    label = [box for t, box in texts if t.get_text().strip().startswith("device")]
    assert len(label) == 1
    for patch in fig.axes[0].patches:
        assert not _overlap(label[0], patch.get_window_extent(renderer)), "a bar covers the device label"


@pytest.mark.parametrize("plan", ["llama3-8b-16gpu", "one-gpu", "two-stage"])
def test_op_labels_inside_their_boxes(plans, plan):
    """A micro-batch number is drawn only where it fits inside its op's box."""
    fig = _figures(plans[plan], "timeline")
    renderer, texts = drawn_texts(fig)
    ax = fig.axes[0]
    boxes = []
    for c in ax.collections:
        if (c.get_gid() or "").startswith("ops-rank"):
            boxes += [p.get_extents(c.get_transform()) for p in c.get_paths()]
    labels = [(t, box) for t, box in texts if t.axes is ax and t.get_text().isdigit()]
    assert labels, "no op is labelled"
    for t, box in labels:
        assert any(
            b.x0 - 0.5 <= box.x0 and box.x1 <= b.x1 + 0.5 and b.y0 - 0.5 <= box.y0 and box.y1 <= b.y1 + 0.5
            for b in boxes
        ), f"micro-batch label {_name(t)} at {box.bounds} overflows its op"


def test_timeline_no_wider_than_its_bound(plans):
    """768 passes a rank (pp 32, 384 micro-batches) still make a picture at most 24 inches wide."""
    fig = _figures(plans["pp32"], "timeline")
    assert fig.get_figwidth() <= draw.TIMELINE_WIDTH_IN


# --- zoom: plan show --micro-batches A-B / --ranks A-B ---------------------------------------


def _timeline(path):
    doc = read_plan_file(path)
    est = estimate(doc.model, doc.cluster, doc.job, doc.plan)
    return pictures.timeline(doc.model, doc.cluster, doc.job, doc.plan, est), est


@pytest.mark.parametrize(
    "plan,micro_batches,ranks",
    [
        ("generic-pp8", (4, 7), (2, 5)),
        ("generic-pp8", None, (7, 7)),
        ("llama3-8b-16gpu", (0, 3), None),
        ("llama3-8b-16gpu", (15, 15), (1, 2)),
        ("pp32", (100, 110), (0, 3)),
    ],
)
def test_window_is_the_same_replay_cropped(plans, plan, micro_batches, ranks):
    """A window's span runs from the first start to the last end of its passes (from 0 with
    micro-batch 0, to the ranks' optimizer with the last); its picture shows those ranks over
    that span, the window's passes opaque and other micro-batches' passes in it pale, and says so."""
    tl, est = _timeline(plans[plan])
    win = pictures.window(tl, micro_batches, ranks)
    mine = [op for op in tl.ops if win.chosen(op)]
    rk = ranks or (0, tl.pp - 1)
    mb = micro_batches or (0, tl.num_micro_batches - 1)
    assert {(op.rank, op.micro_batch) for op in mine} == {
        (r, i) for r in range(rk[0], rk[1] + 1) for i in range(mb[0], mb[1] + 1)
    }
    assert win.start == (0.0 if mb[0] == 0 else min(op.start for op in mine))
    tails = [s + d for r in win.ranks for _, s, d in tl.tails[r]] if mb[1] == tl.num_micro_batches - 1 else []
    assert win.end == max([op.end for op in mine] + tails)
    fig = draw.timeline_figure(tl, "t", est.step_time_s, 0.0, win)
    assert_readable(fig)
    ax = fig.axes[0]
    assert ax.get_xlim() == (win.start, win.end)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"pp {r}" for r in win.ranks]
    shown = [op for op in tl.ops if op.rank in win.ranks and op.start < win.end and op.end > win.start]
    outlines = [c for c in ax.collections if (c.get_gid() or "").startswith("ops-rank")]
    assert sum(len(c.get_paths()) for c in outlines) == len(shown)
    pale = [c for c in ax.collections if c.get_alpha() == draw.PALE]
    assert bool(pale) == (len(shown) > len(mine))
    assert win.describe(tl) in fig.get_suptitle()


def test_whole_window_is_the_step(plans):
    tl, _ = _timeline(plans["quick-start"])
    win = pictures.window(tl)
    assert (win.start, win.end) == (0.0, tl.step_time) and win.is_whole(tl)


def _show(path, *args):
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "show", str(path), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )


def test_show_zoom_writes_the_window(plans, tmp_path):
    out = tmp_path / "zoom.png"
    res = _show(plans["generic-pp8"], "--timeline", str(out), "--micro-batches", "4-7", "--ranks", "2-5")
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = re.findall(r"^pp (\d+) +\|", res.stdout, flags=re.M)
    assert rows == ["2", "3", "4", "5"]  # the text timeline is zoomed too
    assert "zoom: pipeline ranks 2-5 of 0-7, micro-batches 4-7 of 0-23" in res.stdout
    doc = json.loads(_show(plans["generic-pp8"], "--micro-batches", "4-7", "--ranks", "2-5", "--json").stdout)
    assert doc["timeline"]["window"]["pipeline_ranks"] == [2, 5] and doc["timeline"]["window"]["micro_batches"] == [
        4,
        7,
    ]


def test_text_timeline_says_when_too_dense(plans):
    """The quick start's 288 passes a rank cannot be told apart in 111 characters: say how to zoom;
    Llama 3 8B's 32 can, and nothing is said."""
    assert "run together" in _show(plans["quick-start"]).stdout
    assert "run together" not in _show(plans["llama3-8b-16gpu"]).stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--micro-batches", "24"], "--micro-batches 24: the plan has 24 micro-batches, numbered 0-23"),
        (["--micro-batches", "20-40"], "--micro-batches 20-40: the plan has 24 micro-batches, numbered 0-23"),
        (["--micro-batches", "7-3"], "the range runs backwards; give A-B with A <= B, e.g. --micro-batches 3-7"),
        (["--micro-batches", "-1"], "give a range A-B of numbers from 0"),
        (["--micro-batches", "1.5"], "give a range A-B of numbers from 0"),
        (["--ranks", "8"], "--ranks 8: the plan has 8 pipeline ranks, numbered 0-7"),
        (["--ranks", "0-99999999999"], "--ranks 0-99999999999: the plan has 8 pipeline ranks, numbered 0-7"),
        (["--ranks", "1" * 40], "give a range A-B of numbers from 0"),
        (["--ranks", "a-b"], "give a range A-B of numbers from 0"),
    ],
)
def test_show_bad_zoom_one_line_no_file(plans, tmp_path, args, message):
    out = tmp_path / "t.png"
    res = _show(plans["generic-pp8"], "--timeline", str(out), *args)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not list(tmp_path.iterdir())


# --- the README's pictures: docs/make_pictures.sh -------------------------------------------

_DOCS = ROOT / "docs"
_SHIPPED = [
    "quick-start-timeline.png",
    "quick-start-memory.png",
    "quick-start-timeline-zoom.png",
    "llama3-8b-16gpu-placement.png",
    "llama3-8b-16gpu-timeline.png",
    "size-llama3-70b-15t.png",
]


def _software(png: bytes) -> str:
    """The PNG's Software text (matplotlib writes its version there)."""
    import struct

    i = 8
    while i < len(png):
        (n,), kind = struct.unpack(">I", png[i : i + 4]), png[i + 4 : i + 8]
        if kind == b"tEXt" and png[i + 8 : i + 8 + n].startswith(b"Software\0"):
            return png[i + 17 : i + 8 + n].decode()
        i += 12 + n
    return ""


def test_readme_pictures_are_what_the_readme_commands_draw(tmp_path):
    """docs/make_pictures.sh (the README's commands) redraws every shipped picture byte for byte;
    compared only where this matplotlib drew the shipped ones (another version rasterises
    differently)."""
    import matplotlib

    shipped = {name: (_DOCS / name).read_bytes() for name in _SHIPPED}
    made_by = {_software(png) for png in shipped.values()}
    if made_by != {f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/"}:
        pytest.skip(f"the shipped pictures were drawn by {made_by}, not matplotlib {matplotlib.__version__}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["bash", str(_DOCS / "make_pictures.sh"), str(tmp_path)], check=True, env=env, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(_SHIPPED)
    for name, png in shipped.items():
        assert (tmp_path / name).read_bytes() == png, f"docs/{name} is not what docs/make_pictures.sh draws: run it"
