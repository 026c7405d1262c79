"""specgen's int4 kernel (cpu_int4.c) against its source at another git revision, side by side
in one process: one layer's call with its weights cached and streamed from memory, and the
int4-dyn target's lean forward over 1 and 5 new tokens after 64 of context.

    SPECGEN_CACHE_DIR=... python bench/int4_ab.py --model <fp32 model folder> [--rev HEAD~1]

The other revision's kernel is compiled from `git show REV:src/specgen/` (the C file and its
header) with cbuild's flags and called with this revision's arguments and scratch buffers, so
REV must share this `int4_linear` signature and need no more scratch (true of c3de0b5's parent).
Both run the path a verify pass takes (cpu_int4.path_for). Prints medians of interleaved calls
and new over old. bench/NOTES.md, Round 18.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from int4_paths import int4_target  # bench/, beside this script
from int4_resident import LAYERS, layer_and_copies

from specgen import cbuild, cpu_int4, decoder

HEAD_LAYER = (151936, 1536)  # the demo target's lm_head: always streamed


def old_library(rev: str, folder: Path, stem: str = "cpu_int4") -> ctypes.CDLL:
    """src/specgen/{stem}.c (with the header) at `rev`, compiled with cbuild's flags; the
    caller sets the argument types."""
    for name in (f"{stem}.c", "amx_tiles.h"):
        text = subprocess.run(["git", "show", f"{rev}:src/specgen/{name}"], check=True,
                              capture_output=True).stdout
        (folder / name).write_bytes(text)
    so = folder / f"old-{stem}.so"
    subprocess.run([cbuild.compiler("the old kernel", "-"), *cbuild.FLAGS, str(folder / f"{stem}.c"),
                    "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


def layers(libs: dict[str, ctypes.CDLL], rounds: int) -> None:
    for o, k in (*LAYERS, HEAD_LAYER):
        packed, scales, copies = layer_and_copies(o, k)
        for m in (1, 5):
            x = torch.randn(m, k)
            times = {(name, how): [] for name in libs for how in ("cached", "streamed")}
            for r in range(rounds if o < HEAD_LAYER[0] else max(rounds // 5, 3)):
                for name in list(libs)[:: 1 if r % 2 else -1]:  # alternate which goes first
                    cpu_int4._lib = libs[name]
                    for how, (p, s) in (("cached", (packed, scales)), ("streamed", copies[r % len(copies)])):
                        start = time.perf_counter()
                        cpu_int4.linear(x, p, s, None)
                        times[(name, how)].append(1e3 * (time.perf_counter() - start))
            line = []
            for how in ("cached", "streamed"):
                old, new = (statistics.median(times[(n, how)]) for n in ("old", "new"))
                line.append(f"{how} {old:.3f} -> {new:.3f} ms ({new / old:.2f})")
            print(f"{o}x{k}, {m} token(s): {'; '.join(line)}", flush=True)


def model_passes(libs: dict[str, ctypes.CDLL], model, rounds: int) -> None:
    ids = torch.randint(0, model.config.vocab_size, (64,))
    passes = {(name, m): [] for name in libs for m in (1, 5)}
    with torch.inference_mode():
        for r in range(rounds):
            for name in list(libs)[:: 1 if r % 2 else -1]:
                cpu_int4._lib = libs[name]
                lean = decoder.make_decoder(model, exact=True)
                lean.logits(ids, 1)
                for m in (1, 5):
                    new = torch.randint(0, model.config.vocab_size, (m,))
                    times = []
                    for _ in range(12):
                        start = time.perf_counter()
                        lean.logits(new, m)
                        times.append(1e3 * (time.perf_counter() - start))
                        lean.crop(64)
                    passes[(name, m)].append(statistics.median(times))
    for m in (1, 5):
        old, new = (statistics.median(passes[(n, m)]) for n in ("old", "new"))
        print(f"target, {m} new token(s): {old:.1f} -> {new:.1f} ms ({new / old:.2f})")
    for name in libs:
        ratio = statistics.median(passes[(name, 5)]) / statistics.median(passes[(name, 1)])
        print(f"{name}: a 5-token pass costs {ratio:.2f} one-token passes")


def main() -> None:
    args, model = int4_target(__doc__, 6, ("--rev", {"default": "HEAD~1"}),
                              ("--layer-rounds", {"type": int, "default": 100}))
    with tempfile.TemporaryDirectory() as folder:
        libs = {"old": old_library(args.rev, Path(folder)), "new": cpu_int4.library()}
        libs["old"].int4_linear.argtypes = libs["new"].int4_linear.argtypes
        print(f"{args.rev} (old) against the working tree (new), path {cpu_int4.path_for(1)} "
              f"(0 AVX2, 1 AVX512-VNNI), {args.threads} threads; medians")
        layers(libs, args.layer_rounds)
        model_passes(libs, model, args.rounds)
        cpu_int4._lib = libs["new"]


if __name__ == "__main__":
    main()
