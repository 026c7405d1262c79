"""The GPU benchmark in one prepared call: specgen's CUDA path against transformers', on random
models of the real shapes, every figure from one process, contestants interleaved.

    python bench/gpu.py --out $OUT/gpu.json                          # on the GPU machine
    python bench/gpu.py --device cpu --tiny --out /tmp/gpu-tiny.json  # the same steps, tiny, on a CPU

There is no model hub on the GPU machine and what travels there is capped at 64 MiB, so the
models are built on the device with random weights, in bf16, in the shapes of three pairs:
Qwen2.5-Coder 1.5B verified with a 0.5B draft, Llama 3.1 8B with a Llama 3.2 1B draft, and the
Llama 3.1 70B shape in int4-gpu with the 8B as its draft. A random draft never agrees with a
random target, so each pair shares a "bigram" signal: a random rank-64 map from a token to the
next token's logits, carried by every model of the pair in its embeddings and output layer (each
through its own orthonormal basis, whatever its width). The residual branches of the layers
(attention and MLP outputs) are damped by one factor per pair, searched at the start so that
target and draft choose the same next token about GOAL_AGREEMENT of the time on text the target
itself would write; the acceptance the speculative runs then get is measured, not set.

Per pair, in one process (each contestant warmed up first; then, prompt by prompt, every
contestant once, in an order rotated per prompt):
- transformers `generate`, eager (DynamicCache), and with a static cache (compiled on a GPU,
  where `generate` compiles a static cache's forward itself);
- transformers' assisted generation (`assistant_model`, its default schedule);
- specgen plain (K = 0), speculative with fixed K, and adaptive (up to K_MAX), on the CUDA
  decoder (static caches, CUDA graphs), with the target in bf16 and in int4-gpu;
- tokens per second (128 new tokens, prompt included), tokens per target pass, and whether each
  output equals one-token greedy (transformers `generate` eager; and specgen plain, which runs
  the same kernels as the speculative runs);
- the verify-cost curve: milliseconds of a target pass over 1..9 tokens after a 256-token
  context, for bf16, int4-gpu and bitsandbytes nf4 and int8 (and transformers' own forward on
  the smallest pair), each through the CUDA decoder (graphs where the layers can be captured);
  the draft's one-token pass, and from these the ideal speedup of a K-token step;
- fp32 on the first pair: greedy speculation against `generate`, token for token;
- peak GPU memory.
The JSON is rewritten after every stage, so a run cut short keeps what it measured; a stage that
fails is recorded and the next one runs; stages that would not fit the time budget are skipped
and named. The last lines printed are a summary table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

GOAL_AGREEMENT = 0.8  # target-draft greedy agreement per position the damping aims at
RANK = 64  # of the shared bigram map
WIDTHS = tuple(range(1, 10))  # verify-cost curve: passes of 1..9 tokens
CONTEXT = 256  # tokens cached before a curve's passes

# name: (family, hidden, intermediate, layers, heads, kv heads, head_dim or None, vocab)
SHAPES = {
    "qwen2.5-coder-1.5b": ("qwen2", 1536, 8960, 28, 12, 2, None, 151936),
    "qwen2.5-coder-0.5b": ("qwen2", 896, 4864, 24, 14, 2, None, 151936),
    "llama-3.1-8b": ("llama", 4096, 14336, 32, 32, 8, None, 128256),
    "llama-3.2-1b": ("llama", 2048, 8192, 16, 32, 8, 64, 128256),
    "llama-3.1-70b": ("llama", 8192, 28672, 80, 64, 8, None, 128256),
}
TINY = {  # the same steps in seconds on a CPU; widths divisible by int4-gpu's groups of 128
    "qwen2.5-coder-1.5b": ("qwen2", 128, 256, 2, 4, 2, None, 512),
    "qwen2.5-coder-0.5b": ("qwen2", 128, 256, 1, 4, 2, None, 512),
    "llama-3.1-8b": ("llama", 128, 256, 2, 4, 2, None, 384),
    "llama-3.2-1b": ("llama", 128, 256, 1, 4, 2, None, 384),
    "llama-3.1-70b": ("llama", 256, 512, 3, 8, 2, None, 384),
}
# name: (target, draft, target scheme); the 70B pair's draft is the 8B pair's target.
PAIRS = {
    "qwen-1.5b": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "bf16"),
    "llama-8b": ("llama-3.1-8b", "llama-3.2-1b", "bf16"),
    "llama-70b": ("llama-3.1-70b", "llama-3.1-8b", "int4-gpu"),
}
# Seconds a stage needs on an H200, a guess used only to skip what cannot fit the budget.
NEEDS = {"build": 30, "compile": 120, "runs": 90, "curves": 40, "fp32": 30, "build-70b": 60}


# --- the run's bookkeeping ---------------------------------------------------------------------

class Run:
    """The report (rewritten as JSON after every stage), the time budget and the device."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.device = args, torch.device(args.device)
        self.start = time.perf_counter()
        self.report: dict = {"config": {k: str(v) for k, v in vars(args).items()},
                             "machine": machine(self.device), "pairs": {}, "skipped": [],
                             "errors": []}

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - self.start)

    def fits(self, what: str, where: str) -> bool:
        need = 0 if self.device.type == "cpu" else NEEDS[what]
        if self.left() >= need:
            return True
        self.report["skipped"].append(f"{where}: {what} (needs ~{need} s, {self.left():.0f} s left)")
        print(f"skipped {where}: {what}, {self.left():.0f} s left", flush=True)
        return False

    def stage(self, name: str, fn, *args):
        """Run one stage; a failure is recorded and printed, and the run goes on."""
        print(f"\n# {name} ({time.perf_counter() - self.start:.0f} s)", flush=True)
        try:
            return fn(*args)
        except Exception as e:
            traceback.print_exc()
            self.report["errors"].append(f"{name}: {type(e).__name__}: {e}".splitlines()[0])
            return None
        finally:
            self.save()

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(self.report, indent=1))
        os.replace(tmp, out)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def machine(device: torch.device) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}
    try:
        import bitsandbytes
        info["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        info["bitsandbytes"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        info["cuda"] = torch.version.cuda
    return info


# --- models --------------------------------------------------------------------------------------

def make_config(shape: tuple):
    from transformers import LlamaConfig, Qwen2Config

    family, hidden, inter, layers, heads, kv, head_dim, vocab = shape
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    if family == "qwen2":
        return Qwen2Config(max_position_embeddings=32768, rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
    if head_dim:
        common["head_dim"] = head_dim
    return LlamaConfig(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, **common)


def bigram(vocab: int, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair's shared signal: token a's next-token logits are w_out @ w_in[a]."""
    g = torch.Generator(device).manual_seed(seed)
    return (torch.randn(vocab, RANK, generator=g, device=device),
            torch.randn(vocab, RANK, generator=g, device=device))


def basis(hidden: int, device: torch.device, seed: int) -> torch.Tensor:
    """RANK orthonormal rows [RANK, hidden]: how one model carries the bigram signal."""
    g = torch.Generator(device).manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(hidden, RANK, generator=g, device=device))
    return q.T.contiguous()


def residual_weights(model) -> list[torch.Tensor]:
    """The weights that write into the residual stream (attention and MLP outputs)."""
    return [w for layer in model.model.layers
            for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)]


def build(shape: tuple, device: torch.device, signal, seed: int):
    """A random bf16 model of `shape` on `device`, carrying the bigram signal."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(make_config(shape), dtype=torch.bfloat16).eval()
    w_in, w_out = signal
    r = basis(shape[1], device, seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(w_in @ r)
        model.lm_head.weight.copy_(w_out @ r)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.requires_grad_(False)
    return model


def build_int4(shape: tuple, device: torch.device, signal, seed: int, damp: float):
    """The same, straight into int4-gpu layer by layer (the bf16 model never exists whole):
    the 70B shape is 140 GB in bf16."""
    from specgen.loading import streamed

    config = make_config(shape)
    model = streamed.empty(config, torch.bfloat16)
    quantized = streamed.quantized_weights(model)
    w_in, w_out = signal
    r = basis(shape[1], device, seed)
    g = torch.Generator(device).manual_seed(seed)
    std = config.initializer_range
    with torch.no_grad():
        for name, p in list(model.named_parameters()):
            if name.endswith("embed_tokens.weight"):
                value = (w_in @ r).to(torch.bfloat16)
            elif name == "lm_head.weight":
                value = (w_out @ r).to(torch.bfloat16)
            elif "norm" in name:
                value = torch.ones(p.shape, dtype=torch.bfloat16, device=device)
            else:
                value = torch.randn(p.shape, generator=g, device=device, dtype=torch.bfloat16) * std
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    value *= damp
            streamed.place(model, name, value, name in quantized)
    model = streamed.finish(model, config, device, "random")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def successors(signal, tokens: torch.Tensor) -> torch.Tensor:
    w_in, w_out = signal
    return (w_in[tokens] @ w_out.T).argmax(-1)


def chains(signal, n: int, length: int, device: torch.device, seed: int) -> torch.Tensor:
    """n sequences that follow the bigram signal from random starts: text the pair's models
    would write (their damped layers aside)."""
    g = torch.Generator(device).manual_seed(seed)
    rows = [torch.randint(0, signal[0].shape[0], (n,), generator=g, device=device)]
    for _ in range(length - 1):
        rows.append(successors(signal, rows[-1]))
    return torch.stack(rows, 1)


@torch.inference_mode()
def agreement(target, draft, seqs: torch.Tensor) -> float:
    """How often target and draft pick the same next token, over every position of `seqs`."""
    a = target(input_ids=seqs).logits.argmax(-1)
    b = draft(input_ids=seqs).logits.argmax(-1)
    return float((a == b).float().mean())


@torch.inference_mode()
def calibrate(target, draft, seqs: torch.Tensor, goal: float, steps: int = 7) -> tuple[float, float]:
    """The factor on both models' residual branches (1e-3..1e2) that brings their agreement
    nearest `goal` (bisection on a log scale); the models are left scaled by it."""
    weights = residual_weights(target) + residual_weights(draft)
    originals = [w.clone() for w in weights]
    lo, hi, best = -3.0, 2.0, (1.0, 0.0)

    def set_damp(d: float) -> float:
        for w, w0 in zip(weights, originals):
            w.copy_(w0 * d)
        return agreement(target, draft, seqs)

    for _ in range(steps):
        mid = (lo + hi) / 2
        found = set_damp(10 ** mid)
        if abs(found - goal) < abs(best[1] - goal):
            best = (10 ** mid, found)
        lo, hi = (mid, hi) if found > goal else (lo, mid)
    set_damp(best[0])
    return best


def int4_copy(model):
    from specgen.kernels import cuda_int4

    return cuda_int4.apply(copy.deepcopy(model))


def bnb_copy(model, scheme: str):
    """A copy whose layer linears (not the head) are bitsandbytes nf4 or int8, quantized on the
    model's device."""
    import bitsandbytes as bnb

    model = copy.deepcopy(model)
    for name, lin in [(n, m) for n, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and m is not model.lm_head]:
        w = lin.weight.data
        if scheme == "int8":
            layer = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                        has_fp16_weights=False, device="meta")
            layer.weight = bnb.nn.Int8Params(w, requires_grad=False,
                                             has_fp16_weights=False)._quantize(w.device)
        else:
            layer = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=w.dtype, quant_type=scheme, device="meta")
            layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=scheme,
                                             module=layer)._quantize(w.device)
        if lin.bias is not None:
            layer.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer)
    return model


