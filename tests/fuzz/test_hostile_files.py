"""Hostile files (issue 19, items 1-3 and the file parts of 10-12), generated as a cross product:
every command that reads a file, given every kind of thing that is not a readable spec (a FIFO,
a device, a directory, a symlink loop, a dangling link, a name over 255 bytes, a YAML alias
bomb), and every command that writes `-o`, pointed at its own input (through a symlink, a hard
link, a model directory's config.json, a hub-cache snapshot link) or at a stream, a FIFO, a loop
or a long name. Each must end as tests/hostile.py promises: one line, exit 1 or 2, nothing
touched, within 10 s. The mechanism under test is planner/datafile.py: read_input (the one
opener), _load_yaml (bounded aliases and nodes) and check_output (the resolved-inputs set).

Kinds that would hang (a FIFO, a pipe on stdin) or fill memory (/dev/zero) if the opener ever
regressed run in one child process with a memory limit and an alarm, so a regression fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from planner.datafile import MAX_YAML_NODES, check_output, inputs_scope, read_input, read_mapping, write_atomic
from planner.errors import UsageError
from tests.hostile import assert_refused, assert_refused_subprocess, snapshot
from tests.paths import ROOT

LLAMA_HF = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
SIZE = ["--gpus", "8", "--global-batch", "8", "--seq-len", "512"]
LONG = "x" * 300 + ".json"  # one path component over NAME_MAX (255 bytes)
REV = "a" * 40


def bomb(levels: int, width: int = 9) -> str:
    """A YAML "billion laughs": each anchor a list of `width` aliases of the one before (width^levels values)."""
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# ----- every command that reads a file, x every kind of file

READERS = {  # {F}: the file the command reads
    "estimate --model": ["estimate", "--model", "{F}", "--cluster", "dgx-a100-80gb", *SIZE],
    "estimate --cluster": ["estimate", "--model", "gpt2-124m", "--cluster", "{F}", *SIZE],
    "estimate --plan": ["estimate", "--plan", "{F}"],
    "solve --model": ["solve", "--model", "{F}", "--cluster", "dgx-a100-80gb", *SIZE],
    "solve --cluster": ["solve", "--model", "gpt2-124m", "--cluster", "{F}", *SIZE],
    "show": ["show", "{F}"],
    "export": ["export", "{F}", "--to", "megatron"],
    "run": ["run", "{F}"],
    "profile --show": ["profile", "--show", "{F}"],
    "tune --resume": ["tune", "--resume", "{F}"],  # the journal (planner/tune/journal.py:read)
}
SAFE_KINDS = {  # name in the directory -> how it is made; none of these can block or fill memory
    "directory": "dir.json",
    "symlink loop": "loop.json",
    "dangling symlink": "dangling.json",
    "300-byte name": LONG,
    "300-byte directory": "y" * 300 + "/plan.json",
    "alias bomb (700 bytes, 10 levels)": "bomb.yaml",
    "recursive alias": "recursive.yaml",
    "YAML of 2 MB": "{BIG}/big.yaml",  # outside the directory: hashing them for each snapshot would cost seconds
    "sparse 60 MB YAML": "{BIG}/huge.yaml",
    "JSON of 3 MB": "{BIG}/big.json",
    "sparse 60 MB JSON": "{BIG}/huge.json",
    "/dev/null": "/dev/null",
}
HANGING_KINDS = {
    "FIFO": "fifo.json",
    "/dev/zero": "/dev/zero",
    "/dev/urandom": "/dev/urandom",
    "/dev/stdin (a pipe)": "/dev/stdin",
}


def _args(template: list[str], f: str) -> list[str]:
    return [f if a == "{F}" else a for a in template]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """YAML of 2 MB (700,001 values), JSON of 3 MB (a million empty lists), sparse files of 60 MB."""
    d = tmp_path_factory.mktemp("big")
    (d / "big.yaml").write_text("num_layers: [" + "1, " * 700_000 + "1]\n")
    (d / "big.json").write_text('{"num_layers": [' + "[], " * 1_000_000 + "[]]}")
    for name in ("huge.yaml", "huge.json"):
        with open(d / name, "wb") as f:
            f.truncate(60 * 2**20)
    return d


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A directory of every file kind, a model directory, a plan, and a tiny Hugging Face cache."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "dir.json").mkdir()
    (d / "loop.json").symlink_to("loop.json")
    (d / "dangling.json").symlink_to("nowhere.json")
    (d / "bomb.yaml").write_text(bomb(10))
    (d / "recursive.yaml").write_text("name: &a [1, *a]\n")
    os.mkfifo(d / "fifo.json")
    (d / "llama").mkdir()
    (d / "llama" / "config.json").write_text(json.dumps(LLAMA_HF))
    (d / "model.json").write_text(
        json.dumps(
            {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000, "max_seq_len": 512}
        )
    )
    from click.testing import CliRunner

    from planner.cli.main import cli

    r = CliRunner().invoke(
        cli, ["estimate", "--model", "gpt2-124m", "--cluster", "dgx-a100-80gb", *SIZE, "--tp", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    (d / "plan.json").write_text(r.stdout)
    return d


@pytest.fixture
def hub(hostile, monkeypatch) -> Path:
    """models--org--Tiny in $HF_HUB_CACHE as huggingface_hub lays it out: the config in blobs/, a
    snapshot link to it, refs/main (tests/cli/test_everyday_inputs.py:_snapshot)."""
    repo = hostile / "hub" / "models--org--Tiny"
    if not repo.exists():
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / "cafe").write_text(json.dumps(LLAMA_HF))
        (repo / "snapshots" / REV).mkdir(parents=True)
        (repo / "snapshots" / REV / "config.json").symlink_to(
            os.path.relpath(repo / "blobs" / "cafe", repo / "snapshots" / REV)
        )
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(REV)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hostile / "hub"))
    return repo


def test_the_opener_refuses_what_is_no_regular_file_at_once(tmp_path):
    """First, so that with -x a regression stops here, before a device is read without end."""
    os.mkfifo(tmp_path / "f")
    for path, why in [("/dev/zero", "character device"), (str(tmp_path / "f"), "pipe"), (str(tmp_path), "directory")]:
        start = time.monotonic()
        with pytest.raises(UsageError, match=why):
            read_input(path)
        assert time.monotonic() - start < 1
    (tmp_path / "five").write_bytes(b"12345")
    with pytest.raises(UsageError, match="too large"):
        read_input(tmp_path / "five", limit=4)
    assert read_input(tmp_path / "five", limit=5) == b"12345"


READ_CASES = [(f"{cmd} <- {kind}", _args(t, f)) for cmd, t in READERS.items() for kind, f in SAFE_KINDS.items()]


@pytest.mark.slow
@pytest.mark.parametrize("name,args", READ_CASES, ids=[c[0] for c in READ_CASES])
def test_every_reader_refuses_every_file_kind(hostile, big, name, args):
    assert_refused(hostile, [a.replace("{BIG}", str(big)) for a in args], 2, name)


# The kinds that hang or fill memory on a regression: all of them in one child process (one
# interpreter start-up), under a 4 GiB address-space limit and an alarm; a watchdog opens each
# FIFO for writing (and closes stdin's pipe) after the time allowed, so a blocked read ends and
# fails the time check instead of hanging the suite.
_CHILD = r"""
import json, os, pathlib, resource, signal, stat, sys, threading, traceback
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
signal.alarm(240)
from tests.hostile import TIME_ALLOWED_S, assert_refused
directory, cases = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
def unblock():
    os.close(write_end)  # EOF for a read of /dev/stdin
    for entry in os.scandir(directory):
        try:
            if stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode):
                os.close(os.open(entry.path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waiting: nothing blocked
failures = []
for name, args in cases:
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)  # /dev/stdin: a pipe whose writer neither writes nor closes (until the watchdog)
    os.close(read_end)
    watchdog = threading.Timer(TIME_ALLOWED_S + 1, unblock)
    watchdog.start()
    try:
        assert_refused(directory, args, 2, name)
    except BaseException:
        failures.append(name + ": " + traceback.format_exc(limit=1).strip().splitlines()[-1][:300])
        if len(failures) == 3:  # a regression: fail now, not after every case's watchdog
            break
    finally:
        watchdog.cancel()
        try:
            os.close(write_end)
        except OSError:
            pass
print(json.dumps(failures))
"""


def refused_without_blocking(directory: Path, cases: list[tuple[str, list[str]]]) -> None:
    """assert_refused (exit 2) for each (name, args), in one guarded child process (_CHILD);
    also used by tests/fuzz/test_bad_inputs.py for the corpus's FIFOs and devices."""
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], r.stdout
    assert time.monotonic() - start < 20 + 2 * len(cases)


