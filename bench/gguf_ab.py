"""A/B of gguf.c sources: all of a GGUF model's linears (as bench/gguf_linears.py) through each
source's own build of gguf_linear, called directly by ctypes on one thread, rounds
interleaved (every source and width once a round); prints CPU-time (process_time) medians.

    python bench/gguf_ab.py MODEL.gguf PATH ROUNDS old.c new.c [...]

PATH: 0 AVX2, 1 VNNI. Sources are compiled into specgen's kernel cache like gguf.c itself
(e.g. `git show HEAD~1:src/specgen/kernels/gguf.c > /tmp/old.c`).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from gguf_linears import weights

from specgen.kernels import build, gguf


def main() -> None:
    model, path, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    srcs = sys.argv[4:]
    libs = []
    for s in srcs:
        lib = build.build(Path(s), "gguf.c under test", "none")
        gguf.declare(lib)
        libs.append(lib)
    ws = weights(model)
    torch.manual_seed(0)
    ms = [1, 2, 5, 9]
    xs = {w.k: torch.randn(max(ms), w.k) for w in ws}
    ys = {w.n: torch.empty(max(ms), w.n) for w in ws}
    calls = [(gguf._IDS[w.kind], xs[w.k].data_ptr(), w.data.data_ptr(), w.data.shape[1],
              ys[w.n].data_ptr(), w.k, w.n) for w in ws]

    def run(lib, m: int) -> None:
        for fmt, x, wp, rb, y, k, n in calls:
            lib.gguf_linear(fmt, x, wp, rb, None, y, m, k, n, path, 1)

    for lib in libs:
        run(lib, 1)  # every page touched once
    res: dict = {(i, m): [] for i in range(len(libs)) for m in ms}
    for _ in range(rounds):
        for m in ms:
            for i, lib in enumerate(libs):
                c0 = time.process_time()
                run(lib, m)
                res[i, m].append(time.process_time() - c0)
    for i, s in enumerate(srcs):
        med = {m: statistics.median(res[i, m]) for m in ms}
        print(s, " ".join(f"M={m} {1e3 * med[m]:6.1f}" for m in ms), f"ms; M5/M1 {med[5] / med[1]:.3f}")


if __name__ == "__main__":
    main()
