"""Hostile options, names and streams (issue 19: the option parts of items 6 and 7, the stream and
terminal parts of item 11, item 12's messages), generated rather than listed.

The mechanisms under test: planner/cli/types.py (every number an option takes is ASCII digits
within the README's bounds, read by planner/numerals.py), and the output guard of
planner/cli/main.py with render.printable / render.SafeConsole (at most one line on stderr with
control characters escaped, whatever the name; a closed, full or broken stdout, an encoding
that cannot write a name, or an early Ctrl-C is one line, or none for a broken pipe, never a
traceback)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from planner.cli import types
from planner.cli.main import cli
from tests.hostile import assert_refused
from tests.paths import ROOT

HYPOTHESIS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD_MODEL = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000, "max_seq_len": 512}
SIZE = ["--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "16", "--seq-len", "512"]
# What each command needs besides the option under test, for click to parse it (nothing is read).
BASE = {"estimate": [], "solve": [], "show": ["p.json"], "export": ["p.json", "--to", "megatron"]}
NUMERIC = (types.Whole, types.Real, types.WholeList, types.Span)


def _options(command: str) -> list[click.Option]:
    return [p for p in cli.commands[command].params if isinstance(p, click.Option) and isinstance(p.type, NUMERIC)]


OPTIONS = [(c, p.opts[0]) for c in BASE for p in _options(c)]


def test_no_option_reads_a_number_with_int_or_float():
    """Every number-valued option of every command goes through planner/cli/types.py: click's
    INT and FLOAT (int() / float()) take '٦', '0_6', '+6', ' 6', 'nan'."""
    lax = (click.types.IntParamType, click.types.FloatParamType)
    for name in ("estimate", "solve", "show", "export", "presets", "schema"):
        for p in cli.commands[name].params:
            assert not isinstance(p.type, lax), (name, p.opts, p.type)
    assert len(OPTIONS) >= 20, OPTIONS


# ----- the oracle: what each type must accept, written apart from planner/numerals.py

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _expected(kind, text: str):
    """The value `text` must give, or None where it must be refused."""
    if isinstance(kind, types.Whole):
        n = int(text) if _DIGITS.fullmatch(text) and len(text) < 30 else None
        return n if n is not None and kind.low <= n <= kind.high else None
    if isinstance(kind, types.Real):
        if not _DECIMAL.fullmatch(text) or len(text) > 64:
            return None
        x = float(text)
        above_low = kind.low <= x if kind.low_allowed else kind.low < x
        return x if math.isfinite(x) and above_low and x <= kind.high else None
    if isinstance(kind, types.WholeList):
        pieces = [p.strip(" ") for p in text.split(",")]
        if not all(_DIGITS.fullmatch(p) and len(p) < 30 for p in pieces):
            return None
        numbers = [int(p) for p in pieces]
        return numbers if all(kind.low <= n <= kind.high for n in numbers) else None
    first, dash, last = text.partition("-")
    a, b = first.strip(" "), (last if dash else first).strip(" ")
    if not (_DIGITS.fullmatch(a) and _DIGITS.fullmatch(b)) or len(b) > 30 or int(b) >= 10**18:
        return None
    return (int(a), int(b)) if int(a) <= int(b) else None


OTHER_DIGITS = "٠١٦۶६൬௬໖０"  # Arabic-Indic, Extended Arabic-Indic, Devanagari, Malayalam, Tamil, Lao, fullwidth
_piece = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.integers(10**8, 10**40).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "2",
            "6",
            "-0",
            "+6",
            "0_6",
            " 6",
            "6 ",
            "٦",
            "6.0",
            "1e3",
            "nan",
            "inf",
            "-inf",
            "1e999",
            "",
            "0x10",
            "1_000",
            "\t6",
            "6\n",
            "\x1b[2J",
            "٦,٦",
            "0_6,6",
            "+6,+6",
            "6,,6",
            "3-1",
            "0-3",
            "1 - 2",
        ]
    ),
    st.text(alphabet="0123456789+-_ .,eE\t" + OTHER_DIGITS, max_size=12),
)
OPTION_TEXT = st.one_of(_piece, st.lists(_piece, min_size=1, max_size=4).map(",".join))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("options")
    (d / "good.json").write_text(json.dumps(GOOD_MODEL))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("command,option", OPTIONS, ids=[f"{c} {o}" for c, o in OPTIONS])
@HYPOTHESIS
@given(text=OPTION_TEXT)
def test_an_option_takes_its_numbers_and_refuses_the_rest(workdir, command, option, text):
    """Parsed alone (click's make_context: nothing read), a value is taken exactly when the
    oracle says so, as the oracle's value; refused through the whole CLI, it is one line naming
    the option and quoting what was given."""
    param = next(p for p in _options(command) if p.opts[0] == option)
    want = _expected(param.type, text)
    args = [*BASE[command], option, text]
    if want is not None:
        ctx = cli.commands[command].make_context(command, list(args))
        assert ctx.params[param.name] == want, (option, text, ctx.params[param.name])
        return
    with pytest.raises(click.BadParameter):
        cli.commands[command].make_context(command, list(args))
    line = assert_refused(workdir, [command, *args], 2, name=f"{option} {text!r}")
    assert f"'{option}'" in line or option in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--model", "gpt2-124m", *SIZE, "--pp", "2", "--layers-per-stage", "6,6"],
        ["estimate", "--model", "gpt2-124m", *SIZE, "--pp", "2", "--layers-per-stage", "5, 7"],
        ["estimate", "--model", "gpt2-124m", *SIZE, "--tp", "0004"],
        [
            "solve",
            "--model",
            "gpt2-124m",
            *SIZE,
            "--top-k",
            "0",
            "--fix",
            "tp=2",
            "--time-limit",
            "30",
            "--max-memory-gib",
            "70.5",
        ],
    ],
)
def test_valid_values_still_plan(args):
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0 and r.stderr == "", (args, r.output)


def test_a_refused_number_says_what_was_given_and_what_is_allowed(workdir):
    solve = ["solve", "--model", "gpt2-124m", *SIZE]
    line = assert_refused(workdir, [*solve, "--top-k", "-5"], 2)
    assert "-5 is out of range; give a whole number from 0 to 1,000" in line, line
    line = assert_refused(
        workdir, ["estimate", "--model", "gpt2-124m", *SIZE, "--pp", "2", "--layers-per-stage", "٦,٦"], 2
    )
    assert "'٦,٦' is not a list of whole numbers" in line, line
    for fix in ["tp=+2", "tp= 2", "tp=٢", "tp=0_2", "zero=-0"]:
        line = assert_refused(workdir, [*solve, "--fix", fix], 2)
        assert line.startswith(f"error: --fix {fix!r}"), line


# ----- what-if changes and export: one line on a refusal


@pytest.fixture(scope="module")
def plan_file(workdir) -> Path:
    r = CliRunner().invoke(
        cli, ["estimate", "--model", "gpt2-124m", *SIZE, "--tp", "2", "--pp", "2", "-o", str(workdir / "p.json")]
    )
    assert r.exit_code == 0, r.output
    return workdir / "p.json"


@pytest.mark.parametrize("option", ["--dp", "--tp", "--pp", "--cp", "--micro-batch-size", "--ep", "--vpp", "--gpus"])
def test_a_what_if_of_zero_is_one_usage_line(workdir, plan_file, option):
    line = assert_refused(workdir, ["estimate", "--plan", plan_file.name, option, "0"], 2)
    assert f"'{option}': 0 is out of range" in line, line


def test_a_what_if_that_fails_prints_only_the_error(workdir, plan_file):
    """Before: "changed from p.json: ..." and then the error (two lines)."""
    line = assert_refused(
        workdir, ["estimate", "--plan", plan_file.name, "--global-batch", "8192", "--micro-batch-size", "4096"], 1
    )
    assert line.startswith("error: the plan does not fit"), line
    r = CliRunner().invoke(cli, ["estimate", "--plan", str(plan_file), "--global-batch", "32"])
    assert r.exit_code == 0 and r.stderr.startswith("changed from ") and r.stderr.count("\n") == 1, r.stderr


def test_export_without_to_is_one_line(workdir, plan_file):
    line = assert_refused(workdir, ["export", plan_file.name], 2)
    assert "Missing option '--to'. Choose from: megatron, deepspeed, torchtitan, accelerate" in line, line


# ----- names: no control character reaches the terminal raw

_HOSTILE_CHARS = "\x1b[31m\n\r\t\x00\x07\x08\x7f\x85\x9b\u2028\u2029\u202e\u2066\udc80é模"
NAME = st.lists(
    st.sampled_from(list(_HOSTILE_CHARS) + ["a", "b", " ", "[", "]", "[bold]", "[/bold]", "[/]", "error: "]),
    min_size=1,
    max_size=12,
).map("".join)
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202e\u2066\ud800-\udfff]")


CLUSTER = json.loads((ROOT / "hardware_profiles/presets/dgx-a100-80gb.json").read_text())


@HYPOTHESIS
@given(name=NAME, cluster_name=NAME)
def test_names_with_control_characters_or_markup_are_shown_escaped(tmp_path_factory, name, cluster_name):
    """A model's and a cluster's (and its device's) name, through estimate's tables, solve's
    report and show's pictures in text: no raw control character, never a rich MarkupError."""
    d = tmp_path_factory.mktemp("name")
    (d / "m.json").write_text(json.dumps({**GOOD_MODEL, "name": name}))
    (d / "c.json").write_text(
        json.dumps({**CLUSTER, "name": cluster_name, "device": {**CLUSTER["device"], "name": cluster_name}})
    )
    files = ["--model", "m.json", "--cluster", "c.json", *SIZE[2:]]
    cwd = os.getcwd()
    os.chdir(d)
    try:
        for args in (
            ["estimate", *files, "-o", "p.json"],
            ["show", "p.json"],
            ["solve", *files, "--target", "megatron"],
        ):
            r = CliRunner().invoke(cli, args)
            if r.exit_code != 0:  # an input layer that refuses such names: then one escaped line
                lines = r.stderr.strip().splitlines()
                assert r.exit_code == 2 and len(lines) == 1 and not _RAW.search(lines[0]), (args, r.output, r.exception)
                break
            assert not _RAW.search(r.stdout), (args, [line for line in r.stdout.splitlines() if _RAW.search(line)])
            assert not _RAW.search(r.stderr), (args, r.stderr)
    finally:
        os.chdir(cwd)


@HYPOTHESIS
@given(key=NAME)
def test_a_key_with_control_characters_is_one_escaped_error_line(tmp_path_factory, key):
    d = tmp_path_factory.mktemp("key")
    (d / "m.json").write_text(json.dumps({**GOOD_MODEL, key: 1}))
    line = assert_refused(d, ["estimate", "--model", "m.json", *SIZE], 2, name=repr(key))
    assert not _RAW.search(line) and "\x1b" not in line, line


def test_a_model_directory_whose_name_is_not_utf8_is_named_readably(tmp_path):
    """An undecodable byte of a directory name is a lone surrogate in Python (surrogateescape),
    which no output can write, and a name holds no control character: the model's name carries
    U+FFFD for each, and --json works."""
    hf = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    directory = os.path.join(os.fsencode(tmp_path), b"llama\xff\x1b[31m")
    os.mkdir(directory)
    with open(os.path.join(directory, b"config.json"), "w") as f:
        json.dump(hf, f)
    r = CliRunner().invoke(cli, ["estimate", "--model", os.fsdecode(directory), *SIZE, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"]["name"] == "llama\ufffd\ufffd[31m"


def test_plan_alone_is_one_line():
    r = CliRunner().invoke(cli, [])
    assert (
        r.exit_code == 2
        and r.stderr.startswith("error: give a command: estimate, export, ")
        and r.stderr.count("\n") == 1
    )


# ----- streams and signals, through a real process

PLAN = [sys.executable, "-m", "planner.cli.main"]


def _run(args, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([*PLAN, *args], timeout=60, env={**os.environ, "COLUMNS": "100", **kw.pop("env", {})}, **kw)


def _one_line(stderr: bytes) -> str:
    text = stderr.decode()
    lines = text.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("error: ")
        and "Traceback" not in text
        and "Exception ignored" not in text
    ), text
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("args", [["presets"], ["schema"]])  # rich's console, click.echo
def test_a_closed_stdout_is_one_line(args):
    r = _run(args, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and "standard output: it is closed" in _one_line(r.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["presets"], ["presets", "--json"]])
def test_a_full_disk_on_stdout_is_one_line(args):
    with open("/dev/full", "w") as full:
        r = _run(args, stdout=full)
    assert r.returncode == 1 and "No space left on device" in _one_line(r.stderr)


@pytest.mark.slow
def test_a_closed_stderr_leaves_stdout_to_the_output():
    r = _run(["estimate", "--model", "gpt2-124m"], preexec_fn=lambda: os.close(2), stdout=subprocess.PIPE, stderr=None)
    assert r.returncode == 2 and r.stdout == b"", r.stdout


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`plan presets | head -1`: exit 1 and nothing on stderr, as click and the Python
    documentation ("Note on SIGPIPE") do; the shell's SIGPIPE (141) would need the default
    handler, which Python replaces."""
    p = subprocess.Popen([*PLAN, "presets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the child writes: its import alone takes most of a second
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and err == b"", err


@pytest.mark.slow
def test_an_ascii_terminal_shows_a_non_ascii_name_escaped(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({**GOOD_MODEL, "name": "modèle-模型"}))
    r = _run(
        ["estimate", "--model", "m.json", *SIZE],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    assert r.stdout.isascii() and b"mod\\xe8le-\\u6a21\\u578b" in r.stdout
    js = _run(
        ["estimate", "--model", "m.json", *SIZE, "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert js.returncode == 0 and json.loads(js.stdout)["model"]["name"] == "modèle-模型", js.stderr


@pytest.mark.slow
def test_a_lone_surrogate_in_a_name_never_gives_a_traceback(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({**GOOD_MODEL, "name": "bad\udc80name"}))
    r = _run(["estimate", "--model", "m.json", *SIZE], cwd=tmp_path, stdout=subprocess.PIPE)
    assert (r.returncode == 0 and b"bad\\udc80name" in r.stdout) or (r.returncode in (1, 2) and _one_line(r.stderr)), (
        r.stderr
    )
    assert b"Traceback" not in r.stderr


PACKAGE = str(ROOT / "planner")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3, 0.5])
def test_ctrl_c_while_the_command_loads_is_one_line(delay):
    """SIGINT in the first half second lands in the imports, before the guard: the hook of
    planner/_interrupt.py (held from the first line of planner/__init__.py) makes it the guard's
    line and exit code. Earlier than that is the interpreter's own start-up (its site packages:
    about 0.1 s here, an editable install's finder), which no code of ours can reach."""
    p = subprocess.Popen([*PLAN, "presets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    text = err.decode()
    if "Traceback" in text or "Fatal Python error" in text:
        # before planner/__init__.py ran: no frame in our files (an editable install's finder,
        # interrupted on a cold start, may quote our path in its own source line)
        assert f'File "{PACKAGE}' not in text, text
        return
    if p.returncode == 0:
        # a fast machine (CI's) finishes the whole listing before the latest signal: then the
        # signal found nothing to interrupt, and the output must be the whole listing
        assert text == "" and out.decode().endswith("\n") and "gpt3-175b" in out.decode(), (out, text)
        return
    assert (p.returncode == 130 and text.strip() == "error: interrupted") or (
        p.returncode == -signal.SIGINT and text == ""
    ), (p.returncode, text)


def test_ctrl_c_in_the_middle_of_the_imports_is_one_line():
    """The same, deterministically: SIGINT as soon as pydantic's compiled core is mapped (by
    planner/cli/main.py's imports, after the hook)."""
    p = subprocess.Popen([*PLAN, "presets"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    maps = Path(f"/proc/{p.pid}/maps")
    deadline = time.monotonic() + 30
    while "_pydantic_core" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.002)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.decode().strip() == "error: interrupted", (p.returncode, err.decode())


@pytest.mark.slow
def test_a_plan_refuses_a_new_model_naming_the_option_given(tmp_path):
    plan = tmp_path / "e.json"
    assert (
        _run(
            [
                "estimate",
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "8",
                "--global-batch",
                "16",
                "-o",
                str(plan),
            ],
            stdout=subprocess.DEVNULL,
        ).returncode
        == 0
    )
    r = _run(["estimate", "--plan", str(plan), "--model", "llama3-8b"], stdout=subprocess.DEVNULL)
    assert r.returncode == 2 and "--model cannot change it" in _one_line(
        r.stderr
    )  # not "--model-name", which is no option


@pytest.mark.slow
def test_dash_as_the_output_is_refused_not_a_file_named_dash(tmp_path):
    r = _run(
        [
            "estimate",
            "--model",
            "gpt2-124m",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "-o",
            "-",
        ],
        stdout=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "-o -" in _one_line(r.stderr)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_read_only_output_file_is_refused_not_replaced(tmp_path):
    import shutil

    prefix = []
    if os.geteuid() == 0:  # root writes anything: drop the capabilities that override file modes
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        prefix = [
            "setpriv",
            "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search",
        ]
    out = tmp_path / "e.json"
    out.write_text("{}\n")
    out.chmod(0o444)
    r = subprocess.run(
        [
            *prefix,
            *PLAN,
            "estimate",
            "--model",
            "gpt2-124m",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert r.returncode == 2 and "read-only" in _one_line(r.stderr)
    assert out.read_text() == "{}\n"


def test_a_ctrl_c_inside_pydantics_core_is_the_interrupt_line():
    """A Ctrl-C that lands while pydantic-core builds a model's validators comes out as a
    SchemaError naming the KeyboardInterrupt (seen once in 5 delays of the test above): it is
    the interrupt's line and exit code too; any other SchemaError keeps its traceback."""
    code = (
        "import planner._interrupt as I; I.hold(); from pydantic_core import SchemaError; "
        "raise SchemaError('Error building \"enum\" validator:\\n  KeyboardInterrupt: ' if {} else 'a bug')"
    )
    hit = subprocess.run([sys.executable, "-c", code.format(True)], capture_output=True, text=True, timeout=60)
    assert hit.returncode == 130 and hit.stderr.strip() == "error: interrupted", hit.stderr
    other = subprocess.run([sys.executable, "-c", code.format(False)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "SchemaError: a bug" in other.stderr
