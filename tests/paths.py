"""Where a test finds the repository and the test data, from whichever folder under tests/ it
sits in (a test file's own `Path(__file__)` would depend on its depth)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
DATA = ROOT / "tests" / "data"
HF_CONFIGS = DATA / "hf_configs"  # published Hugging Face configs (SOURCES.md)
