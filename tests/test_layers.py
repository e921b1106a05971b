"""The package's layers, read from the source with ``ast``: no import runs up, no import circle.

The order, lowest first (a module imports only its own package and strictly lower layers):

 0. ``errors``, ``lazy_exports``, ``startup``   leaves: import nothing of ours
 1. ``config_errors``, ``input_files``, ``output_files``, ``cli``, ``tokenizer``   the command lines' and files' helpers
 2. ``runtime``      process group, Megatron session, CPU shims
 3. ``objectives``   the math: pure PyTorch, the reference for everything above
 4. ``kernels``      the fused CUDA kernels and the choice between them and the reference
 5. ``models``, ``lora``   Qwen3 on Megatron-Core (with ``qwen3_arch``, a leaf); tensor-parallel LoRA
 6. ``convert``      HF <-> Megatron: mappings, checkpoints, live models
 7. ``parallel``     PHF under TP/SP/PP: capture, stage flow, vocabulary-parallel JSD, the step
 8. ``rollout``, ``data``   rollout engines; data sets, prompts, batches
 9. ``eval``, ``toy``       Average@k evaluation; the embedded toy task
10. ``training``     the trainer
11. ``train``        the trainer's entry point
12. ``tools``        the other commands (converters, eval, plots); above it only the scripts in
                     ``tools/``, ``benchmarks/``, ``examples/``

Every import counts: module level, inside functions, under ``TYPE_CHECKING``, and the submodules a
package's ``lazy_exports`` table names. Besides the layering, the module graph has no cycle (nor
has ``benchmarks``'), and nothing in ``phf_megatron`` imports the command-line scripts (``tools``,
``benchmarks``, ``examples``).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "phf_megatron"
#: Packages whose module graph must have no cycle: ours, and the benchmarks' (``python -m benchmarks.x``).
ACYCLIC = ("phf_megatron", "benchmarks")
LAYERS = (
    ("errors", "lazy_exports", "startup"),
    ("config_errors", "input_files", "output_files", "cli", "tokenizer"),
    ("commands",),
    ("runtime",),
    ("objectives",),
    ("kernels",),
    ("models", "lora"),
    ("convert",),
    ("parallel",),
    ("rollout", "data"),
    ("eval", "toy"),
    ("training",),
    ("train",),
    ("tools",),
)
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}
#: Compiled modules, placed with the package that loads them.
EXTENSIONS = {"phf_megatron._flow_cuda": "kernels"}
SCRIPTS = ("tools", "benchmarks", "examples")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
    base = REPO / name.replace(".", os.sep)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or name in EXTENSIONS


def _resolve(name: str, package: str, level: int) -> str:
    if not level:
        return name
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of ``path`` (and of its ``lazy_exports`` table)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node.module or "", package, node.level)
            for alias in node.names:  # ``from package import submodule`` imports the submodule
                sub = f"{target}.{alias.name}"
                found.append((sub if _exists(sub) else target, node.lineno))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
              and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):
            for key in node.args[1].keys:
                name = key.value
                level = len(name) - len(name.lstrip("."))
                found.append((_resolve(name.lstrip("."), package, level or 1), node.lineno))
    return found


def _part(module: str) -> str | None:
    """The layer part of one of our modules (``phf_megatron.parallel.step`` -> ``parallel``)."""
    if module in EXTENSIONS:
        return EXTENSIONS[module]
    parts = module.split(".")
    if parts[0] != "phf_megatron" or len(parts) == 1:
        return None
    return parts[1]


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level ``package`` it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        graph[_module_name(path)] = {name for name, _ in imports_of(path) if name.split(".")[0] == package}
    return graph


def test_every_part_of_the_package_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert parts == set(LAYER), f"place these in LAYERS: {sorted(parts - set(LAYER))}; gone: {sorted(set(LAYER) - parts)}"


def test_no_import_runs_up_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _part(_module_name(path))
        for name, line in imports_of(path):
            target = _part(name)
            if target is None or target == source:
                continue
            if LAYER[target] >= LAYER[source]:
                upward.append(f"{path.relative_to(REPO)}:{line} ({source}, layer {LAYER[source]}) imports {name} "
                              f"({target}, layer {LAYER[target]})")
    assert not upward, "\n".join(upward)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in graph:
                continue
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_circle(package):
    graph = _graph(package)
    assert sum(map(len, graph.values())) > 10, f"{package}: the reader found (almost) no imports"
    assert not import_circles(graph), import_circles(graph)


def test_the_circle_finder_finds_circles():
    """Two modules importing each other (the one benchmarks/ had: scaling_model's command imported
    scaling_inputs, which imports scaling_model), a longer ring, a self-import; a chain is none."""
    assert import_circles({"b.x": {"b.y"}, "b.y": {"b.x"}}) == [["b.x", "b.y"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"a"}}) == [["a"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_package_imports_no_script():
    bad = [f"{path.relative_to(REPO)}:{line} imports {name}" for path in sorted(PACKAGE.rglob("*.py"))
           for name, line in imports_of(path) if name.split(".")[0] in SCRIPTS]  # top-level scripts, not phf_megatron.tools
    assert not bad, bad


def test_the_checker_sees_function_level_and_lazy_imports(tmp_path, monkeypatch):
    """The reader itself: an import inside a function and a ``lazy_exports`` entry both count."""
    pkg = tmp_path / "phf_megatron" / "objectives"
    pkg.mkdir(parents=True)
    (tmp_path / "phf_megatron" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text('lazy_exports(__name__, {"flow": ("f",), "..tokenizer": ("t",)})\n')
    (pkg / "flow.py").write_text("def f():\n    from ..kernels.dispatch import flow_backend\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert imports_of(pkg / "flow.py") == [("phf_megatron.kernels.dispatch", 2)]
    assert sorted(imports_of(pkg / "__init__.py")) == [("phf_megatron.objectives.flow", 1),
                                                       ("phf_megatron.tokenizer", 1)]
