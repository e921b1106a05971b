"""The one-line "a dependency is not installed" error knows every dependency the project declares.

``errors.DEPENDENCIES`` maps an import name to what to ``pip install``; it is written by hand beside
``pyproject.toml``. These tests hold the two together: every declared distribution has an entry, and
each entry's import name belongs to that distribution wherever it is installed here."""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib

from phf_megatron.errors import DEPENDENCIES, missing_dependency
from tests.helpers import REPO

#: declared, but never a "pip install X" line: torch runs everything (nothing starts without it), TE is
#: optional by design (its absence picks the local spec), the test tools are not the product's
NOT_REPORTED = {"torch", "transformer-engine", "pytest", "hypothesis", "pytest-timeout", "pytest-xdist", "phf-megatron"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower()


def _project() -> dict:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _required() -> set[str]:
    return {_name(r) for r in _project()["dependencies"]} - NOT_REPORTED


def _declared() -> set[str]:
    extras = {_name(r) for extra in _project()["optional-dependencies"].values() for r in extra}
    return (_required() | extras) - NOT_REPORTED


def _installs() -> set[str]:
    return {name for value in DEPENDENCIES.values() for name in re.findall(r"[a-z0-9][a-z0-9_.-]*(?= |$|\))", value)
            if name not in {"or", "gpu", "cpu"}}


def test_every_declared_distribution_has_an_install_line():
    assert _declared() - _installs() == set()
    assert _installs() - _declared() == set()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_requirements(dist: str) -> set[str]:
    """``dist`` and what it requires, transitively (installed ones; extras and markers ignored)."""
    seen, todo = set(), [_norm(dist)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [_norm(_name(r)) for r in importlib.metadata.requires(name) or [] if "extra ==" not in r]
        except importlib.metadata.PackageNotFoundError:
            pass
    return seen


def test_each_import_name_comes_with_its_install_where_installed():
    """``pip install X`` brings the module: it is X's, or one of X's requirements' (math-verify brings
    latex2sympy2_extended and antlr4)."""
    owners = importlib.metadata.packages_distributions()
    for module, install in DEPENDENCIES.items():
        targets = [n for n in _installs() if re.search(rf"(^| ){re.escape(n)}( |$)", install)]
        if module not in owners:
            # not installed here: only an optional extra may be missing (a misspelled key of a required one fails)
            assert not set(targets) & _required(), (module, install)
            continue
        brought = set().union(*(_with_requirements(t) for t in targets))
        assert {_norm(d) for d in owners[module]} & brought, (module, install, owners[module])


def test_the_error_names_the_module_and_the_pip_line():
    err = ModuleNotFoundError("No module named 'latex2sympy2_extended.x'", name="latex2sympy2_extended.x")
    assert str(missing_dependency(err)) == ("a dependency is not installed: no module named 'latex2sympy2_extended.x' "
                                            "(pip install math-verify; the README's install command installs them all)")
    assert missing_dependency(ModuleNotFoundError("No module named 'mything'", name="mything")) is None
    assert missing_dependency(ImportError("cannot import name 'x'")) is None