@pytest.mark.slow
def test_every_reader_refuses_fifos_devices_and_streams_without_blocking(hostile):
    refused_without_blocking(
        hostile, [(f"{cmd} <- {kind}", _args(t, f)) for cmd, t in READERS.items() for kind, f in HANGING_KINDS.items()]
    )


@pytest.mark.slow
def test_a_fifo_model_and_a_pipe_on_stdin_through_a_real_process(hostile):
    assert_refused_subprocess(hostile, ["estimate", "--model", "fifo.json", "--cluster", "dgx-a100-80gb", *SIZE], 2)
    read_end, write_end = os.pipe()  # kept open: a blocking read of /dev/stdin would wait for ever
    try:
        line = assert_refused_subprocess(hostile, ["show", "/dev/stdin"], 2, stdin=read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "pipe" in line


# ----- YAML: the bounds, generated


@settings(max_examples=30, deadline=None)
@given(levels=st.integers(1, 14), width=st.integers(1, 12))
def test_yaml_aliases_are_bounded_before_anything_expands_them(tmp_path_factory, levels, width):
    path = tmp_path_factory.mktemp("yaml") / "b.yaml"
    path.write_text(bomb(levels, width))
    start = time.monotonic()
    sizes = [1 + width]  # anchor i: a list of `width` copies of anchor i - 1
    for _ in range(1, levels):
        sizes.append(1 + width * sizes[-1])
    expanded, aliases = 1 + levels + sum(sizes), width * (levels - 1)  # the mapping, its keys, its lists
    try:
        read_mapping(path)
        assert expanded <= MAX_YAML_NODES and aliases <= 100, (levels, width)
    except UsageError as exc:
        assert expanded > MAX_YAML_NODES or aliases > 100, (levels, width, str(exc))
        assert "alias" in str(exc) or "values" in str(exc)
    assert time.monotonic() - start < 3


@pytest.mark.slow
def test_big_files_are_refused_within_seconds(big):
    for name, why in [
        ("big.yaml", "values"),
        ("huge.yaml", "too large"),
        ("big.json", "values"),
        ("huge.json", "too large"),
    ]:
        start = time.monotonic()
        with pytest.raises(UsageError, match=why):
            read_mapping(big / name)
        assert time.monotonic() - start < 5, name


# ----- -o: never over an input, never into a stream, a FIFO, a loop or a long name

WRITERS = {  # {O}: the output; each reads model.json, the llama directory or plan.json
    "estimate --model FILE": (
        ["estimate", "--model", "model.json", "--cluster", "dgx-a100-80gb", *SIZE, "-o", "{O}"],
        "model.json",
    ),
    "estimate --model DIR": (
        ["estimate", "--model", "llama", "--cluster", "dgx-a100-80gb", *SIZE, "-o", "{O}"],
        "llama/config.json",
    ),
    "solve --model DIR": (
        ["solve", "--model", "llama", "--cluster", "dgx-a100-80gb", *SIZE, "-o", "{O}"],
        "llama/config.json",
    ),
    "estimate --plan": (["estimate", "--plan", "plan.json", "--tp", "4", "-o", "{O}"], "plan.json"),
    "export": (["export", "plan.json", "--to", "megatron", "-o", "{O}"], "plan.json"),
    "run": (["run", "plan.json", "-o", "{O}"], "plan.json"),
    "show --timeline": (["show", "plan.json", "--timeline", "{O}"], "plan.json"),
    "profile --model DIR": (["profile", "--model", "llama", "-o", "{O}"], "llama/config.json"),
}
OUTPUT_KINDS = {  # name -> (how to make it from the input's path in the directory, or None, and the -o given)
    "the input itself": (None, "{INPUT}"),
    "a symlink to the input": ("symlink", "link-to-input.svg"),
    "a hard link to the input": ("hardlink", "hard-to-input.svg"),
    "/dev/stdout": (None, "/dev/stdout"),
    "/proc/self/fd/1": (None, "/proc/self/fd/1"),
    "/dev/null": (None, "/dev/null"),
    "a FIFO": (None, "fifo.json"),
    "a symlink loop": (None, "loop.json"),
    "a 300-byte name": (None, LONG),
    "a 300-byte directory": (None, "y" * 300 + "/p.svg"),
}


def _output_cases():
    for cmd, (template, source) in WRITERS.items():
        for kind, (make, out) in OUTPUT_KINDS.items():
            yield f"{cmd} -o {kind}", template, source, make, out


OUT_CASES = list(_output_cases())


@pytest.mark.parametrize("name,template,source,make,out", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_every_writer_refuses_every_output_kind_before_any_work(hostile, name, template, source, make, out):
    target = hostile / out
    if make == "symlink":
        target.symlink_to(source)
    elif make == "hardlink":
        os.link(hostile / source, target)
    try:
        line = assert_refused(hostile, [out.replace("{INPUT}", source) if a == "{O}" else a for a in template], 2, name)
    finally:
        if make:
            target.unlink()
    if make or (out == "{INPUT}" and not name.startswith("show")):  # show checks the picture's extension first
        assert "is the input" in line, line


def test_a_hub_id_never_overwrites_its_cached_blob(hostile, hub):
    link = hub / "snapshots" / REV / "config.json"
    for cmd in (["estimate"], ["solve"]):
        for out in (link, hub / "blobs" / "cafe"):
            line = assert_refused(
                hostile, [*cmd, "--model", "org/Tiny", "--cluster", "dgx-a100-80gb", *SIZE, "-o", str(out)], 2
            )
            assert "is the input" in line
    assert link.is_symlink() and json.loads((hub / "blobs" / "cafe").read_text()) == LLAMA_HF


def test_a_symlink_loop_as_output_is_left_as_it_was(hostile):
    assert_refused(hostile, WRITERS["estimate --model FILE"][0][:-1] + ["loop.json"], 2)
    assert os.readlink(hostile / "loop.json") == "loop.json"


def test_write_atomic_checks_again_what_was_read(tmp_path):
    """At write time too: an input read after -o was checked (or by the Python API inside a scope)."""
    spec = tmp_path / "m.json"
    spec.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(spec)
    with inputs_scope():
        assert check_output(link) == spec  # nothing read yet
        read_input(link)
        for out in (spec, link):
            with pytest.raises(UsageError, match="is the input"):
                write_atomic(out, "plan")
    write_atomic(link, "{}\n")  # outside the scope nothing is recorded: the Python API may rewrite its files
    assert spec.read_text() == "{}\n" and link.is_symlink()


def test_unrelated_outputs_still_work(hostile):
    """The guard is by file identity, not by name: a new file beside the inputs is written."""
    before = snapshot(hostile)
    from click.testing import CliRunner

    from planner.cli.main import cli

    cwd = os.getcwd()
    os.chdir(hostile)
    try:
        r = CliRunner().invoke(
            cli, ["estimate", "--model", "llama", "--cluster", "dgx-a100-80gb", *SIZE, "-o", "llama/plan.json"]
        )
    finally:
        os.chdir(cwd)
    assert r.exit_code == 0, r.output
    assert (hostile / "llama" / "plan.json").is_file()
    (hostile / "llama" / "plan.json").unlink()
    assert snapshot(hostile) == before
