"""Where the suite's files are, from this file rather than the working directory (the suite runs
from anywhere; tests/project/test_suite_paths.py holds every test to it)."""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
TOOLS = os.path.join(ROOT, "tools")
