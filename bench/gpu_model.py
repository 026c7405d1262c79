"""What one token's pass of each bench/gpu.py shape should cost on an H100 and an H200, from
bytes moved, the number of kernels and the card's memory bandwidth: a prediction to hold GPU
measurements against, not a measurement.

    python bench/gpu_model.py [--context 1024] [--gap-us 2.0] [--json out.json]

At batch 1 a pass is a stream of the weights (and the cache) from memory: its floor is bytes
/ bandwidth. Each kernel adds a gap (a launch from a CUDA graph, the tail of one kernel and
the ramp of the next), `--gap-us`, an assumption to fit once a GPU run measures it. Bytes: every
linear's weights (bf16, or int4-gpu's half a byte plus a bf16 scale and zero per 128 inputs),
the output head in bf16, the norms' weights, the cache's keys and values up to `--context`;
activations are left out (kilobytes). Kernels: counted from the fused decoder's own launch
list (specgen.decoding.fused_offline records it; needs Triton's NVIDIA backend and its
interpreter off), one layer's times the layers, plus the final norm and the head.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernels import MODELS, shapes  # noqa: E402  (bench/gpu_kernels.py, beside this)

# Peak memory bandwidth, bytes a second (SXM parts, the makers' figures).
CARDS = {"H100": 3.35e12, "H200": 4.8e12}


def weight_bytes(n: int, k: int, int4: bool) -> float:
    return n * k * (0.5 + 4 / 128) if int4 else n * k * 2


def model_bytes(shape: tuple, int4: bool, context: int) -> dict[str, float]:
    _, hidden, inter, layers, heads, kv_heads, head_dim, vocab = shape
    head_dim = head_dim or hidden // heads
    linears = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
               (2 * inter, hidden), (hidden, inter)]
    per_layer = sum(weight_bytes(n, k, int4) for n, k in linears) + 2 * hidden * 2
    cache = layers * 2 * kv_heads * head_dim * context * 2
    return dict(weights=layers * per_layer + vocab * hidden * 2 + hidden * 2, cache=cache)


def kernels(shape: tuple, int4: bool) -> tuple[int, int]:
    """(kernels a layer, kernels a pass) from the decoder's recorded launches."""
    from specgen.decoding import fused_offline

    launches = fused_offline.launches(shape, 1, int4)
    per_layer = sum(1 for launch in launches if launch.op not in ("final norm", "head"))
    return per_layer, per_layer * shape[3] + len(launches) - per_layer


def predict(context: int, gap_us: float) -> list[dict]:
    all_shapes = shapes()
    rows = []
    for model, (name, int4) in MODELS.items():
        shape = all_shapes[name]
        moved = model_bytes(shape, int4, context)
        per_layer, count = kernels(shape, int4)
        total = moved["weights"] + moved["cache"]
        row = dict(model=model, bytes=total, weights=moved["weights"], cache=moved["cache"],
                   kernels_per_layer=per_layer, kernels=count)
        for card, bandwidth in CARDS.items():
            floor = total / bandwidth * 1e3
            row[f"{card}_floor_ms"] = floor
            row[f"{card}_ms"] = floor + count * gap_us * 1e-3
        rows.append(row)
    return rows


def render(rows: list[dict], context: int, gap_us: float) -> str:
    lines = [f"One token's pass, predicted (context {context}, {gap_us} us a kernel):", "",
             "| model | GB moved | kernels (a layer) | H100 floor ms | H100 ms | H200 floor ms "
             "| H200 ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['bytes'] / 1e9:.2f} | {r['kernels']} "
                     f"({r['kernels_per_layer']}) | {r['H100_floor_ms']:.2f} | {r['H100_ms']:.2f} "
                     f"| {r['H200_floor_ms']:.2f} | {r['H200_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=1024, help="cache positions read")
    parser.add_argument("--gap-us", type=float, default=2.0,
                        help="assumed cost of each kernel beyond its bytes, microseconds")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run with Triton's interpreter off (unset TRITON_INTERPRET)")
    rows = predict(args.context, args.gap_us)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(render(rows, args.context, args.gap_us))


if __name__ == "__main__":
    main()
