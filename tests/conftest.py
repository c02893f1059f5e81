import pytest

from hardware_profiles import load_cluster
from planner.presets import load_model


@pytest.fixture(scope="session")
def gpt3_175b():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def a100_80():
    return load_cluster("dgx-a100-80gb")
