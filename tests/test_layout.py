"""The package's shape: one job per folder, imports pointing down, no cycles. Read from the
source (every import statement, also those inside functions), so a late import cannot hide
a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import specgen

ROOT = Path(specgen.__file__).parent

# Each folder (or top-level module) and the layer it sits on: a module may import its own
# folder and anything on a lower layer, never a higher or a sibling one.
LAYERS = {
    "errors": 0, "choices": 0, "paths": 0,
    "profiles": 1,
    "kernels": 2, "models": 2,
    "decoding": 3,
    "heads": 3.5,  # on decoding; under core (the head drafters) and loading (a profile's head)
    "core": 4, "loading": 4,
    "app": 5,
    "bench": 6, "serve": 6, "tune": 6,  # libraries: measuring, serving HTTP, the skip-set search
    "commands": 7,  # each verb's flow
    "cli": 8,  # parsing: each verb's options, then its flow
    "__init__": 9, "__main__": 9,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """specgen modules `path` imports (a `from specgen.x import y` names x.y when y is a
    module, else x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specgen")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specgen"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


FILES = {module_name(p): p for p in ROOT.rglob("*.py")}
MODULES = set(FILES)
GRAPH = {name: imports(path) & MODULES - {name} for name, path in FILES.items()}


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_folder_has_a_layer():
    assert {top(m) for m in MODULES} <= set(LAYERS)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (a path that comes back to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports that point to a higher layer or a sibling folder of the same layer."""
    wrong = []
    for module, targets in graph.items():
        here = top(module)
        for target in targets:
            there = top(target)
            if target != "specgen" and there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{module} -> {target}")  # (specgen itself: the lazy public API)
    return sorted(wrong)


def test_no_import_cycles():
    assert find_cycle(GRAPH) is None, "import cycle: " + " -> ".join(find_cycle(GRAPH))


def test_imports_point_down():
    assert not upward(GRAPH), "imports that point up or sideways: " + ", ".join(upward(GRAPH))


def test_each_command_has_one_parser_and_one_flow():
    """cli/ parses, commands/ runs: each command module of cli/ has its flow under the same
    name in commands/, commands/ holds nothing else, and no other folder keeps a flow."""
    helpers = {"__init__", "options", "signals", "triton_gate"}  # cli/'s own machinery
    verbs = {p.stem for p in (ROOT / "cli").glob("*.py")} - helpers
    flows = {p.stem for p in (ROOT / "commands").glob("*.py")} - {"__init__"}
    assert verbs == flows and "run" in verbs
    assert not [m for m in MODULES if m.rsplit(".", 1)[-1] == "command"]


def test_the_checks_can_fail(tmp_path):
    """A cycle and an upward import, made up, are found; imports inside functions count."""
    (tmp_path / "a.py").write_text("def f():\n    from specgen.core import engine\n")
    assert "specgen.core.engine" in imports(tmp_path / "a.py")
    graph = {"specgen.core.engine": {"specgen.loading.load"},
             "specgen.loading.load": {"specgen.kernels", "specgen.core.engine"},
             "specgen.kernels": set()}
    assert find_cycle(graph) == ["specgen.core.engine", "specgen.loading.load", "specgen.core.engine"]
    assert upward(graph) == ["specgen.core.engine -> specgen.loading.load",
                             "specgen.loading.load -> specgen.core.engine"]


# --- the tests' own helpers -----------------------------------------------------------------

TESTS = Path(__file__).parent


def local_modules(folder: Path) -> set[str]:
    """The modules and packages directly in `folder`: what its files can import by bare name."""
    return {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}


def local_imports(path: Path, local: set[str]) -> list[str]:
    """`path`'s imports of `local` modules, or relative ones, also inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else ["."]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n == "." or n.split(".")[0] in local]
    return found


def test_tests_reach_their_helpers_through_fixtures():
    """A test module imports neither the helpers (tests/support: conftest.py hands them out as
    fixtures) nor conftest nor another test module."""
    local = local_modules(TESTS)
    assert {"support", "conftest"} <= local
    wrong = [hit for path in sorted(TESTS.glob("test_*.py")) for hit in local_imports(path, local)]
    assert not wrong, "helpers imported directly (take conftest's fixture instead): " + ", ".join(wrong)


def test_the_helper_check_can_fail(tmp_path):
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "__init__.py").write_text("")
    (tmp_path / "test_b.py").write_text("")
    (tmp_path / "test_a.py").write_text(
        "import torch\nimport test_b\n\ndef test_x():\n    from support.tiny import tiny_model\n")
    assert local_modules(tmp_path) == {"support", "test_a", "test_b"}
    assert local_imports(tmp_path / "test_a.py", local_modules(tmp_path)) == [
        "test_a.py:2 test_b", "test_a.py:5 support.tiny"]
