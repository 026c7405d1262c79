"""What the bench tools share: timing (interleaved, minimum and median), weights streamed
from memory rather than the caches, a kernel built from another git revision, and the demo
target loaded as a profile loads it (from specgen's caches)."""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


from specgen.kernels import build

L3_BYTES = 96_000_000  # more than any L3 of the machines we run on: copies past it stream


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(minimum, median) milliseconds of `reps` calls after two warm-up calls. On a shared
    machine a call that loses a thread waits a whole time slice: the minimum estimates the
    work itself, the median shows the noise."""
    fn(), fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return min(times), statistics.median(times)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int
                ) -> dict[str, tuple[float, float]]:
    """(minimum, median) ms of one call of each variant per round, after a warm-up call each;
    the order alternates round by round so that machine drift hits every variant alike."""
    for call in variants.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[:: 1 if r % 2 else -1]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def rotating(make: Callable[[], object], nbytes: int) -> Callable[[], object]:
    """Enough copies of a layer's weights to exceed the L3 cache; each call takes the next,
    so the weights come from memory as they do in decoding."""
    copies = [make() for _ in range(max(1, -(-L3_BYTES // max(nbytes, 1))))]
    state = {"i": 0}

    def next_copy():
        state["i"] = (state["i"] + 1) % len(copies)
        return copies[state["i"]]
    return next_copy


def library_at(rev: str, stem: str, folder: Path) -> ctypes.CDLL:
    """Kernel `stem` (int4, linear or rows) as its source stood at git revision `rev`,
    compiled with today's flags. Older revisions kept the kernels flat in src/specgen/ as
    cpu_<stem>.c; the caller declares the argument types (kernels.<stem>.declare)."""
    def show(*candidates: str) -> bytes:
        for path in candidates:
            done = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True)
            if done.returncode == 0:
                return done.stdout
        raise SystemExit(f"{rev} has none of {', '.join(candidates)}")

    source = folder / f"{stem}.c"
    source.write_bytes(show(f"src/specgen/kernels/{stem}.c", f"src/specgen/cpu_{stem}.c"))
    (folder / "amx_tiles.h").write_bytes(show("src/specgen/kernels/amx_tiles.h",
                                              "src/specgen/amx_tiles.h"))
    out = folder / f"{stem}-{rev.replace('/', '_')}.so"
    build.compile_file(source, out, f"{stem}.c at {rev}")
    return ctypes.CDLL(str(out))


def demo_target(quantization: str = "none", dtype: str = "auto", profile: str = "qwen-coder-demo"):
    """The profile's target alone, loaded and prepared as `specgen run` loads it (its
    converted and quantized copies come from specgen's cache)."""
    from specgen.loading.load import load_pair
    from specgen.profiles import load_profile, with_overrides

    prof = with_overrides(load_profile(profile), method="prompt-lookup",
                          target_quantization=quantization, target_dtype=dtype)
    return load_pair(prof).target


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
