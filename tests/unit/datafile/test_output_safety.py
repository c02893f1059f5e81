"""`-o`: refused up front when it cannot be honoured, written through symlinks with the
umask's permissions, and never half-written or left behind on failure."""

import os
import stat

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.datafile import check_output, write_atomic
from planner.errors import PlannerError, UsageError

SOLVE = [
    "solve",
    "--model",
    "gpt2-124m",
    "--cluster",
    "dgx-a100-80gb",
    "--gpus",
    "2",
    "--global-batch",
    "8",
    "--seq-len",
    "256",
]


def _run(args):
    return CliRunner().invoke(cli, args)


def test_output_is_written_through_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_new_output_honours_the_umask_and_existing_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "a.json"
        write_atomic(out, "x")
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        out.chmod(0o640)
        write_atomic(out, "y")
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(old)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: str(d), "is a directory"),
        (lambda d: str(d / "missing" / "p.json"), "does not exist"),
        (lambda d: str(d / ("x" * 250 + ".json")), "too long"),
        (lambda d: "", "needs a file name"),
    ],
)
def test_unusable_outputs_are_refused_before_any_work(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        check_output(make(tmp_path))


def test_a_device_is_not_replaced(tmp_path):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    with pytest.raises(UsageError, match="not a regular file"):
        check_output("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_input_is_never_the_output(tmp_path):
    spec = tmp_path / "m.json"
    r = _run(
        [
            "solve",
            "--model",
            "gpt2-124m",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "2",
            "--global-batch",
            "8",
            "--seq-len",
            "256",
            "-o",
            str(spec),
        ]
    )
    assert r.exit_code == 0, r.output
    before = spec.read_bytes()
    r = _run(["estimate", "--plan", str(spec), "--json"])
    assert r.exit_code == 0
    r = _run(["run", str(spec), "-o", str(spec)])
    assert r.exit_code == 2 and "is the input" in r.output and "Traceback" not in r.output
    assert spec.read_bytes() == before


def test_read_only_directory_fails_in_one_line_and_leaves_nothing(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        r = _run(SOLVE + ["-o", str(d / "p.json")])
        assert r.exit_code == 2 and "not writable" in r.output
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o700)


def test_os_error_during_the_write_is_one_line_and_the_old_file_stays(tmp_path, monkeypatch):
    out = tmp_path / "p.json"
    out.write_text("old")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(PlannerError, match="No space left on device"):
        write_atomic(out, "new")
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
