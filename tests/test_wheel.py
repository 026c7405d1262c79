"""specgen installed as users install it: from a wheel (built from the checkout, and from the
sdist, the route `pip install` takes from a source archive), with the editable install out of
the way. An editable install serves src/ through its own finder, so without these tests a
module left out of the package list goes unseen until a user installs it.

Nothing is downloaded: the wheels are built with the test venv's setuptools (no build
isolation) and run by the venv's interpreter without its site hooks (`-S`, so the editable
install's finder never loads), its path the installed wheel and then the venv's packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specgen"
SHIPPED = (".py", ".c", ".h", ".toml")  # sources, the C kernels, the bundled profiles

# Imports every specgen module of the installed copy; a missing third-party package (an optional
# extra) is reported, a missing specgen module fails.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import specgen
optional, broken = [], []
for m in pkgutil.walk_packages(specgen.__path__, "specgen."):
    if m.name.endswith(".__main__"):  # runs the command line: not a library module
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        (broken if (e.name or "").startswith("specgen") else optional).append([m.name, str(e)])
print(json.dumps({"file": specgen.__file__, "optional": optional, "broken": broken}))
"""

# The console script's entry point, as the wheel's entry_points.txt names it.
CLI = "import sys; sys.argv[0] = 'specgen'; from specgen.cli import main; main()"


def _tree(dest: Path) -> Path:
    """The checkout's files as a fresh clone has them (no venv, caches or build outputs)."""
    anywhere = shutil.ignore_patterns("__pycache__", "*.egg-info", ".venv*", ".git")
    at_root = {"build", "dist", ".pytest_cache", ".hypothesis", "bench", "docs", "tests"}

    def skip(folder: str, names: list[str]) -> set[str]:
        return set(anywhere(folder, names)) | (at_root & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "-w", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    return next(out.glob("specgen-*.whl"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """{"checkout": a wheel built from the tree, "sdist": one built from its sdist}."""
    work = tmp_path_factory.mktemp("wheels")
    tree = _tree(work / "tree")
    direct = _wheel(tree, work / "direct")
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; "
                    f"b.build_sdist({str(work / 'sdist')!r})"],
                   cwd=tree, check=True, capture_output=True, text=True)
    sdist = next((work / "sdist").glob("specgen-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    return {"checkout": direct, "sdist": _wheel(next((work / "unpacked").iterdir()), work / "from-sdist")}


@pytest.fixture(scope="module", params=["checkout", "sdist"])
def installed(request, wheels, tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into)."""
    wheel = wheels[request.param]
    target = tmp_path_factory.mktemp(f"installed-{request.param}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    return wheel, target


def _python(target: Path, *args: str, cwd: Path, env: dict | None = None,
            ) -> subprocess.CompletedProcess:
    """The venv's interpreter with the installed wheel and the venv's packages on its path,
    and neither src/ nor the editable install's finder."""
    paths = sysconfig.get_paths()
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPECGEN_"))}
    run_env.update(PYTHONPATH=os.pathsep.join([str(target), paths["purelib"], paths["platlib"]]),
                   HF_HUB_OFFLINE="1", SPECGEN_CACHE_DIR=str(cwd / "cache"),
                   SPECGEN_PROFILE_DIR=str(cwd / "profiles"),
                   SPECGEN_STATS_DB=str(cwd / "history.sqlite3"),
                   OMP_NUM_THREADS="1", COLUMNS="200", **(env or {}))
    run_env.pop("TRITON_INTERPRET", None)  # as a user's process on a CPU
    return subprocess.run([sys.executable, "-S", "-c", *args], cwd=cwd, env=run_env,
                          capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_every_module_profile_and_kernel_source(wheels):
    expected = {"specgen/" + p.relative_to(PACKAGE).as_posix()
                for p in PACKAGE.rglob("*") if p.suffix in SHIPPED and "__pycache__" not in p.parts}
    assert any(name.startswith("specgen/models/") for name in expected)  # the module once left out
    assert any(name.startswith("specgen/bundled_profiles/") for name in expected)
    for route, wheel in wheels.items():
        names = set(zipfile.ZipFile(wheel).namelist())
        missing = sorted(expected - names)
        assert not missing, f"the wheel built from the {route} lacks {missing}"
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "specgen = specgen.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_every_module_imports_from_the_installed_wheel_alone(installed, tmp_path):
    _, target = installed
    result = _python(target, IMPORT_ALL, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert Path(found["file"]).is_relative_to(target), found["file"]  # not src/
    assert not found["broken"], found["broken"]


def test_the_installed_commands_run(installed, tmp_path, tiny_profile):
    wheel, target = installed
    version = wheel.name.split("-")[1]
    said = _python(target, CLI, "--version", cwd=tmp_path)
    assert said.returncode == 0 and said.stdout.strip() == f"specgen {version}", said
    assert _python(target, CLI, "--help", cwd=tmp_path).returncode == 0
    checked = _python(target, CLI, "profiles", "check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok qwen-coder-demo (bundled)" in checked.stdout
    run = _python(target, CLI, "run", "-p", str(tiny_profile), "-n", "8", "--format", "json",
                  "hello", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout)
    assert answer["stats"]["new_tokens"] == 8 and answer["text"]
    # Nothing after the last line: Triton's bindings, imported by transformers where Triton
    # is installed, print about a thousand `nanobind: leaked` lines at exit unless kept out.
    assert "nanobind" not in run.stderr and "leaked" not in run.stderr, run.stderr[-2000:]


def test_a_cpu_bench_prints_nothing_after_its_last_line(wheels, tmp_path, tiny_profile):
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(target), str(wheels["checkout"])],
                   check=True, capture_output=True, text=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"category": "code-completion", "prompt": "def add(a, b):"}\n')
    bench = _python(target, CLI, "bench", "-p", str(tiny_profile), "--prompts", str(prompts),
                    "-n", "4", "--contestants", "baseline,adaptive", "--out",
                    str(tmp_path / "b.json"), cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert json.loads((tmp_path / "b.json").read_text())["measurements"]
    assert "nanobind" not in bench.stderr and "leaked" not in bench.stderr, bench.stderr[-2000:]
