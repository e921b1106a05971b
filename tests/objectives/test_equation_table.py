"""The equation table (README.md's "The objective" and ``objectives/__init__.py``) stays true: every
reference function it names exists, and every test file it points to is there, in both copies."""

import importlib
import re
from pathlib import Path

import pytest

from phf_megatron import objectives

REPO = Path(__file__).resolve().parents[2]
#: the paper's quantities of Section 3 each table must list
EQUATIONS = ("L_OPSD", "L_dir", "L_geo", "L_layer", "L_adj", "L_local", "L_flow", "L_PHF", "EMA")


def _readme_table() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("| paper (Section 3) |")
    return text[start: text.index("\n\n", start)]


TABLES = {"README.md": _readme_table(), "objectives/__init__.py": objectives.__doc__}


@pytest.mark.parametrize("where", list(TABLES))
def test_every_equation_has_a_row(where):
    missing = [eq for eq in EQUATIONS if not re.search(rf"(^|\W){re.escape(eq)}\b", TABLES[where], re.M)]
    assert not missing, f"{where}: no row for {missing}"


@pytest.mark.parametrize("where", list(TABLES))
def test_every_named_test_file_exists(where):
    files = set(re.findall(r"\b([a-z_]+/test_[a-z0-9_]+\.py)", TABLES[where]))
    assert files, where
    missing = sorted(f for f in files if not (REPO / "tests" / f).is_file())
    assert not missing, f"{where}: {missing}"


def test_every_reference_function_exists():
    names = re.findall(r"`((?:opsd|window|flow|ema|phf)\.[a-z_]+)`", TABLES["README.md"])
    names += re.findall(r"`(data\.batch\.[a-z_]+)`", TABLES["README.md"])
    assert len(names) >= 15, names
    for name in names:
        module, _, attr = name.rpartition(".")
        package = "phf_megatron" if module.startswith("data") else "phf_megatron.objectives"
        assert hasattr(importlib.import_module(f"{package}.{module}"), attr), name
