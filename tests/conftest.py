import pytest

from hardware_profiles import load_cluster
from planner.presets import load_model


@pytest.fixture(scope="session")
def gpt3_175b():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def a100_80():
    return load_cluster("dgx-a100-80gb")


@pytest.fixture(scope="session", autouse=True)
def _own_temporary_directory(tmp_path_factory):
    """Everything the tests and the commands they start write to a temporary directory goes
    under pytest's own (kept for the last 3 sessions, then removed): a launch that fails on
    purpose keeps its logs (`plan run` names them in its error), and they must not pile up in
    /tmp."""
    import os
    import tempfile

    path = str(tmp_path_factory.mktemp("tmp"))
    old_env, old_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    yield path
    tempfile.tempdir = old_dir
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env


def pytest_configure(config):
    """A test run started in the background by a non-interactive shell (`cmd &`) inherits SIGINT
    ignored, and so would every `plan` the tests start: the Ctrl-C tests would test the shell,
    not the command. Python's own handler is put back (children then start with the default)."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
