"""fp32 and bf16 linear layers on a CPU: PyTorch's products against specgen's C kernel
(cpu_linear.c), side by side in one run.

    python bench/cpu_linear.py layers [--dtype float32|bfloat16]
    python bench/cpu_linear.py model --model DIR [--dtype ...]  # a transformers folder

`layers`: ms per call of one layer over M rows for the demo pair's shapes: F.linear, W @ x.T
(fp32 only) and the C kernel, each on a weight too big for the caches. `model`: a whole cached
forward over M new tokens after a 64-token context, stock nn.Linear against specgen's
DecodeLinear (the same loaded model, switched in place), each relative to its own M = 1. What
specgen adopted and why: bench/NOTES.md.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from quant_kernels import rotating, timed
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache

from specgen.cpu_linear import DecodeLinear, linear, use_decode_linears

SHAPES = {"1.5B mlp up/gate": (1536, 8960), "1.5B mlp down": (8960, 1536),
          "1.5B lm_head": (1536, 151936), "0.5B mlp up/gate": (896, 4864)}
LAYER_MS = (1, 2, 5, 9, 17, 33, 64, 256)
MODEL_MS = (1, 2, 3, 5, 9, 17)


def layers(reps: int, dtype: torch.dtype) -> None:
    print(f"{dtype}, ms per call: minimum (median) of the calls; C / F.linear from the minima")
    print("| layer | M | F.linear | W @ x.T | C kernel | C / F.linear |")
    print("|---|---|---|---|---|---|")
    for label, (k, n) in SHAPES.items():
        w = (torch.randn(n, k) * 0.02).to(dtype)
        weights = rotating(lambda: w.clone(), w.nbytes)
        for m in LAYER_MS:
            x = torch.randn(m, k).to(dtype)
            lin = timed(lambda: F.linear(x, weights()), reps)
            wxt = timed(lambda: torch.mm(weights(), x.t()), reps) if dtype == torch.float32 else None
            c = timed(lambda: linear(x, weights(), None), reps)
            cell = "–" if wxt is None else f"{wxt[0]:.2f} ({wxt[1]:.2f})"
            print(f"| {label} | {m} | {lin[0]:.2f} ({lin[1]:.2f}) | {cell} | {c[0]:.2f} ({c[1]:.2f}) "
                  f"| {c[0] / lin[0]:.2f} |", flush=True)


@torch.inference_mode()
def model(model_dir: str, reps: int, dtype: torch.dtype) -> None:
    net = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    context = torch.randint(0, net.config.vocab_size, (1, 64))

    def forward(m: int):
        cache = DynamicCache(config=net.config)
        net(context, past_key_values=cache, use_cache=True)
        x = torch.randint(0, net.config.vocab_size, (1, m))
        return lambda: net(x, past_key_values=cache, use_cache=True)

    def row(label: str) -> None:
        times = []
        for m in MODEL_MS:
            fn = forward(m)  # the cache grows by m per call; a few calls do not change the cost
            times.append(timed(fn, reps))
        cells = " | ".join(f"{lo:.0f} ({med:.0f})" for lo, med in times)
        ratios = " | ".join(f"{lo / times[0][0]:.2f}" for lo, _ in times[1:])
        print(f"| {label} | {cells} | {ratios} |", flush=True)

    print(f"{model_dir} in {dtype}: ms per forward, minimum (median) of {reps}; ratios to M=1 from the minima")
    print("| linear | " + " | ".join(f"M={m}" for m in MODEL_MS) + " | "
          + " | ".join(f"M={m} / M=1" for m in MODEL_MS[1:]) + " |")
    print("|---|" + "---|" * (2 * len(MODEL_MS) - 1))
    row("nn.Linear (F.linear)")
    switched = use_decode_linears(net)
    row(f"DecodeLinear ({switched} layers)")
    for module in net.modules():  # back, and once more, so that drift shows up as a difference
        if type(module) is DecodeLinear:
            module.__class__ = nn.Linear
    row("nn.Linear again")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["layers", "model"])
    ap.add_argument("--model", help="transformers folder (model)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "layers":
        layers(args.reps, getattr(torch, args.dtype))
    else:
        model(args.model, args.reps, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
