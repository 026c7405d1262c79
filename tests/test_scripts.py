"""Scripts the docs tell users to run must not shadow an installed package.

`python bench/gpu.py` puts bench/ first on sys.path, so a module there named like a package
(or a standard-library module) is imported in its place by every library that imports that
name: a `bench/kernels.py` once broke transformers, which imports the `kernels` package."""

from __future__ import annotations

import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").rglob("*.md"))]
RUN = re.compile(r"python3?(?: -\w)* ([\w./-]+)/[\w-]+\.py")


def script_folders() -> set[Path]:
    """Every folder whose scripts the docs run as `python FOLDER/x.py`, and bench/ always."""
    named = {m for doc in DOCS if doc.exists() for m in RUN.findall(doc.read_text("utf-8"))}
    return {REPO / "bench"} | {REPO / name for name in named if (REPO / name).is_dir()}


def taken_names() -> dict[str, str]:
    """Top-level module names of the standard library and of every installed distribution."""
    taken = {name: "the standard library" for name in sys.stdlib_module_names}
    for name, dists in packages_distributions().items():
        taken[name] = f"the installed package {dists[0]}"
    return taken


def test_the_docs_run_scripts_from_bench():
    assert REPO / "bench" in script_folders()
    assert len(list((REPO / "bench").glob("*.py"))) > 3


def test_no_script_folder_shadows_an_installed_module():
    taken = taken_names()
    assert "kernels" in taken or "transformers" in taken  # the check sees the environment
    clashes = [f"{path.relative_to(REPO)} hides {taken[path.stem]}"
               for folder in sorted(script_folders()) for path in sorted(folder.glob("*.py"))
               if path.stem in taken]
    assert not clashes, "rename these scripts: " + "; ".join(clashes)


def load_script(name: str):
    """bench/NAME.py as a module (bench/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_kernel_costs_pieces_table_takes_one_width_or_several():
    table = load_script("kernel_costs").pieces_table
    times = {"Q4_K 8x8": [2.0, 1.5], "everything else": [0.5, 0.6], "the pass": [2.5, 2.1]}
    header, rows = table({1: times}, {1: times}, [1])  # a single width once divided by zero
    assert header == ["piece", "M=1"]
    assert rows == [["Q4_K 8x8", "1.5 / 1.5"], ["everything else", "0.5 / 0.5"],
                    ["the pass", "2.1 / 2.1"]]
    wider = {n: [2 * t for t in ts] for n, ts in times.items()}
    header, rows = table({1: times, 5: wider}, {1: times, 5: wider}, [1, 5])
    assert header[-2:] == ["M=5 - M=1", "share of the extra CPU time"]
    assert rows[0] == ["Q4_K 8x8", "1.5 / 1.5", "3.0 / 3.0", "+1.5 / +1.5", "71%"]
