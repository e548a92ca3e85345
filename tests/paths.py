"""Where things are, for every test whatever its folder: the repository, tests/, tests/data/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DATA = TESTS / "data"
