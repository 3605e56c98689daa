"""The module graph: `variants` (kernels, the lower layer) never imports `tuner`, no two project
modules import each other in a cycle (function-level imports included: a lazy import hides a
cycle, it does not remove it), and each kernel's launch signature is the ABI declared once in
variants/common/abi.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "variants")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules `path` imports anywhere in it (a `from pkg import mod` counts as mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            # The longest project module the target names (a.b.c -> a.b if c is a symbol).
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _is_package_parent(a: str, b: str) -> bool:
    """`a` is a package whose own code (its __init__) imports its submodule `b` or vice versa:
    Python resolves that order itself, so it is no cycle between modules."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_variants_never_import_tuner():
    offenders = {m: sorted(i for i in deps if i.split(".")[0] == "tuner")
                 for m, deps in _graph().items() if m.split(".")[0] == "variants"}
    assert not {m: d for m, d in offenders.items() if d}


def test_no_import_cycles():
    graph = {m: {d for d in deps if not _is_package_parent(m, d)} for m, deps in _graph().items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_test_sees_a_cycle(tmp_path, monkeypatch):
    # The check itself must be able to fail: two modules that import each other lazily.
    pkg = tmp_path / "tuner"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from tuner import b\n")
    (pkg / "b.py").write_text("import tuner.a\n")
    known = {"tuner.a", "tuner.b"}
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert _imports(pkg / "a.py", "tuner.a", known) == {"tuner.b"}
    assert _imports(pkg / "b.py", "tuner.b", known) == {"tuner.a"}


@pytest.mark.parametrize("kernel", ["variants.wgmma.kernel:WgmmaAttention",
                                    "variants.mma_sync.kernel:MmaSyncAttention"])
def test_kernels_take_the_declared_launch_abi(kernel):
    import importlib

    from variants.common.abi import ABI_NAMES

    module, cls = kernel.split(":")
    call = getattr(importlib.import_module(module), cls).__call__
    call = getattr(call, "__wrapped__", call)
    params = [p for p in inspect.signature(call).parameters if p != "self"]
    assert tuple(params[: len(ABI_NAMES)]) == ABI_NAMES and params[-1] == "stream"
