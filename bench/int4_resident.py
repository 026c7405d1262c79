"""Is specgen's int4-dyn kernel bound by memory or by its own work? One layer's call with its
weights held in cache (one copy, called over and over) against the same layer streamed from
memory (copies rotated, together larger than the L3 cache), interleaved in one process.

    python bench/int4_resident.py [--rounds 200]

A kernel bound by memory runs much faster on cached weights; one bound by its own arithmetic
takes about as long either way. Prints ms per call, minimum (median), on the path a verify pass
takes (cpu_int4.path_for), and the rate the streamed call reads its bytes at. bench/NOTES.md,
Round 17.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specgen import cpu_int4

LAYERS = ((1536, 1536), (8960, 1536), (1536, 8960))  # q_proj (fits L2), gate_proj, down_proj
STREAMED_BYTES = 400e6


def layer_and_copies(o: int, k: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """A random [o, k] layer in int4-dyn, and enough copies of it to stream STREAMED_BYTES."""
    torch.manual_seed(0)
    packed, scales = cpu_int4.quantize(torch.randn(o, k))
    size = packed.nbytes + scales.nbytes
    return packed, scales, [(packed.clone(), scales.clone())
                            for _ in range(int(STREAMED_BYTES // size) + 1)]


def timed(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> float:
    start = time.perf_counter()
    cpu_int4.linear(x, packed, scales, None)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"path {cpu_int4.path_for(1)} (0 AVX2, 1 AVX512-VNNI), 2 threads, {args.rounds} rounds")
    for o, k in LAYERS:
        packed, scales, copies = layer_and_copies(o, k)
        size = packed.nbytes + scales.nbytes
        for m in (1, 5):
            x = torch.randn(m, k)
            cached, streamed = [], []
            for r in range(args.rounds):  # alternate which goes first
                pair = [(cached, (packed, scales)), (streamed, copies[r % len(copies)])]
                for times, (p, s) in pair if r % 2 else pair[::-1]:
                    times.append(timed(x, p, s))
            rate = size / 1e6 / statistics.median(streamed)
            print(f"{o}x{k} ({size / 1e6:.1f} MB), {m} token(s): cached {min(cached):.3f} "
                  f"({statistics.median(cached):.3f}) ms, streamed {min(streamed):.3f} "
                  f"({statistics.median(streamed):.3f}) ms, streamed at {rate:.1f} GB/s")


if __name__ == "__main__":
    main()
