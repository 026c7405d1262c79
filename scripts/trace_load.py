"""How far a reader travels from `load_session` to the loaded models: the files crossed and
the returns to a file already left, as reading the code would count them.

Each scenario's profile (tiny models built here, in a fresh cache) is loaded twice, cold then
warm, under `sys.setprofile`. Every specgen function is read once, at its first call: the
calls form a tree of first calls, and reading it depth first gives a sequence of files (into
a callee's file, and back to the caller's when it returns). "files" counts the distinct files
of that sequence; "returns" counts each step into a file the reader had already left, and
"calls into a file read before" those of them that are calls (not returns to the caller). The
engine's construction (core/, decoding/) is left out: it follows the loaded models; so are
imports (a module's top level).

    HF_HUB_OFFLINE=1 PYTHONPATH=src python scripts/trace_load.py [--sequence]

With --sequence, each scenario's sequence of files and its calls into a file read before.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src" / "specgen") + os.sep
SKIPPED_DIRS = tuple(SRC + d + os.sep for d in ("core", "decoding"))
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


@dataclass
class Node:
    file: str
    function: str = ""
    children: list[Node] = field(default_factory=list)


class Reader:
    """The tree of first calls into specgen's files under the traced call: a function is one
    node, wherever it is called from again; a callee first met on a later call is read
    where it is met."""

    def __init__(self) -> None:
        self.root = Node("<load_session>")
        self.nodes: dict = {}
        self.stack: list[Node | None] = []  # per frame: its node, SKIPPED, or None (not specgen's)

    def __call__(self, frame, event, arg) -> None:
        if event == "call":
            self.stack.append(self._enter(frame.f_code))
        elif event == "return" and self.stack:
            self.stack.pop()

    def _enter(self, code) -> Node | None:
        parent = next((n for n in reversed(self.stack) if n is not None), self.root)
        if (parent is SKIPPED or code.co_filename.startswith(SKIPPED_DIRS)
                or code.co_name == "<module>"):  # an import is not the load's path
            return SKIPPED
        if not code.co_filename.startswith(SRC):
            return None
        node = self.nodes.get(code)
        if node is None:
            node = self.nodes[code] = Node(code.co_filename[len(SRC):], code.co_name)
            parent.children.append(node)
        return node

    def sequence(self, functions: bool = False) -> list[str]:
        """The files in reading order, each step into another file once (with `functions`,
        each step names the function entered: file:function, or the file returned to)."""
        out: list[tuple[str, str]] = []

        def walk(node: Node) -> None:
            for child in node.children:
                out.append((child.file, child.function))
                walk(child)
                out.append((node.file, ""))

        walk(self.root)
        steps = [(f, fn) for i, (f, fn) in enumerate(out) if i == 0 or out[i - 1][0] != f]
        return [f"{f}:{fn}" if functions and fn else f for f, fn in steps if f != self.root.file]


SKIPPED = Node("<skipped>")


def counts(sequence: list[str]) -> tuple[int, int]:
    returns, left = 0, set()
    for i, f in enumerate(sequence):
        if i and sequence[i - 1] != f:
            left.add(sequence[i - 1])
            returns += f in left
    return len(set(sequence)), returns


def reentries(reader: Reader) -> list[str]:
    """Calls into a file the reader had read and left (a return up the call stack to the
    caller's file, where reading goes on, is not one): where reading goes back, as
    "caller's file > callee's file:function"."""
    seen: set[str] = set()
    found = []

    def walk(node: Node) -> None:
        for child in node.children:
            if child.file != node.file:
                if child.file in seen:
                    found.append(f"{node.file} > {child.file}:{child.function}")
                seen.add(child.file)
            walk(child)

    walk(reader.root)
    return found


def scenarios(root: Path) -> dict[str, str]:
    """Profile texts: the default's shape (two GGUF files run as stored), the same files
    converted to float, and a local folder pair packed for a CPU scheme."""
    from support import tiny

    target, draft = tiny.write_tiny_pair(root / "pair")
    g_target = tiny.write_tiny_gguf(root / "t.gguf", hidden=64, ff=128, layers=3, seed=0, kind="Q8_0")
    g_draft = tiny.write_tiny_gguf(root / "d.gguf", hidden=64, ff=128, layers=1, seed=1, kind="Q8_0")
    gen = '[speculation]\nnum_speculative_tokens = 3\n'
    return {
        "gguf as stored (the default's route)":
            f'[target]\nmodel = "{g_target}"\nquantization = "gguf"\n'
            f'[draft]\nmodel = "{g_draft}"\nquantization = "gguf"\n{gen}',
        "gguf converted to float":
            f'[target]\nmodel = "{g_target}"\nquantization = "none"\ndtype = "float32"\n'
            f'[draft]\nmodel = "{g_draft}"\nquantization = "none"\ndtype = "float32"\n{gen}',
        "folders packed int8-dyn":
            f'[target]\nmodel = "{target}"\nquantization = "int8-dyn"\ndtype = "float32"\n'
            f'[draft]\nmodel = "{draft}"\nquantization = "int8-dyn"\ndtype = "float32"\n{gen}',
    }


def trace(text: str, folder: Path, show: bool) -> tuple[tuple[int, int], tuple[int, int], set[str], int]:
    """(files, returns) over all of specgen's files, and over loading/'s alone (the steps
    between two of its files, whatever ran in between); the files; the re-entries."""
    from specgen.cli.options import load_session
    from specgen.profiles import load_profile

    path = folder / "p.toml"
    path.write_text(text)
    os.environ["SPECGEN_CACHE_DIR"] = str(folder / "cache")
    reader = Reader()
    for _ in ("cold", "warm"):
        profile = load_profile(str(path))
        sys.setprofile(reader)
        try:
            load_session(profile)
        finally:
            sys.setprofile(None)
    sequence = reader.sequence()
    if show:
        print("  " + " > ".join(reader.sequence(functions=True)))
        print("  calls into a file read before: " + "; ".join(reentries(reader)))
    loading = [f for f in sequence if f.startswith("loading/")]
    loading = [f for i, f in enumerate(loading) if i == 0 or loading[i - 1] != f]
    return counts(sequence), counts(loading), set(sequence), len(reentries(reader))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence", action="store_true", help="print each scenario's file sequence")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["SPECGEN_SKIP_MEMORY_CHECK"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["SPECGEN_PROFILE_DIR"] = str(root / "profiles")
        total, union = [0, 0, 0, 0, 0], set()
        for i, (name, text) in enumerate(scenarios(root).items()):
            folder = root / f"s{i}"
            folder.mkdir()
            (files, returns), (lfiles, lreturns), crossed, again = trace(text, folder, args.sequence)
            total = [a + b for a, b in zip(total, (files, returns, lfiles, lreturns, again))]
            union |= crossed
            print(f"{name}: {files} files crossed, {returns} returns to a file left, {again} "
                  f"calls into a file read before (loading/ alone: {lfiles} files, {lreturns} returns)")
        print(f"all three: {total[0]} files crossed ({len(union)} distinct), {total[1]} returns to "
              f"a file left, {total[4]} calls into a file read before (loading/ alone: "
              f"{total[2]} files, {total[3]} returns)")

if __name__ == "__main__":
    main()
