"""The CUDA path on a lent GPU, in one call: prints what bench/NOTES.md's CUDA section records.

    python bench/cuda_check.py --out DIR            # on the GPU machine (see bench/NOTES.md)
    python bench/cuda_check.py --out DIR --small    # the same steps, tiny shapes, on this CPU

No model hub is reachable there, so the models are random, built on the spot and saved:
- a pair for the CLI, with the byte tokenizer of the tests: a target shaped like the demo
  target (Qwen2.5-Coder-1.5B: hidden 1536, 28 layers, GQA 12/2) and a draft made of its first
  4 layers. The target's later layers are damped (x0.1) so that the draft agrees with it
  about 70% of the time (measured on this CPU in fp32), and its head sharpened so greedy
  choices are not near-ties. The acceptance is thereby set up; the costs are real.
- the same target with the real 151936-token vocabulary, for the kernel table.

Steps, each reported even when an earlier one fails:
1. `specgen run` on the GPU (target bf16, then nf4), and the error for a CPU-only scheme there;
2. `specgen bench` on the GPU pair, target nf4 (with the bf16 contestant);
3. forward cost over M = 1, 2, 3, 5, 9 new tokens (after a 64-token context) relative to M = 1,
   and plain decode tok/s, for bf16 and bitsandbytes nf4, fp4 and int8;
4. `specgen bench` with the target in bf16.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
MS = (1, 2, 3, 5, 9)
DAMP, SHARPEN, DRAFT_LAYERS = 0.1, 8.0, 4
PROMPTS = [
    {"category": "code-completion", "prompt": "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
    {"category": "code-explanation", "prompt": "Explain what this does:\n\nfor i in range(10):\n    print(i * i)\n"},
    {"category": "prose", "prompt": "Write a short paragraph about the history of the printing press."},
    {"category": "structured-output", "prompt": "Return a JSON object with the keys name, age and city for a fictional person."},
]


def shape(small: bool, vocab: int, layers: int):
    from transformers import Qwen2Config

    dims = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4) if small else \
        dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12)
    return Qwen2Config(vocab_size=vocab, num_hidden_layers=layers, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=False,
                       eos_token_id=258, bos_token_id=None, pad_token_id=None, **dims)


def build(out: Path, small: bool, device: str) -> dict[str, Path]:
    """Random models saved as local model directories (bf16)."""
    from transformers import AutoModelForCausalLM
    from tiny import tiny_tokenizer

    layers = 6 if small else 28
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(shape(small, 259, layers), dtype=torch.bfloat16)
    with torch.no_grad():
        for i, layer in enumerate(target.model.layers):
            if i >= DRAFT_LAYERS:
                layer.self_attn.o_proj.weight.mul_(DAMP)
                layer.mlp.down_proj.weight.mul_(DAMP)
        target.lm_head.weight.mul_(SHARPEN)
    target.generation_config.eos_token_id = target.generation_config.pad_token_id = 258
    with torch.device(device):
        draft = AutoModelForCausalLM.from_config(shape(small, 259, DRAFT_LAYERS), dtype=torch.bfloat16)
    draft.load_state_dict(target.state_dict(), strict=False)  # layers 0..3, embeddings, norm, head
    draft.generation_config.eos_token_id = draft.generation_config.pad_token_id = 258
    paths = {}
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
        paths[name] = out / name
    del target, draft
    torch.manual_seed(1)
    with torch.device(device):
        wide = AutoModelForCausalLM.from_config(shape(small, 151936, layers), dtype=torch.bfloat16)
    wide.save_pretrained(out / "wide")
    paths["wide"] = out / "wide"
    del wide
    if device == "cuda":
        torch.cuda.empty_cache()
    return paths


def write_profile(out: Path, paths: dict[str, Path], device: str, quant: str,
                  dtype: str = "bfloat16") -> Path:
    p = out / f"gpu-{quant}-{dtype}.toml"
    p.write_text(
        f'description = "random 1.5B-shaped target ({quant}) and its first {DRAFT_LAYERS} layers as draft"\n'
        f'[target]\nmodel = "{paths["target"]}"\ndtype = "{dtype}"\ndevice = "{device}"\nquantization = "{quant}"\n'
        f'[draft]\nmodel = "{paths["draft"]}"\ndtype = "{dtype}"\ndevice = "{device}"\n'
        f"[speculation]\nnum_speculative_tokens = 4\nadaptive = true\n"
        f"[generation]\ntemperature = 0.0\nmax_new_tokens = 64\n")
    return p


def cli(args: list[str], env: dict, timeout: int = 240) -> tuple[int, str, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specgen", *args], capture_output=True, text=True,
                       env=env, timeout=timeout)
    return r.returncode, (r.stdout + r.stderr), time.perf_counter() - t


def step_run(out: Path, paths: dict, device: str, env: dict) -> None:
    for quant in ("none", "nf4"):
        code, text, secs = cli(["run", "--profile", str(write_profile(out, paths, device, quant)),
                                "--format", "json", "-n", "48", "def add(a, b):"], env)
        print(f"\n## specgen run, target {quant}: exit {code}, {secs:.1f} s\n{text[-1500:]}", flush=True)
    code, text, _ = cli(["run", "--profile", str(write_profile(out, paths, device, "none")),
                         "--target-quantization", "int8-dyn", "hello"], env)
    print(f"\n## specgen run --target-quantization int8-dyn on {device}: exit {code}"
          f" (a clear error expected on cuda, no traceback: {'Traceback' not in text})\n{text[-800:]}", flush=True)


def step_bench(out: Path, dest: Path, paths: dict, device: str, env: dict, n: int, quant: str,
               dtype: str = "bfloat16", contestants: str = "") -> None:
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    name = f"bench-{quant}" + ("" if dtype == "bfloat16" else f"-{dtype}")
    code, text, secs = cli(["bench", "--profile", str(write_profile(out, paths, device, quant, dtype)),
                            "--prompts", str(prompts), "-n", str(n), "--out", str(dest / f"{name}.json"),
                            *(["--contestants", contestants] if contestants else [])], env, timeout=400)
    table = text[:text.find("bench: ")] if "bench: " in text else text  # the per-run lines are in the JSON
    print(f"\n## specgen bench, target {quant} {dtype}: exit {code}, {secs:.1f} s\n{table[-6000:]}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> float:
    """Median milliseconds of `reps` calls after warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def step_kernels(dest: Path, wide: Path, device: str, reps: int) -> None:
    from transformers import AutoModelForCausalLM, DynamicCache

    from specgen.decoder import crop
    from specgen.models import _bnb_config

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # int8 warns once per layer per call
    rows = {}
    ctx = torch.randint(0, 151936, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    for scheme in ("bf16", "nf4", "fp4", "int8"):
        kwargs = {} if scheme == "bf16" else {"quantization_config": _bnb_config(scheme, torch.bfloat16)}
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(wide, dtype=torch.bfloat16, device_map={"": device},
                                                     **kwargs).eval()
        load_s = time.perf_counter() - t
        cache = DynamicCache(config=model.config)
        model(input_ids=ctx, cache=cache, use_cache=True, logits_to_keep=1)
        n = cache.get_seq_length()
        costs = {}
        for m in MS:
            ids = ctx[:, :m]

            def fwd():
                model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=m)
                crop(cache, n)
            costs[m] = timed(fwd, device, reps)
        # plain greedy decoding, 64 tokens after the context, one token per forward
        cache = DynamicCache(config=model.config)
        tok = model(input_ids=ctx, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        t = time.perf_counter()
        for _ in range(64):
            tok = model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        rate = 64 / (time.perf_counter() - t)
        mem = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
        rows[scheme] = {"load_s": load_s, "forward_ms": costs, "decode_tok_s": rate, "peak_gb": mem}
        print(f"{scheme}: load {load_s:.1f} s, forward ms {({m: round(v, 2) for m, v in costs.items()})}, "
              f"decode {rate:.1f} tok/s", flush=True)
        del model, cache
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    (dest / "kernels.json").write_text(json.dumps(rows, indent=1))
    print("\n| scheme | " + " | ".join(f"M={m} ms" for m in MS) + " | M=5/M=1 | M=9/M=1 | decode tok/s | vs bf16 |")
    print("|---|" + "---|" * (len(MS) + 4))
    base = rows["bf16"]["decode_tok_s"]
    for scheme, r in rows.items():
        c = r["forward_ms"]
        print(f"| {scheme} | " + " | ".join(f"{c[m]:.2f}" for m in MS)
              + f" | {c[5] / c[1]:.2f} | {c[9] / c[1]:.2f} | {r['decode_tok_s']:.1f} | {r['decode_tok_s'] / base:.2f}x |")


def stage(name: str, fn, *args) -> None:
    print(f"\n# {name} ({time.strftime('%H:%M:%S')})", flush=True)
    try:
        fn(*args)
    except Exception:  # report and go on: every stage's result is worth having
        traceback.print_exc()
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the JSON results")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specgen-cuda-check"))
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (checks the script)")
    ap.add_argument("--skip", default="", help="comma-separated stages to skip: run,bench,kernels,fp32")
    args = ap.parse_args()
    device = "cpu" if args.small else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECGEN_CACHE_DIR": str(args.work / "cache"),
           "SPECGEN_STATS_DB": str(args.work / "stats.db"), "COLUMNS": "160"}
    import bitsandbytes
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"bitsandbytes {bitsandbytes.__version__}, "
          f"gpu {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}", flush=True)
    t = time.perf_counter()
    paths = build(args.work, args.small, device)
    print(f"built and saved the random models in {time.perf_counter() - t:.1f} s", flush=True)
    skip = set(args.skip.split(","))
    n = 16 if args.small else 64
    if "run" not in skip:
        stage("specgen run on the GPU", step_run, args.work, paths, device, env)
    if "bench" not in skip:
        stage("specgen bench, target nf4", step_bench, args.work, args.out, paths, device, env, n, "nf4")
    if "kernels" not in skip:
        stage("forward cost over M tokens, 1.5B shape, vocabulary 151936", step_kernels,
              args.out, paths["wide"], device, 5 if args.small else 30)
    if "bench" not in skip:
        stage("specgen bench, target bf16", step_bench, args.work, args.out, paths, device, env, n, "none")
    if "fp32" not in skip:  # are bf16's differences from the baseline rounding, or a CUDA bug?
        stage("specgen bench, fp32 pair", step_bench, args.work, args.out, paths, device, env, n, "none",
              "float32", "baseline,peer,k2,k4,adaptive")


if __name__ == "__main__":
    main()
