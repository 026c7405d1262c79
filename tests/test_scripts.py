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
