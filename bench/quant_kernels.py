"""Cost and accuracy of weight-only quantization on this CPU: prints the tables in bench/NOTES.md.

    flock /tmp/specgen-heavy.lock python bench/quant_kernels.py layers
    flock /tmp/specgen-heavy.lock python bench/quant_kernels.py model --model DIR [--schemes ...]

`layers`: milliseconds per call of one linear over M tokens (M = 1, 2, 3, 5, 9, 17) for the
demo target's layer shapes, bf16 vs int8 vs int4 vs int8-dyn vs int4-dyn, with each arrangement of the
weight-only kernels' M > 4 path, and the
relative output error of each scheme. Weights are rotated over several copies so that they
stream from memory as in decoding instead of sitting in the 32 MB L3.
`model`: a whole cached forward over M new tokens after a 64-token context, relative to M = 1;
plain greedy decoding tokens/s (128 tokens, simple cached loop); greedy agreement of the
quantized model with the bf16 one (teacher-forced per position, and the common prefix of the
free-running greedy outputs). Medians of repeated runs; the machine is shared, so expect noise.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen import cpu_int4, quantize
from specgen.decoder import crop
from specgen.quantize import quantize_int4, quantize_int8

MS = (1, 2, 3, 5, 9, 17)
SHAPES = {  # (in, out) of the Qwen2.5-Coder-1.5B layers
    "mlp up/gate 1536->8960": (1536, 8960),
    "mlp down 8960->1536": (8960, 1536),
    "attn q/o 1536->1536": (1536, 1536),
    "attn k/v 1536->256": (1536, 256),
    "lm_head 1536->151936": (1536, 151936),
}
PROMPTS = {
    "code": "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "prose": "The history of the printing press begins in the fifteenth century, when",
    "numpy": "import numpy as np\n\n# Compute the moving average of a 1-D array with a window of size w\ndef moving_average(x, w):\n",
}


def timed(fn, reps: int) -> tuple[float, float]:
    """(minimum, median) milliseconds of `reps` calls after a warm-up. On a shared, overloaded
    machine a call that loses a thread to the scheduler waits a whole time slice, so the
    minimum is the better estimate of the kernel's own cost; the median shows the noise."""
    fn(), fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times), 1e3 * statistics.median(times)


