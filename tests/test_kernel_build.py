"""The C kernels are compiled once into the cache, keyed by what goes into them."""

from __future__ import annotations

import shutil

import pytest

from specgen.kernels import build


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler here")
def test_a_changed_header_builds_a_new_library(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "shared.h").write_text("#define ANSWER 41\n")
    (src / "kernel.c").write_text('#include "shared.h"\nint answer(void) { return ANSWER; }\n')
    assert build.build(src / "kernel.c", "a test kernel", "nothing").answer() == 41
    (src / "shared.h").write_text("#define ANSWER 42\n")
    assert build.build(src / "kernel.c", "a test kernel", "nothing").answer() == 42
    assert len(list((tmp_path / "cache" / "kernels").glob("kernel-*.so"))) == 2