# --- contestants ---------------------------------------------------------------------------------

def specgen_generator(target, draft, k: int, adaptive: bool):
    """specgen's generator as a user gets it on a GPU (CUDA decoders, chosen by make_decoder).
    On a CPU the decoders are swapped for the CUDA decoder's captured form run eagerly, so
    that the CPU check runs the same code."""
    from specgen.core.engine import SpeculativeGenerator
    from specgen.decoding.cuda import CudaDecoder

    gen = SpeculativeGenerator(target, draft, k, adaptive, method="draft-model")
    if target.device.type == "cpu":
        gen._decoder = CudaDecoder(target, static=True)
        gen.drafter.lm.decoder = CudaDecoder(draft, static=True)
    return gen


class Passes:
    """Counts a model's forward calls while in use (assisted generation's target passes); the
    hook is removed after, so that compiled contestants never see it."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def __enter__(self) -> Passes:
        self.handle = self.model.register_forward_hook(self._hook)
        return self

    def __exit__(self, *_) -> None:
        self.handle.remove()

    def _hook(self, *_) -> None:
        self.calls += 1


def contestants(target, draft, k: int, k_max: int, n: int, device, compiled: bool,
                max_len: int, int4_target=None) -> dict:
    """name -> run(prompt ids [T]) -> (new token ids, target passes)."""
    from transformers import StaticCache

    out = {}

    def hf(**kwargs):
        def run(ids):
            cache = kwargs.get("cache")
            if cache is not None:
                cache.reset()
            with Passes(target) if "assistant_model" in kwargs else _one_per_token(n) as passes:
                tokens = target.generate(ids[None], do_sample=False, max_new_tokens=n,
                                         min_new_tokens=n, **kwargs)[0, len(ids):].tolist()
            return tokens, passes.calls
        return run

    def spec(gen):
        def run(ids):
            gen.reset()
            result = gen.generate(ids, max_new_tokens=n)
            return result.token_ids, result.stats.target_passes
        return run

    out["generate"] = hf()
    if compiled:
        out["generate-static"] = hf(cache=StaticCache(config=target.config, max_cache_len=max_len))
    out["assisted"] = hf(assistant_model=draft)
    out["plain"] = spec(specgen_generator(target, draft, 0, False))
    out[f"k{k}"] = spec(specgen_generator(target, draft, k, False))
    out["adaptive"] = spec(specgen_generator(target, draft, k_max, True))
    if int4_target is not None:
        out["int4-plain"] = spec(specgen_generator(int4_target, draft, 0, False))
        out[f"int4-k{k}"] = spec(specgen_generator(int4_target, draft, k, False))
        out["int4-adaptive"] = spec(specgen_generator(int4_target, draft, k_max, True))
    return out


class _one_per_token:
    """Plain decoding's target passes: one per new token."""

    def __init__(self, n: int) -> None:
        self.calls = n

    def __enter__(self) -> _one_per_token:
        return self

    def __exit__(self, *_) -> None:
        pass


