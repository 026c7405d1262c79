"""What a draft pass costs by width, row by row against the kernel's tiles (int4-dyn).

    python bench/draft_tiles.py --profile qwen-coder-demo-int8-int4 --context 300

The profile's draft model (int4-dyn) reads `--context` random tokens, then passes over 1 to
48 more, each width five times on each path (the cache cropped back between), the paths
alternated; prints the medians in ms. Where the tiles cost less is where a draft's passes
take them (kernels.int4.DRAFT_TILE_ROWS).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specgen.decoding import make_decoder
from specgen.kernels import int4
from specgen.loading.load import load_pair
from specgen.profiles import load_profile

WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    draft = load_pair(load_profile(args.profile)).draft
    if not any(getattr(m, "kind", None) == "int4-dyn" for m in draft.modules()):
        raise SystemExit(f"{args.profile}'s draft is not int4-dyn")
    decoder = make_decoder(draft)
    ids = torch.randint(100, 20000, (args.context + max(WIDTHS),),
                        generator=torch.Generator().manual_seed(0))
    decoder.logits(ids[:args.context], 1)
    rows = int4.VNNI if int4.best_path() >= int4.VNNI else int4.AVX2
    tiles = int4.path_for(10_000)
    chosen = int4.path_for

    def seconds(width: int, path: int) -> float:
        int4.path_for = lambda m, exact=True: path if m > 1 else chosen(m, exact)
        try:
            decoder.crop(args.context)
            start = time.perf_counter()
            decoder.logits(ids[args.context:args.context + width], 1)
            return time.perf_counter() - start
        finally:
            int4.path_for = chosen

    print(f"draft pass after {args.context} tokens, medians of {args.repeats} (ms)")
    for width in WIDTHS:
        times = {rows: [], tiles: []}
        for r in range(args.repeats):
            for path in (rows, tiles) if r % 2 == 0 else (tiles, rows):
                times[path].append(seconds(width, path))
        a, b = (statistics.median(times[p]) * 1000 for p in (rows, tiles))
        print(f"{width:3d} tokens  row by row {a:6.1f}  tiles {b:6.1f}  ({a / b:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
