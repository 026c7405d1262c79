"""fp32 and bf16 linear layers on a CPU: PyTorch's products against specgen's C kernel
(cpu_linear.c), side by side in one run.

    python bench/cpu_linear.py layers [--dtype float32|bfloat16]
    python bench/cpu_linear.py model --model DIR [--dtype ...]  # a transformers folder

`layers`: ms per call of one layer over M rows for the demo pair's shapes: F.linear, W @ x.T
(fp32 only) and the C kernel, each on a weight too big for the caches; in bf16, each of the
kernel's paths this CPU runs (AVX2; AVX512-BF16 `vdpbf16ps`; AMX tiles), the fastest first.
`model`: a whole cached forward over M new tokens after a 64-token context, stock nn.Linear
against specgen's DecodeLinear (the same loaded model, switched in place; in bf16, each of the
kernel's paths), each relative to its own M = 1, in interleaved rounds. What specgen adopted
and why: bench/NOTES.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from quant_kernels import rotating, timed
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache

from specgen import cpu_linear
from specgen.cpu_linear import DecodeLinear, linear, use_decode_linears

SHAPES = {"1.5B mlp up/gate": (1536, 8960), "1.5B mlp down": (8960, 1536),
          "1.5B lm_head": (1536, 151936), "0.5B mlp up/gate": (896, 4864)}
LAYER_MS = (1, 2, 5, 9, 17, 33, 64, 256)
PATH_NAMES = {cpu_linear.AVX2: "AVX2", cpu_linear.DOT: "AVX512-BF16", cpu_linear.AMX: "AMX"}
MODEL_MS = (1, 2, 3, 5, 9, 17)


def slower_paths(dtype: torch.dtype) -> list[int]:
    """The kernel's bf16 paths this CPU runs besides the one DecodeLinear takes."""
    return list(range(cpu_linear.bf16_path()))[::-1] if dtype == torch.bfloat16 else []


def layers(reps: int, dtype: torch.dtype) -> None:
    slower = slower_paths(dtype)
    print(f"{dtype}, ms per call: minimum (median) of the calls; C / F.linear from the minima")
    print("| layer | M | F.linear | W @ x.T | C kernel | C / F.linear |"
          + "".join(f" C, {PATH_NAMES[p]} path |" for p in slower))
    print("|---|---|---|---|---|---|" + "---|" * len(slower))
    for label, (k, n) in SHAPES.items():
        w = (torch.randn(n, k) * 0.02).to(dtype)
        weights = rotating(lambda: w.clone(), w.nbytes)
        for m in LAYER_MS:
            x = torch.randn(m, k).to(dtype)
            lin = timed(lambda: F.linear(x, weights()), reps)
            wxt = timed(lambda: torch.mm(weights(), x.t()), reps) if dtype == torch.float32 else None
            c = timed(lambda: linear(x, weights(), None), reps)
            others = [timed(lambda: linear(x, weights(), None, path), reps) for path in slower]
            cell = "–" if wxt is None else f"{wxt[0]:.2f} ({wxt[1]:.2f})"
            print(f"| {label} | {m} | {lin[0]:.2f} ({lin[1]:.2f}) | {cell} | {c[0]:.2f} ({c[1]:.2f}) "
                  f"| {c[0] / lin[0]:.2f} |" + "".join(f" {o[0]:.2f} ({o[1]:.2f}) |" for o in others),
                  flush=True)


@torch.inference_mode()
def model(model_dir: str, reps: int, dtype: torch.dtype) -> None:
    net = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    context = torch.randint(0, net.config.vocab_size, (1, 64))
    switched = use_decode_linears(net)
    decode = [m for m in net.modules() if type(m) is DecodeLinear]
    best = cpu_linear.bf16_path

    def use(cls: type, path: int | None = None) -> None:
        for module in decode:
            module.__class__ = cls
        cpu_linear.bf16_path = best if path is None else (lambda: path)

    variants = {"nn.Linear (F.linear)": lambda: use(nn.Linear)}
    name = f", {PATH_NAMES[best()]} path" if dtype == torch.bfloat16 else ""
    variants[f"DecodeLinear ({switched} layers{name})"] = lambda: use(DecodeLinear)
    for path in slower_paths(dtype):
        variants[f"DecodeLinear, {PATH_NAMES[path]} path"] = lambda p=path: use(DecodeLinear, p)

    def once(m: int) -> float:
        cache = DynamicCache(config=net.config)
        net(context, past_key_values=cache, use_cache=True)
        x = torch.randint(0, net.config.vocab_size, (1, m))
        net(x, past_key_values=cache, use_cache=True)  # warm-up; the cache grows by m
        t = time.perf_counter()
        net(x, past_key_values=cache, use_cache=True)
        return 1e3 * (time.perf_counter() - t)

    # Rounds interleave the variants and widths, so that the VM's drift hits all alike.
    times = {(v, m): [] for v in variants for m in MODEL_MS}
    for _ in range(reps):
        for label, switch in variants.items():
            switch()
            for m in MODEL_MS:
                times[label, m].append(once(m))
    use(DecodeLinear)

    print(f"{model_dir} in {dtype}: ms per forward, minimum (median) of {reps} interleaved rounds; "
          "ratios to M=1 from the minima")
    print("| linear | " + " | ".join(f"M={m}" for m in MODEL_MS) + " | "
          + " | ".join(f"M={m} / M=1" for m in MODEL_MS[1:]) + " |")
    print("|---|" + "---|" * (2 * len(MODEL_MS) - 1))
    for label in variants:
        lo = [min(times[label, m]) for m in MODEL_MS]
        cells = " | ".join(f"{min(times[label, m]):.0f} ({statistics.median(times[label, m]):.0f})"
                           for m in MODEL_MS)
        ratios = " | ".join(f"{t / lo[0]:.2f}" for t in lo[1:])
        print(f"| {label} | {cells} | {ratios} |", flush=True)


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