def timed(run, ids, sync) -> tuple[list[int], int, float]:
    sync()
    t = time.perf_counter()
    tokens, passes = run(ids)
    sync()
    return tokens, passes, time.perf_counter() - t


def interleaved(run_obj: Run, entries: dict, prompts: list[torch.Tensor], n: int) -> dict:
    """Each contestant on each prompt once, the order rotated per prompt; then the figures."""
    names = list(entries)
    raw: dict[str, list[dict]] = {name: [] for name in names}
    for i, ids in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            tokens, passes, seconds = timed(entries[name], ids, run_obj.sync)
            raw[name].append({"prompt": i, "seconds": seconds, "new_tokens": len(tokens),
                              "target_passes": passes, "tokens": tokens})
        print(f"prompt {i}: " + ", ".join(
            f"{name} {raw[name][-1]['new_tokens'] / raw[name][-1]['seconds']:.1f}" for name in names)
            + " tok/s", flush=True)
    return summarize(raw, n)


def summarize(raw: dict[str, list[dict]], n: int) -> dict:
    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    refs = {"generate": raw.get("generate"), "plain": raw.get("plain"),
            "int4-plain": raw.get("int4-plain")}
    out = {}
    for name, runs in raw.items():
        ref_plain = refs["int4-plain"] if name.startswith("int4") else refs["plain"]
        row = {"tokens_per_second": statistics.mean(r["new_tokens"] / r["seconds"] for r in runs),
               "tokens_per_target_pass": sum(r["new_tokens"] for r in runs)
               / max(1, sum(r["target_passes"] for r in runs)),
               "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
        for label, ref in (("generate", refs["generate"]), ("plain", ref_plain)):
            if ref is not None and not (name.startswith("int4") and label == "generate"):
                same = [r["tokens"] == s["tokens"] for r, s in zip(runs, ref)]
                row[f"equal_to_{label}"] = f"{sum(same)}/{len(same)}"
                row[f"common_prefix_with_{label}"] = [common(r["tokens"], s["tokens"])
                                                      for r, s in zip(runs, ref)]
        out[name] = row
    for name, row in out.items():
        plain = out.get("int4-plain" if name.startswith("int4") else "plain", {})
        if plain.get("tokens_per_second"):
            row["vs_plain"] = row["tokens_per_second"] / plain["tokens_per_second"]
        if "assisted" in out:
            row["vs_assisted"] = row["tokens_per_second"] / out["assisted"]["tokens_per_second"]
    return out


# --- the verify-cost curve -------------------------------------------------------------------------

@torch.inference_mode()
def curve(model, context: torch.Tensor, reps: int, device: torch.device, transformers_forward=False
          ) -> dict:
    """Milliseconds of a pass over w = 1..9 tokens after `context`, rolled back after each
    (median of `reps`, CUDA events around each pass on a GPU)."""
    from specgen.decoding import HFDecoder
    from specgen.decoding.cuda import CudaDecoder

    decoder = HFDecoder(model) if transformers_forward else CudaDecoder(model)
    decoder.logits(context, 1)
    start = decoder.length
    ms = {}
    for w in WIDTHS:
        ids = context[:w]
        times = []
        for rep in range(reps + 3):  # 3 warm-ups: graph capture, kernel selection
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                decoder.logits(ids, w)
                decoder.crop(start)
                b.record()
                b.synchronize()
                elapsed = a.elapsed_time(b)
            else:
                t = time.perf_counter()
                decoder.logits(ids, w)
                decoder.crop(start)
                elapsed = 1e3 * (time.perf_counter() - t)
            if rep >= 3:
                times.append(elapsed)
        ms[w] = statistics.median(times)
    result = {"ms": ms, "w5_over_w1": ms[5] / ms[1], "w9_over_w1": ms[9] / ms[1]}
    if not transformers_forward:
        result["graphs"], result["graph_error"] = decoder.graphs, decoder.graph_error
    return result


def ideal(row: dict, target_ms: dict, draft_ms: float, k: int) -> float:
    """The speedup a K-token step can give at the measured tokens per pass and costs:
    tau / (c(K+1) / c(1) + K * draft / c(1))."""
    return row["tokens_per_target_pass"] / (target_ms[k + 1] / target_ms[1] + k * draft_ms / target_ms[1])


# --- one pair ------------------------------------------------------------------------------------

def run_pair(run: Run, name: str, shapes: dict, kept: dict) -> None:
    args, device = run.args, run.device
    target_name, draft_name, scheme = PAIRS[name]
    pair: dict = {"target": target_name, "draft": draft_name, "target_scheme": scheme}
    run.report["pairs"][name] = pair
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    family = shapes[target_name][0]
    signal = kept.setdefault(f"signal-{family}", bigram(shapes[target_name][7], device, 1))
    seqs = chains(signal, 4, 64, device, seed=2)
    prompts = [torch.tensor(list(text.encode())[: args.prompt_tokens], device=device)
               % shapes[target_name][7] for _, text in prompts_set(args.prompts)]
    pair["prompt_tokens"] = [len(p) for p in prompts]

    # Build (and calibrate) the pair.
    if scheme == "int4-gpu":
        if "llama-8b" not in kept:
            run.report["skipped"].append(f"{name}: its draft (the llama-8b pair's target) was not built")
            return
        if not run.fits("build-70b", name):
            return
        draft, damp = kept["llama-8b"]
        t = time.perf_counter()
        target = build_int4(shapes[target_name], device, signal, 3, damp)
        pair["build_s"] = time.perf_counter() - t
        pair["damping"] = damp
        pair["agreement"] = agreement(target, draft, seqs)
    else:
        if not run.fits("build", name):
            return
        t = time.perf_counter()
        target = build(shapes[target_name], device, signal, 3)
        draft = build(shapes[draft_name], device, signal, 4)
        pair["damping"], pair["agreement"] = calibrate(target, draft, seqs, GOAL_AGREEMENT)
        pair["build_s"] = time.perf_counter() - t
        if name == "llama-8b":
            kept[name] = (target, pair["damping"])
    print(f"{name}: built in {pair['build_s']:.1f} s, damping {pair['damping']:.3g}, "
          f"agreement {pair['agreement']:.2f}", flush=True)
    run.save()

    # The verify-cost curves and the draft's one-token pass.
    context = chains(signal, 1, CONTEXT, device, seed=5)[0]
    reps = args.reps
    curves: dict = {}
    pair["verify_cost"] = curves

    def add_curves(target, draft) -> None:
        curves[scheme] = curve(target, context, reps, device)
        pair["draft_one_token_ms"] = curve(draft, context, reps, device)["ms"][1]
        if scheme == "bf16":
            q = int4_copy(target)
            curves["int4-gpu"] = curve(q, context, reps, device)
            del q
            schemes = ("nf4", "int8") if name == "qwen-1.5b" or args.int8 else ("nf4",)
            if run.report["machine"]["bitsandbytes"] is None:
                run.report["skipped"].append(f"{name}: bitsandbytes curves (not installed)")
                schemes = ()
            for s in schemes:
                q = bnb_copy(target, s)
                curves[s] = curve(q, context, max(3, reps // 3) if s == "int8" else reps, device)
                del q
            if name == "qwen-1.5b":
                curves["transformers-bf16"] = curve(target, context, max(3, reps // 3), device,
                                                    transformers_forward=True)
        for s, c in curves.items():
            print(f"{name} verify cost {s}: " + " ".join(f"{w}:{v:.2f}" for w, v in c["ms"].items())
                  + f" ms (w5/w1 {c['w5_over_w1']:.2f})", flush=True)

    if run.fits("curves", name):
        run.stage(f"{name}: verify-cost curves", add_curves, target, draft)
        empty_cache(device)

    # The contestants, interleaved.
    int4_target = int4_copy(target) if scheme == "bf16" else None
    compiled = (scheme == "bf16" and (name == "qwen-1.5b" or args.compile_all)
                and not args.no_compile and run.fits("compile", name))
    max_len = max(len(p) for p in prompts) + args.new_tokens + 16
    entries = contestants(target, draft, args.k, args.k_max, args.new_tokens, device, compiled,
                          max_len, int4_target)
    if scheme != "bf16":  # the 70B: transformers' eager loop over 80 layers is not worth the time
        entries = {k: v for k, v in entries.items() if k in ("plain", f"k{args.k}", "adaptive")}

    def warm(entries: dict) -> None:
        """One full run of each contestant on the first prompt (graph capture, compilation,
        kernel selection); a contestant that fails here is dropped and named."""
        for label in list(entries):
            t = time.perf_counter()
            try:
                timed(entries[label], prompts[0], run.sync)
            except Exception as e:
                traceback.print_exc()
                run.report["errors"].append(f"{name}: {label}: {type(e).__name__}: {e}".splitlines()[0])
                del entries[label]
                continue
            print(f"warm-up {label}: {time.perf_counter() - t:.1f} s", flush=True)

    if run.fits("runs", name):
        run.stage(f"{name}: warm-up", warm, entries)
        result = run.stage(f"{name}: contestants", interleaved, run, entries, prompts,
                           args.new_tokens)
        if result:
            pair["contestants"] = result
            for label, row in result.items():
                cost = curves.get("int4-gpu" if label.startswith("int4") else scheme, {}).get("ms")
                if cost and "draft_one_token_ms" in pair and label.endswith(f"k{args.k}"):
                    row["ideal_vs_plain"] = ideal(row, cost, pair["draft_one_token_ms"], args.k)
    entries = int4_target = None  # their generators' caches and graphs: freed before fp32

    # fp32: greedy speculation against generate, token for token.
    if name == "qwen-1.5b" and run.fits("fp32", name):
        run.stage(f"{name}: fp32 exactness", fp32_check, run, pair, target, draft, prompts)

    if device.type == "cuda":
        pair["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    run.save()
    target = draft = None
    empty_cache(device)


def fp32_check(run: Run, pair: dict, target, draft, prompts) -> None:
    t32, d32 = copy.deepcopy(target).float(), copy.deepcopy(draft).float()
    n = min(64, run.args.new_tokens)
    rows = []
    for ids in prompts[:2]:
        expected = t32.generate(ids[None], do_sample=False, max_new_tokens=n,
                                min_new_tokens=n)[0, len(ids):].tolist()
        row = {}
        for label, (k, adaptive) in {"plain": (0, False), f"k{run.args.k}": (run.args.k, False),
                                     "adaptive": (run.args.k_max, True)}.items():
            tokens = specgen_generator(t32, d32, k, adaptive).generate(ids, max_new_tokens=n).token_ids
            row[label] = tokens == expected
        rows.append(row)
    pair["fp32_equal_to_generate"] = {label: f"{sum(r[label] for r in rows)}/{len(rows)}"
                                      for label in rows[0]}
    print(f"fp32 equal to generate: {pair['fp32_equal_to_generate']}", flush=True)
    del t32, d32


def prompts_set(count: int) -> list[tuple[str, str]]:
    from specgen.bench.prompts import PROMPTS

    return list(PROMPTS[:count])


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch._dynamo.reset()
        torch.cuda.empty_cache()


# --- the summary -----------------------------------------------------------------------------------

def summary(report: dict) -> str:
    lines = ["", "| pair | contestant | tok/s | tokens/pass | vs plain | vs assisted | = generate | = plain |",
             "|---|---|---|---|---|---|---|---|"]
    for name, pair in report["pairs"].items():
        for label, row in pair.get("contestants", {}).items():
            lines.append(
                f"| {name} | {label} | {row['tokens_per_second']:.1f} | "
                f"{row['tokens_per_target_pass']:.2f} | {row.get('vs_plain', float('nan')):.2f} | "
                f"{row.get('vs_assisted', float('nan')):.2f} | {row.get('equal_to_generate', '')} | "
                f"{row.get('equal_to_plain', '')} |")
    lines += ["", "| pair | scheme | " + " | ".join(f"w{w} ms" for w in WIDTHS) + " | w5/w1 | graphs |",
              "|---|---|" + "---|" * (len(WIDTHS) + 2)]
    for name, pair in report["pairs"].items():
        for scheme, c in pair.get("verify_cost", {}).items():
            ms = c["ms"]
            lines.append(f"| {name} | {scheme} | " + " | ".join(f"{ms[w]:.2f}" for w in WIDTHS)
                         + f" | {c['w5_over_w1']:.2f} | {c.get('graphs', '-')} |")
    for name, pair in report["pairs"].items():
        extra = {k: pair[k] for k in ("agreement", "damping", "draft_one_token_ms",
                                      "fp32_equal_to_generate", "peak_memory_bytes") if k in pair}
        lines.append(f"{name}: {extra}")
    lines.append(f"skipped: {report['skipped']}")
    lines.append(f"errors: {report['errors']}")
    lines.append(f"elapsed: {report.get('elapsed_s')} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON file to write (e.g. $OUT/gpu.json)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes: checks the script in seconds")
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    ap.add_argument("--prompts", type=int, default=4, help="built-in bench prompts to run")
    ap.add_argument("--prompt-tokens", type=int, default=160, help="prompt length cap (byte ids)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="the fixed-K contestant's K")
    ap.add_argument("--k-max", type=int, default=8, help="the adaptive contestant's most K")
    ap.add_argument("--reps", type=int, default=30, help="timed passes per width of a curve")
    ap.add_argument("--budget", type=float, default=360, help="seconds; later stages are skipped")
    ap.add_argument("--no-compile", action="store_true", help="skip generate's compiled contestant")
    ap.add_argument("--compile-all", action="store_true",
                    help="the compiled contestant for every bf16 pair (default: the first only)")
    ap.add_argument("--int8", action="store_true", help="bitsandbytes int8 curves for every pair")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda, but this PyTorch sees no CUDA GPU; run it on a GPU machine, "
              "or check the script here with --device cpu --tiny.", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print("error: --device cpu builds models of the real shapes, gigabytes each; add --tiny.",
              file=sys.stderr)
        return 2
    unknown = set(args.pairs.split(",")) - set(PAIRS)
    if unknown:
        print(f"error: unknown pair(s) {', '.join(sorted(unknown))}; choose from {', '.join(PAIRS)}.",
              file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    run = Run(args)
    print(f"{run.report['machine']}", flush=True)
    shapes = TINY if args.tiny else SHAPES
    kept: dict = {}
    names = [p for p in PAIRS if p in args.pairs.split(",")]
    if "llama-70b" in names and "llama-8b" not in names:
        names.insert(names.index("llama-70b"), "llama-8b")  # the 70B's draft is the 8B
    for name in names:
        run.stage(f"pair {name}", run_pair, run, name, shapes, kept)
    kept.clear()
    run.save()
    print(summary(run.report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
