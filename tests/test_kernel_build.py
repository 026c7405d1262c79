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


@pytest.fixture
def avx2_only(monkeypatch):
    """SPECGEN_AVX2_ONLY set, the kernels' remembered best paths forgotten before and after."""
    from specgen.kernels import gguf, int4, int8, linear

    cached = (gguf.best_path, int4.best_path, int8.best_path, linear.bf16_path)

    def forget() -> None:
        for best in cached:
            best.cache_clear()

    if not build.has_avx2() or gguf.library() is None:
        pytest.skip("needs an x86 CPU with AVX2 and a C compiler")
    monkeypatch.setenv(build.AVX2_ONLY, "1")
    forget()
    yield
    monkeypatch.delenv(build.AVX2_ONLY)
    forget()


def test_avx2_only_puts_every_kernel_on_its_avx2_path(avx2_only):
    """What an AVX2-only CPU runs, shown on this one: every kernel's best path is AVX2, and a
    GGUF layer computes the AVX2 path's bits."""
    import numpy as np
    import torch

    from specgen.kernels import gguf, int4, int8, linear

    assert gguf.best_path() == gguf.AVX2 and gguf.paths() == (gguf.AVX2,)
    assert int4.best_path() == int4.AVX2 and int8.best_path() == int8.AVX2
    assert linear.bf16_path() == linear.AVX2
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (16, 34 * 8), dtype=np.uint8).reshape(16, 8, 34)
    raw[:, :, :2] = (rng.standard_normal((16, 8, 1)) * 0.01).astype(np.float16).view(np.uint8)
    w = gguf.wrap("Q8_0", raw.reshape(16, -1), 16, 256)
    x = torch.randn(5, 256)
    assert torch.equal(gguf.GGUFLinear(w)(x), gguf.linear(x, w, path=gguf.AVX2))


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler here")
def test_compiled_says_whether_a_load_would_compile(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "HERE", tmp_path)
    (tmp_path / "kernel.c").write_text("int answer(void) { return 7; }\n")
    assert not build.compiled("kernel")
    build.build(tmp_path / "kernel.c", "a test kernel", "nothing")
    assert build.compiled("kernel")  # in the cache, not yet loaded in this process
    (tmp_path / "kernel.c").write_text("int answer(void) { return 8; }\n")
    assert not build.compiled("kernel")  # another source: another library


def logging_compiler(tmp_path, refuse: str | None = None):
    """A C compiler that writes each call's arguments to a log, and fails (as a compiler
    without it would) where they hold `refuse`: its path, and the log's."""
    log = tmp_path / "calls.log"
    cc = tmp_path / "cc.sh"
    refusal = f'case "$*" in *{refuse}*) echo "unknown option {refuse}" >&2; exit 1;; esac\n' if refuse else ""
    gcc = shutil.which("gcc") or shutil.which("cc")
    cc.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{refusal}exec {gcc} "$@"\n')
    cc.chmod(0o755)
    return cc, log


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler here")
@pytest.mark.skipif(not shutil.which("make"), reason="no make here: kernels compile the plain way")
def test_a_kernel_compiles_in_parallel_jobs_and_plainly_where_the_compiler_refuses(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "kernel.c").write_text("int answer(void) { return 7; }\n")
    cc, log = logging_compiler(tmp_path)
    monkeypatch.setenv("CC", str(cc))
    assert build.build(tmp_path / "kernel.c", "a test kernel", "nothing").answer() == 7
    (call,) = log.read_text().splitlines()  # one call, with the parallel flags
    assert call.split()[:-3] == [*build.FLAGS, *build.PARALLEL]
    # A compiler without link-time optimisation: the plain flags, the same kernel.
    (tmp_path / "kernel.c").write_text("int answer(void) { return 8; }\n")
    log.unlink()
    cc, log = logging_compiler(tmp_path, refuse="-flto")
    assert build.build(tmp_path / "kernel.c", "a test kernel", "nothing").answer() == 8
    first, second = log.read_text().splitlines()
    assert build.PARALLEL[0] in first.split() and build.PARALLEL[0] not in second.split()


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler here")
def test_without_make_a_kernel_compiles_the_plain_way(monkeypatch, tmp_path):
    """gcc would run the parallel jobs one by one without make: slower than not splitting."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "kernel.c").write_text("int answer(void) { return 9; }\n")
    cc, log = logging_compiler(tmp_path)
    monkeypatch.setenv("CC", str(cc))
    which = shutil.which
    monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "make" else which(name))
    assert build.build(tmp_path / "kernel.c", "a test kernel", "nothing").answer() == 9
    (call,) = log.read_text().splitlines()
    assert call.split()[:-3] == list(build.FLAGS)
