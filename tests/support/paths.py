"""Where things are: the repository, and the tests' own folder (their node packages)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
