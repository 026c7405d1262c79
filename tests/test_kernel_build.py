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