def rotating(make, nbytes: int):
    """Enough copies of a layer's weights to exceed the L3 cache; each call uses the next."""
    copies = [make() for _ in range(max(1, -(-96_000_000 // nbytes)))]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(copies)
        return copies[state["i"]]
    return nxt


def layers(reps: int) -> None:
    print("ms per call: minimum (median); ratios from the minima")
    print("| layer | kernel | " + " | ".join(f"M={m}" for m in MS) + " | M=5 / M=1 | M=9 / M=1 |")
    print("|---|---|" + "---|" * (len(MS) + 2))
    for label, (k, n) in SHAPES.items():
        torch.manual_seed(0)
        w = torch.randn(n, k) * 0.02
        q8, s8 = quantize_int8(w)
        q4, sz4 = quantize_int4(w, 128)
        p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 8)
        wb = w.bfloat16()
        bf16 = rotating(lambda: wb.clone(), wb.nbytes)
        i8 = rotating(lambda: (q8.clone(), s8.clone()), q8.nbytes)
        i4 = rotating(lambda: (p4.clone(), sz4.clone()), p4.nbytes)

        def int8_mm(x):
            qw, s = i8()
            return torch.ops.aten._weight_int8pack_mm(x, qw, s)

        def int4_mm(x):
            pw, sz = i4()
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, pw, 128, sz)

        def chunked(mm):
            return lambda x: torch.cat([mm(c) for c in x.split(quantize.ROWS_PER_CALL)])

        dyn = rotating(lambda: quantize.QuantLinear(k, n, "int8-dyn", 0, q8, s8, None), q8.nbytes)
        p4d, s4d = cpu_int4.quantize(w)
        dyn4 = rotating(lambda: quantize.QuantLinear(k, n, "int4-dyn", 32, p4d.clone(), s4d.clone(), None),
                        p4d.nbytes)

        def dequant_bf16(x):  # dequantize int8 then a bf16 matmul
            qw, s = i8()
            return F.linear(x, qw.to(torch.bfloat16) * s[:, None])

        kernels = {"bf16 linear": lambda x: F.linear(x, bf16()),
                   "int8 one call": int8_mm, "int8 4-row calls": chunked(int8_mm),
                   "int4 g128 one call": int4_mm, "int4 g128 4-row calls": chunked(int4_mm),
                   "int8 dequant+bf16 mm": dequant_bf16,
                   "int8-dyn (fbgemm, fp32 in)": lambda x: dyn()(x.float()),
                   "int4-dyn (specgen's kernel, fp32 in)": lambda x: dyn4()(x.float())}
        for name, fn in kernels.items():
            if "dequant" in name and n > 10_000:
                continue  # materialising the 467 MB head per call is plainly hopeless
            both = [timed(lambda: fn(torch.randn(m, k).bfloat16()), reps) for m in MS]
            row = [lo for lo, _ in both]
            cells = " | ".join(f"{lo:.2f} ({med:.1f})" for lo, med in both)
            print(f"| {label} | {name} | {cells} | {row[3] / row[0]:.2f} | {row[4] / row[0]:.2f} |", flush=True)
        x = torch.randn(9, k)
        ref = x @ w.t()
        for name, y in {"int8": x @ (q8.float() * s8.float()[:, None]).t(),
                        "int4 g128": x @ quantize.dequantize_int4(q4, sz4, 128).t(),
                        "int4 g32": x @ quantize.dequantize_int4(*quantize_int4(w, 32), 32).t(),
                        "int8-dyn": quantize.QuantLinear(k, n, "int8-dyn", 0, q8, s8, None)(x),
                        "int4-dyn": x @ cpu_int4.dequantize(p4d, s4d).t()}.items():
            print(f"|  | relative error {name} (random weights) | {((y - ref).norm() / ref.norm()).item():.4f} |", flush=True)


# --- whole model -----------------------------------------------------------------------------

def load(model_dir: str, scheme: str, cache_dir: str) -> tuple[torch.nn.Module, str]:
    """The model in bf16 or quantized; quantized twice through a fresh cache so that both the
    first (quantize and save) and a later (load from the cache) time are measured."""
    from transformers import AutoModelForCausalLM

    def fresh():  # int8-dyn and int4-dyn quantize fp32 activations: their other layers stay fp32
        dtype = torch.float32 if scheme in quantize.DYNAMIC else torch.bfloat16
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    if scheme == "bf16":
        return fresh(), ""
    times = []
    for _ in range(2):
        model = fresh()
        t = time.perf_counter()
        quantize.apply(model, scheme, Path(cache_dir), f"bench:{model_dir}")
        times.append(time.perf_counter() - t)
    return model, f"quantize+save {times[0]:.1f} s, load from cache {times[1]:.1f} s"


@torch.inference_mode()
def forward_costs(model, ctx_ids: torch.Tensor, reps: int) -> dict[int, float]:
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    model(input_ids=ctx_ids[None], cache=cache, use_cache=True, logits_to_keep=1)
    n = cache.get_seq_length()
    out = {}
    for m in MS:
        ids = ctx_ids[:m][None]

        def step():
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=m)
            crop(cache, n)
        out[m] = timed(step, reps)
    return out


@torch.inference_mode()
def greedy(model, prompt_ids: torch.Tensor, n_new: int) -> tuple[list[int], float]:
    """Plain cached greedy decoding; returns (tokens, decode tokens/s excluding the prefill,
    as 1 / median step time: robust to the shared machine's scheduling stalls)."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=prompt_ids[None], cache=cache, use_cache=True, logits_to_keep=1).logits
    out = [int(logits[0, -1].argmax())]
    steps = []
    for _ in range(n_new - 1):
        t = time.perf_counter()
        logits = model(input_ids=torch.tensor([[out[-1]]]), cache=cache, use_cache=True, logits_to_keep=1).logits
        out.append(int(logits[0, -1].argmax()))
        steps.append(time.perf_counter() - t)
    return out, 1 / statistics.median(steps)


@torch.inference_mode()
def teacher_forced_argmax(model, prompt_ids: torch.Tensor, tokens: list[int]) -> list[int]:
    ids = torch.cat([prompt_ids, torch.tensor(tokens[:-1])])
    logits = model(input_ids=ids[None], logits_to_keep=len(tokens)).logits[0]
    return logits.argmax(-1).tolist()


def model_bench(model_dir: str, schemes: list[str], reps: int, n_new: int) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = {k: torch.tensor(tok(v)["input_ids"]) for k, v in PROMPTS.items()}
    ctx = torch.tensor(tok(PROMPTS["code"] * 4)["input_ids"][:64])
    reference: dict[str, list[int]] = {}
    rows = []
    cache_dir = tempfile.mkdtemp(prefix="specgen-quant-bench-")
    for scheme in ["bf16"] + [s for s in schemes if s != "bf16"]:
        model, q_seconds = load(model_dir, scheme, cache_dir)
        costs = forward_costs(model, ctx, reps)
        if scheme in ("int8-wo", "int4-wo"):  # the other arrangement of M > 4 rows: one call for all
            default, quantize.ROWS_PER_CALL = quantize.ROWS_PER_CALL, 1 << 30
            one_call = forward_costs(model, ctx, reps)
            quantize.ROWS_PER_CALL = default
            print(f"{scheme} one kernel call for all rows: forward ms {one_call}", flush=True)
        rates, agree_tf, prefix = [], [], []
        for name, ids in prompts.items():
            out, rate = greedy(model, ids, n_new)
            rates.append(rate)
            if scheme == "bf16":
                reference[name] = out
                continue
            ref = reference[name]
            tf = teacher_forced_argmax(model, ids, ref)
            agree_tf.append(sum(a == b for a, b in zip(tf, ref)) / len(ref))
            prefix.append(next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref)))
        rows.append((scheme, q_seconds, costs, rates, agree_tf, prefix))
        print(f"{scheme}: {q_seconds}; forward ms {costs}; decode tok/s {rates}; "
              f"teacher-forced agreement {agree_tf}; identical greedy prefix {prefix}", flush=True)
        del model
    shutil.rmtree(cache_dir)
    print("\nforward ms: minimum (median); ratios from the minima; tok/s = 1 / median decode step")
    print("| scheme | " + " | ".join(f"M={m} ms" for m in MS) + " | M=5/M=1 | M=9/M=1 | decode tok/s (median of 3 prompts) | vs bf16 |")
    print("|---|" + "---|" * (len(MS) + 4))
    base = statistics.median(rows[0][3])
    for scheme, _, costs, rates, _, _ in rows:
        cells = " | ".join(f"{costs[m][0]:.0f} ({costs[m][1]:.0f})" for m in MS)
        lo = {m: costs[m][0] for m in MS}
        rate = statistics.median(rates)
        print(f"| {scheme} | {cells} | {lo[5] / lo[1]:.2f} | {lo[9] / lo[1]:.2f} | {rate:.2f} | {rate / base:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["layers", "model"])
    ap.add_argument("--model", default="/work/demo-models/bf16-1.5b")
    ap.add_argument("--schemes", nargs="+", default=list(quantize.SCHEMES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "layers":
        layers(args.reps)
    else:
        model_bench(args.model, args.schemes, args.reps, args.new_tokens)


if __name__ == "__main__":
    main()
