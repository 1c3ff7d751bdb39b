"""Where the repository and the tests' data are, for tests in any sub-folder."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TEST_DATA = TESTS / "data"
