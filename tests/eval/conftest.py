"""Where the shared data lives (the repo's sibling ``shared/data``), for tests that read it."""

import importlib.util
import os

import pytest

# The eval package grades with math-verify; on a machine without it (e.g. a bare GPU image running
# `pytest -m gpu tests`) these CPU-only tests are not collected instead of failing to import.
collect_ignore_glob = [] if importlib.util.find_spec("math_verify") else ["test_*.py"]

from tests.helpers import SHARED_DATA


def find_shared_data() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("PHF_SHARED_DATA"), SHARED_DATA,
                  os.path.join(here, "..", "..", "..", "shared", "data"), "/work/shared/data"]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "aime24.jsonl")):
            return os.path.abspath(c)
    return None


@pytest.fixture(scope="session")
def shared_data():
    path = find_shared_data()
    if path is None:
        pytest.skip("shared/data not found (set PHF_SHARED_DATA)")
    return path
