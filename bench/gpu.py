"""The GPU benchmark in one prepared call: specgen's CUDA path against transformers', on random
models of the real shapes, every figure from one process, contestants interleaved.

    python bench/gpu.py --out $OUT/gpu.json                          # on the GPU machine
    python bench/gpu.py --device cpu --tiny --out /tmp/gpu-tiny.json  # the same steps, tiny, on a CPU

(`python3 -P bench/gpu.py ...` runs it the same way.) There is no model hub on the GPU machine
and what travels there is capped at 64 MiB, so the models are built on the device with random
weights, in bf16, in the shapes of three pairs: Qwen2.5-Coder 1.5B verified with a 0.5B draft,
Llama 3.1 8B with a Llama 3.2 1B draft, and the Llama 3.1 70B shape in int4-gpu (built straight
into int4 on the device, layer by layer) with two drafts: the 8B, and the 1B (Llama 3.2 shares
Llama 3.1's tokenizer). A random draft never agrees with a random target, so each pair shares a
"bigram" signal: a random rank-64 map from a token to the next token's logits, carried by every
model of the pair in its embeddings and output layer (each through its own orthonormal basis,
whatever its width). The residual branches of the layers (attention and MLP outputs) are damped
by a factor searched at the start so that target and draft choose the same next token about
GOAL_AGREEMENT of the time on text the target itself would write: one factor for both models of
the first two pairs; for the 70B, a factor of its own against the 8B draft (the 8B keeps its
pair's), the 1B's agreement measured as it falls. The acceptance the speculative runs then get is
measured, not set.

Per pair, in one process, within the pair's time budget (PAIR_BUDGET; stages that would not fit
are skipped and named; the three fit in one call of at most 8 minutes on an H200):
- the verify-cost curve: milliseconds of a target pass over 1..9 tokens after a 256-token
  context, for bf16, int4-gpu and bitsandbytes nf4 (and int8 and transformers' own forward on
  the smallest pair), each through the CUDA decoder (graphs where the layers can be captured),
  and per width, from torch.profiler over a few replays, the device kernels a pass launches and
  their summed time (on a CPU: no device kernels, recorded as null, beside the CPU profiler's
  count of operators); the draft's one-token pass; the one-token pass without graphs (what a
  decoder whose capture failed costs); the ideal speedup of a K-token step from these;
- the contestants, each warmed up first, then prompt by prompt every contestant once in an order
  rotated per prompt: transformers `generate` eager (DynamicCache; the exactness reference, run
  on the first EAGER_PROMPTS prompts only (EAGER_PROMPTS_70B for the 70B), as are the other
  eager loops), with a static cache
  (compiled on a GPU, first pair), and assisted generation; specgen plain (K = 0), fixed K,
  adaptive (up to K_MAX, with token trees where the planner finds branches worth their rows)
  and `chain` (the same without trees) on the CUDA decoder, with the target in bf16 and in
  int4-gpu (and
  `generate` eager on the int4-gpu target, the reference for those rows); the 70B pair runs
  specgen only, with each of its drafts;
- a head contestant (`head-k4`): a random one-layer EAGLE-style head on each target (specgen's
  EagleHead), its layer damped so that its guess is the target's next token HEAD_AGREEMENT of
  the time, drafting K a step, and adaptive (`head-adaptive`, token trees from the head's
  q): tau, tok/s and the head's cost per drafted token as a share of a target pass. It
  measures the machinery at a set agreement, not a trained head;
- per contestant: tokens per second (128 new tokens), tokens per target pass, a drafting
  pass's milliseconds and their share of a one-token target pass, the steps that verified a
  token tree and those that kept a branch, whether its
  output equals specgen plain (one-token greedy on the same target and scheme) and transformers'
  eager `generate`, whether each of its CUDA decoders ran with graphs (the one line of one
  that gave up), and for specgen's its host syncs per speculative step (CUDA's sync debug
  mode, on the first prompt, SYNC_TOKENS new tokens; none on a CPU, where
  tests/test_syncs.py counts the reads);
- fp32 on the first pair: greedy speculation against `generate`, token for token;
- peak GPU memory.
The JSON is rewritten after every stage, so a run cut short keeps what it measured; a stage that
fails is recorded and the next one runs. The last lines printed are a summary table.
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
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# bench/ holds scripts, not packages: off the import path (where `python bench/gpu.py` puts it),
# so that none of them shadows an installed package of the same name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "src"))

GOAL_AGREEMENT = 0.8  # target-draft greedy agreement per position the damping aims at
HEAD_AGREEMENT = 0.7  # the EAGLE head's agreement with its target, set the same way
RANK = 64  # of the shared bigram map
WIDTHS = tuple(range(1, 10))  # verify-cost curve: passes of 1..9 tokens
CONTEXT = 256  # tokens cached before a curve's passes
SYNC_TOKENS = 32  # new tokens of the runs that count syncs per step (after the timed runs)

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
# name: (target, draft, target scheme); the 70B pair's draft is the 8B pair's target, and its
# second draft (SECOND_DRAFT) the 8B pair's draft.
PAIRS = {
    "qwen-1.5b": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "bf16"),
    "llama-8b": ("llama-3.1-8b", "llama-3.2-1b", "bf16"),
    "llama-70b": ("llama-3.1-70b", "llama-3.1-8b", "int4-gpu"),
}
SECOND_DRAFT = {"llama-70b": "llama-3.2-1b"}
# Seconds each pair may take on an H200, in one call of at most 8 minutes with the start-up;
# time a pair leaves unused passes to the next. The first pair's includes generate's compilation.
PAIR_BUDGET = {"qwen-1.5b": 190, "llama-8b": 110, "llama-70b": 140}
# Seconds a stage needs on an H200, a guess used only to skip what cannot fit the budget.
NEEDS = {"build": 15, "compile": 100, "runs": 60, "curves": 20, "fp32": 25, "build-70b": 30}
EAGER_PROMPTS = 2  # prompts transformers' eager loops (generate, assisted) run: the slowest
EAGER_PROMPTS_70B = 1  # the same for the 70B (its eager generate: the exactness reference)
PROFILED_PASSES = 5  # replays per width under torch.profiler


# --- the run's bookkeeping ---------------------------------------------------------------------

class Run:
    """The report (rewritten as JSON after every stage), the time budget and the device."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.device = args, torch.device(args.device)
        self.start = time.perf_counter()
        self.pair_end = float("inf")  # perf_counter time the current pair's budget ends
        self.report: dict = {"config": {k: str(v) for k, v in vars(args).items()},
                             "machine": machine(self.device), "pairs": {}, "skipped": [],
                             "errors": []}

    def left(self) -> float:
        now = time.perf_counter()
        return min(self.args.budget - (now - self.start), self.pair_end - now)

    def begin_pair(self, name: str, later: list[str]) -> None:
        """The pair's budget: its own, plus what earlier pairs left, less what later pairs
        need (on a CPU: no limit but the whole run's)."""
        if self.device.type == "cpu":
            return
        reserved = sum(PAIR_BUDGET[p] for p in later)
        whole_left = self.args.budget - (time.perf_counter() - self.start)
        self.pair_end = time.perf_counter() + max(PAIR_BUDGET[name], whole_left - reserved)

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
    """What scales the layers that write into the residual stream (attention and MLP
    outputs): a float layer's weight; an int4-gpu layer's scales and zeros (w ~= (q - 8) *
    scale + zero, so scaling both scales w and leaves q as it is)."""
    def scaled(linear) -> torch.Tensor:
        return linear.weight if isinstance(linear, torch.nn.Linear) else linear.scales_and_zeros

    return [scaled(m) for layer in model.model.layers
            for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


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
def choices(model, seqs: torch.Tensor) -> torch.Tensor:
    """The model's greedy next token at every position of `seqs`."""
    return model(input_ids=seqs).logits.argmax(-1)


def agreement(target, draft, seqs: torch.Tensor) -> float:
    """How often target and draft pick the same next token, over every position of `seqs`."""
    return float((choices(target, seqs) == choices(draft, seqs)).float().mean())


@torch.inference_mode()
def calibrate(target, draft, seqs: torch.Tensor, goal: float, steps: int = 7,
              damp_draft: bool = True) -> tuple[float, float]:
    """The factor on the residual branches (1e-3..1e2) of both models, or of the target only,
    that brings their agreement nearest `goal` (bisection on a log scale); the models are left
    scaled by it."""
    weights = residual_weights(target) + (residual_weights(draft) if damp_draft else [])
    fixed = None if damp_draft else choices(draft, seqs)

    def measure() -> float:
        theirs = choices(draft, seqs) if fixed is None else fixed
        return float((choices(target, seqs) == theirs).float().mean())

    return damped(weights, measure, goal, steps)


@torch.inference_mode()
def damped(weights: list[torch.Tensor], measure: Callable[[], float], goal: float,
           steps: int = 7) -> tuple[float, float]:
    """The factor on `weights` (1e-3..1e2) that brings `measure()` (an agreement, falling as
    the factor grows) nearest `goal`, by bisection on a log scale, and that agreement; the
    weights are left scaled by it."""
    originals = [w.clone() for w in weights]
    lo, hi, best = -3.0, 2.0, (1.0, 0.0)

    def set_damp(d: float) -> float:
        for w, w0 in zip(weights, originals):
            w.copy_(w0 * d)
        return measure()

    for _ in range(steps):
        mid = (lo + hi) / 2
        found = set_damp(10 ** mid)
        if abs(found - goal) < abs(best[1] - goal):
            best = (10 ** mid, found)
        lo, hi = (mid, hi) if found > goal else (lo, mid)
    set_damp(best[0])
    return best


def build_head(target, device: torch.device, seqs: torch.Tensor, seed: int):
    """A random one-layer EAGLE head on `target` (specgen's EagleHead, shaped as
    heads.train.new_head makes one): its fc passes the next token's embedding through (the
    bigram signal then gives the target's likely next token), and its layer's residual
    branches are random, damped so that its guess is the target's own next token about
    HEAD_AGREEMENT of the time; the head and that (damping, agreement)."""
    from specgen.heads.train import new_head

    with torch.device(device):
        head = new_head("eagle", target, seed=seed)
    head = head.to(torch.bfloat16).eval().requires_grad_(False)
    hidden = head.config.hidden
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden].copy_(torch.eye(hidden))  # the embedding comes first
        head.fc.bias.zero_()
    layer = head.layers[0]
    weights = [layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]
    return head, damped(weights, lambda: head_agreement(target, head, seqs), HEAD_AGREEMENT)


@torch.inference_mode()
def head_agreement(target, head, seqs: torch.Tensor) -> float:
    """How often the head's guess (the target's output layer over the feature it predicts
    from the true feature f_t and token t+1) is the target's own next token after t+1, over
    every position of `seqs`."""
    features = target.model(input_ids=seqs).last_hidden_state  # after the final norm
    head_out = target.get_output_embeddings()
    want = head_out(features).argmax(-1)[:, 1:]
    embeds = target.get_input_embeddings()(seqs[:, 1:])
    positions = torch.arange(seqs.shape[1] - 1, device=seqs.device)
    guess = head_out(head(features[:, :-1], embeds, positions)).argmax(-1)
    return float((guess == want).float().mean())


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

def specgen_generator(target, draft, k: int, adaptive: bool, tree: bool = True):
    """specgen's generator as a user gets it on a GPU (CUDA decoders, chosen by make_decoder),
    with a draft model or a drafter (a head); `tree=False`: chains only. On a CPU its decoders
    are the CUDA decoder's captured form run eagerly, so that the CPU check runs the same
    code."""
    import specgen.core.drafters as drafters
    import specgen.core.engine as engine
    from specgen.core.engine import SpeculativeGenerator
    from specgen.decoding.cuda import CudaDecoder

    if target.device.type != "cpu":
        return SpeculativeGenerator(target, draft, k, adaptive, method="draft-model", tree=tree)
    saved = engine.make_decoder, drafters.make_decoder
    engine.make_decoder = drafters.make_decoder = (
        lambda model, exact=False: CudaDecoder(model, static=True))
    try:
        return SpeculativeGenerator(target, draft, k, adaptive, method="draft-model", tree=tree)
    finally:
        engine.make_decoder, drafters.make_decoder = saved


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


@dataclass
class Contestant:
    """run(prompt ids [T], new tokens) -> (new token ids, target passes); `prompts`: how many
    of the prompts it runs (None: all); `gen`: specgen's generator, whose decoders say whether
    they run with graphs."""

    run: Callable
    prompts: int | None = None
    gen: object = None


def contestants(target, drafts: dict[str, object], k: int, k_max: int, device, compiled: bool,
                max_len: int, int4_target=None, assisted: bool = True, head=None,
                eager_prompts: int = EAGER_PROMPTS) -> dict[str, Contestant]:
    """name -> Contestant. `drafts`: label prefix ("" for the pair's draft) -> draft model;
    `head`: an EAGLE head on the target, drafting K a step (`head-k<K>`)."""
    from specgen.core.drafters import make_drafter
    from transformers import StaticCache

    out = {}

    def hf(model, **kwargs):
        def run(ids, n):
            cache = kwargs.get("cache")
            if cache is not None:
                cache.reset()
            with Passes(model) if "assistant_model" in kwargs else _one_per_token(n) as passes:
                tokens = model.generate(ids[None], do_sample=False, max_new_tokens=n,
                                        min_new_tokens=n, **kwargs)[0, len(ids):].tolist()
            return tokens, passes.calls
        return run

    def spec(model, draft, k, adaptive, tree=True):
        gen = specgen_generator(model, draft, k, adaptive, tree)

        def run(ids, n):
            gen.reset()
            result = gen.generate(ids, max_new_tokens=n)
            return result.token_ids, result.stats.target_passes
        return Contestant(run, gen=gen)

    first = next(iter(drafts.values()))
    out["generate"] = Contestant(hf(target), eager_prompts)
    if compiled:
        cache = StaticCache(config=target.config, max_cache_len=max_len)
        out["generate-static"] = Contestant(hf(target, cache=cache))
    if assisted:
        out["assisted"] = Contestant(hf(target, assistant_model=first), eager_prompts)
    out["plain"] = spec(target, first, 0, False)
    for prefix, draft in drafts.items():
        out[f"{prefix}k{k}"] = spec(target, draft, k, False)
        out[f"{prefix}adaptive"] = spec(target, draft, k_max, True)
        if draft is first:  # trees against chains: once a pair
            out["chain"] = spec(target, draft, k_max, True, tree=False)
    if head is not None:
        vocab = target.config.vocab_size
        out[f"head-k{k}"] = spec(target, make_drafter("eagle", None, vocab, head=head), k, False)
        out["head-adaptive"] = spec(target, make_drafter("eagle", None, vocab, head=head), k_max,
                                    True)
    if int4_target is not None:
        out["int4-generate"] = Contestant(hf(int4_target), eager_prompts)
        out["int4-plain"] = spec(int4_target, first, 0, False)
        out[f"int4-k{k}"] = spec(int4_target, first, k, False)
        out["int4-adaptive"] = spec(int4_target, first, k_max, True)
    return out


def graph_status(gen) -> dict[str, str]:
    """Per CUDA decoder of a specgen generator, and for an EAGLE head's draft step: "on",
    "off: <its one line>", or "eager" (built without graphs: on a CPU)."""
    decoders = {"target": gen._decoder, "draft": getattr(getattr(gen.drafter, "lm", None),
                                                          "decoder", None)}
    if hasattr(gen.drafter, "_graph"):
        decoders["head"] = gen.drafter
    status = {}
    for role, d in decoders.items():
        if d is None or not hasattr(d, "graph_error"):
            continue
        status[role] = "on" if d.graphs else d.graphs_off or "eager"
    return status


class _one_per_token:
    """Plain decoding's target passes: one per new token."""

    def __init__(self, n: int) -> None:
        self.calls = n

    def __enter__(self) -> _one_per_token:
        return self

    def __exit__(self, *_) -> None:
        pass


def timed(run, ids, n: int, sync) -> tuple[list[int], int, float]:
    sync()
    t = time.perf_counter()
    tokens, passes = run(ids, n)
    sync()
    return tokens, passes, time.perf_counter() - t


def interleaved(run_obj: Run, entries: dict[str, Contestant], prompts: list[torch.Tensor],
                n: int) -> dict:
    """Each contestant on each of its prompts once, through specgen's bench harness (the order
    rotated per prompt); then the figures, and each specgen contestant's graph status."""
    from specgen.bench.harness import interleave

    names = list(entries)
    raw: dict[str, list[dict]] = {name: [] for name in names}

    def call(name: str, i: int, _repeat: int) -> tuple[list[int], int]:
        return entries[name].run(prompts[i], n)

    def record(trial) -> None:
        tokens, passes = trial.value
        raw[trial.name].append({"prompt": trial.prompt, "seconds": trial.seconds,
                                "new_tokens": len(tokens), "target_passes": passes,
                                "tokens": tokens})
        gen = entries[trial.name].gen
        if gen is not None:  # what its drafting cost (CUDA events on a GPU)
            raw[trial.name][-1].update(draft_seconds=gen.stats.draft_seconds,
                                       draft_passes=gen.stats.draft_passes,
                                       tree_steps=gen.stats.tree_steps,
                                       branch_kept=gen.stats.branch_kept)

    def show(i: int, trials: list) -> None:
        ran = {t.name for t in trials}
        print(f"prompt {i}: " + ", ".join(
            f"{name} {raw[name][-1]['new_tokens'] / raw[name][-1]['seconds']:.1f}"
            for name in names if name in ran) + " tok/s", flush=True)

    interleave(names, len(prompts), call, sync=run_obj.sync, on_trial=record, on_prompt=show,
               runs=lambda name, i: entries[name].prompts is None or i < entries[name].prompts)
    out = summarize(raw)
    for name, entry in entries.items():
        if entry.gen is not None:
            out[name]["graphs"] = graph_status(entry.gen)
            out[name]["syncs_per_step"] = syncs_per_step(entry.run, entry.gen, prompts[0],
                                                         min(n, SYNC_TOKENS))
    return out


def syncs_per_step(run, gen, ids: torch.Tensor, n: int) -> float | None:
    """The host's waits for the device per speculative step, as CUDA's sync debug mode
    counts them (one warning a wait): a run of n new tokens less a run of one (the prompt's
    pass and the first token), per step between them. None on a CPU, which never waits
    (tests/test_syncs.py counts the reads there)."""
    if gen.device.type != "cuda":
        return None
    counted = []
    for tokens in (1, n):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(ids, tokens)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        counted.append((syncs, gen.stats.target_passes))
    (syncs_1, passes_1), (syncs_n, passes_n) = counted
    return (syncs_n - syncs_1) / max(1, passes_n - passes_1)


def references(name: str) -> tuple[str, str]:
    """The contestants a contestant's output is checked against: transformers' eager
    `generate` and specgen plain, on the same target and scheme."""
    return ("int4-generate", "int4-plain") if name.startswith("int4") else ("generate", "plain")


def summarize(raw: dict[str, list[dict]]) -> dict:
    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    out = {}
    for name, runs in raw.items():
        row = {"tokens_per_second": statistics.mean(r["new_tokens"] / r["seconds"] for r in runs),
               "tokens_per_target_pass": sum(r["new_tokens"] for r in runs)
               / max(1, sum(r["target_passes"] for r in runs)),
               "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
        if any(r.get("tree_steps") for r in runs):
            row["tree_steps"] = sum(r["tree_steps"] for r in runs)
            row["branch_kept"] = sum(r["branch_kept"] for r in runs)
        drafted = sum(r.get("draft_passes", 0) for r in runs)
        if drafted:
            row["draft_pass_ms"] = 1e3 * sum(r["draft_seconds"] for r in runs) / drafted
        for label, ref_name in zip(("generate", "plain"), references(name)):
            ref = {r["prompt"]: r["tokens"] for r in raw.get(ref_name, [])}
            pairs = [(r["tokens"], ref[r["prompt"]]) for r in runs if r["prompt"] in ref]
            if pairs:
                row[f"equal_to_{label}"] = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
                row[f"common_prefix_with_{label}"] = [common(a, b) for a, b in pairs]
        out[name] = row
    for name, row in out.items():
        plain = out.get(references(name)[1], {})
        if plain.get("tokens_per_second"):
            row["vs_plain"] = row["tokens_per_second"] / plain["tokens_per_second"]
        if "assisted" in out:
            row["vs_assisted"] = row["tokens_per_second"] / out["assisted"]["tokens_per_second"]
    return out


# --- the verify-cost curve -------------------------------------------------------------------------

def cuda_decoder(model, pytorch_ops: bool = False, **kwargs):
    """The decoder a generation gets on a GPU: FusedDecoder (specgen's kernels) where Triton
    runs and the layers are plain or int4-gpu linears, else CudaDecoder; `pytorch_ops` keeps
    CudaDecoder (PyTorch's ops) for the side-by-side curve. On a CPU, CudaDecoder."""
    from specgen.decoding.cuda import CudaDecoder
    from specgen.decoding.fused import FusedDecoder, fused_supported
    from specgen.kernels import gpu

    if (not pytorch_ops and model.device.type == "cuda" and fused_supported(model)
            and gpu.available(model.device)):
        return FusedDecoder(model, **kwargs)
    return CudaDecoder(model, **kwargs)


@torch.inference_mode()
def curve(model, context: torch.Tensor, reps: int, device: torch.device, transformers_forward=False,
          widths: tuple[int, ...] = WIDTHS, profiled: bool = True, pytorch_ops: bool = False) -> dict:
    """Milliseconds of a pass over w tokens after `context`, rolled back after each (median of
    `reps`, CUDA events around each pass on a GPU), per width; and per width the profiler's
    count of the pass (profile_passes). The CUDA decoder reserves its cache and captures
    every width's graph first, as a generation does."""
    from specgen.decoding import HFDecoder

    decoder = HFDecoder(model) if transformers_forward else cuda_decoder(model, pytorch_ops)
    if not transformers_forward:
        decoder.reserve(len(context) + max(widths), max(widths))
    decoder.logits(context, 1)
    start = decoder.length
    ms, profile = {}, {}
    for w in widths:
        ids = context[:w]
        times = []
        for rep in range(reps + 2):  # 2 warm-ups: kernel selection, caches
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
            if rep >= 2:
                times.append(elapsed)
        ms[w] = statistics.median(times)
        if profiled:
            profile[w] = profile_passes(decoder, ids, w, start, device, top=w == 1)
    result = {"ms": ms, "profile": profile}
    if len(widths) >= 9:
        result.update(w5_over_w1=ms[5] / ms[1], w9_over_w1=ms[9] / ms[1])
    if not transformers_forward:
        result["graphs"] = "on" if decoder.graphs else decoder.graphs_off or "eager"
        result["decoder"] = type(decoder).__name__
        if len(widths) > 1:
            result["rows_alone"] = rows_alone(decoder, context[:5], start)
    return result


def rows_alone(decoder, ids: torch.Tensor, start: int) -> bool:
    """Whether a pass over `ids` gives each row the bits of one-token passes at its position:
    what makes greedy speculation equal plain decoding."""
    wide = decoder.logits(ids, len(ids))
    decoder.crop(start)
    one = torch.cat([decoder.logits(ids[i:i + 1], 1) for i in range(len(ids))])
    decoder.crop(start)
    return bool(torch.equal(wide, one))


def profile_passes(decoder, ids: torch.Tensor, w: int, start: int, device: torch.device,
                   top: bool = False) -> dict:
    """torch.profiler over PROFILED_PASSES passes of `ids`: on a GPU the device kernels a pass
    launches and their summed device time per pass (against its wall time, the host's share
    shows), with the costliest kernels if `top`; on a CPU there are no device kernels (null),
    and the CPU profiler's operator count per pass (nested operators counted) is given
    instead, labelled as such."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_PASSES):
            decoder.logits(ids, w)
            decoder.crop(start)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if not cuda:
        cpu_ops = sum(e.device_type == DeviceType.CPU for e in events) / PROFILED_PASSES
        return {"kernels_per_pass": None, "kernel_ms_per_pass": None,
                "cpu_profiler_ops_per_pass": cpu_ops}
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    out = {"kernels_per_pass": len(kernels) / PROFILED_PASSES,
           "kernel_ms_per_pass": sum(e.device_time for e in kernels) / PROFILED_PASSES / 1e3}
    if top:
        by_name: dict[str, list] = {}
        for e in kernels:
            entry = by_name.setdefault(e.name[:80], [0, 0.0])
            entry[0] += 1
            entry[1] += e.device_time
        out["top_kernels"] = [
            {"name": name, "per_pass": count / PROFILED_PASSES, "us_per_pass": us / PROFILED_PASSES}
            for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:10]]
    return out


@torch.inference_mode()
def eager_one_token_ms(model, context: torch.Tensor, reps: int, device: torch.device) -> float:
    """A one-token pass of the CUDA decoder with graphs off (its captured form run eagerly):
    what every pass costs where capture failed."""
    decoder = cuda_decoder(model, graphs=False, static=True)
    decoder.logits(context, 1)
    start = decoder.length
    times = []
    for rep in range(reps + 2):
        run_sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        run_sync()
        t = time.perf_counter()
        decoder.logits(context[:1], 1)
        decoder.crop(start)
        run_sync()
        if rep >= 2:
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def ideal(row: dict, target_ms: dict, draft_ms: float, k: int) -> float:
    """The speedup a K-token step can give at the measured tokens per pass and costs:
    tau / (c(K+1) / c(1) + K * draft / c(1))."""
    return row["tokens_per_target_pass"] / (target_ms[k + 1] / target_ms[1] + k * draft_ms / target_ms[1])


# --- one pair ------------------------------------------------------------------------------------

def run_pair(run: Run, name: str, shapes: dict, kept: dict) -> None:
    args, device = run.args, run.device
    target_name, draft_name, scheme = PAIRS[name]
    second = SECOND_DRAFT.get(name)
    pair: dict = {"target": target_name, "draft": draft_name, "target_scheme": scheme,
                  "budget_s": PAIR_BUDGET[name]}
    if second:
        pair["second_draft"] = second
    run.report["pairs"][name] = pair
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    family = shapes[target_name][0]
    signal = kept.setdefault(f"signal-{family}", bigram(shapes[target_name][7], device, 1))
    seqs = chains(signal, 4, 64, device, seed=2)
    count = args.prompts if scheme == "bf16" else args.prompts_70b
    prompts = [torch.tensor(list(text.encode())[: args.prompt_tokens], device=device)
               % shapes[target_name][7] for _, text in prompts_set(count)]
    pair["prompt_tokens"] = [len(p) for p in prompts]

    # Build (and calibrate) the pair.
    t = time.perf_counter()
    drafts = {}
    if scheme == "int4-gpu":
        if "llama-8b" not in kept:
            run.report["skipped"].append(f"{name}: its drafts (the llama-8b pair's models) were not built")
            return
        if not run.fits("build-70b", name):
            return
        draft, small, _ = kept["llama-8b"]
        target = build_int4(shapes[target_name], device, signal, 3, 1.0)
        pair["damping"], pair["agreement"] = calibrate(target, draft, seqs, GOAL_AGREEMENT,
                                                       damp_draft=False)
        pair["second_draft_agreement"] = agreement(target, small, seqs)
        drafts = {"": draft, "1b-": small}
    else:
        if not run.fits("build", name):
            return
        target = build(shapes[target_name], device, signal, 3)
        draft = build(shapes[draft_name], device, signal, 4)
        pair["damping"], pair["agreement"] = calibrate(target, draft, seqs, GOAL_AGREEMENT)
        drafts = {"": draft}
        if name == "llama-8b":
            kept[name] = (target, draft, pair["damping"])
    head, (pair["head_damping"], pair["head_agreement"]) = build_head(target, device, seqs, seed=6)
    pair["build_s"] = time.perf_counter() - t
    print(f"{name}: built and calibrated in {pair['build_s']:.1f} s, damping {pair['damping']:.3g}, "
          f"agreement {pair['agreement']:.2f}"
          + (f" (second draft {pair['second_draft_agreement']:.2f})" if second else "")
          + f", head agreement {pair['head_agreement']:.2f}", flush=True)
    run.save()

    # The verify-cost curves, the drafts' one-token passes, a one-token pass without graphs.
    context = chains(signal, 1, CONTEXT, device, seed=5)[0]
    reps = args.reps
    curves: dict = {}
    pair["verify_cost"] = curves

    def add_curves() -> None:
        t = time.perf_counter()
        curves[scheme] = curve(target, context, reps, device)
        if scheme == "bf16" and curves[scheme]["decoder"] != "CudaDecoder":  # PyTorch's ops beside
            curves["bf16-pytorch-ops"] = curve(target, context, reps, device, pytorch_ops=True)
        for prefix, d in drafts.items():
            one = curve(d, context, reps, device, widths=(1,))
            pair[f"{prefix}draft_one_token_ms"] = one["ms"][1]
            pair[f"{prefix}draft_one_token_profile"] = one["profile"][1]
        pair["target_one_token_ms_without_graphs"] = eager_one_token_ms(target, context, reps, device)
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
                curves[s] = curve(q, context, max(3, reps // 2) if s == "int8" else reps, device,
                                  profiled=False)
                del q
            if name == "qwen-1.5b":
                curves["transformers-bf16"] = curve(target, context, max(3, reps // 2), device,
                                                    transformers_forward=True, profiled=False)
        pair["curves_s"] = time.perf_counter() - t
        for s, c in curves.items():
            print(f"{name} verify cost {s}: " + " ".join(f"{w}:{v:.2f}" for w, v in c["ms"].items())
                  + f" ms (w5/w1 {c['w5_over_w1']:.2f}; graphs {c.get('graphs', '-')})", flush=True)

    if run.fits("curves", name):
        run.stage(f"{name}: verify-cost curves", add_curves)
        empty_cache(device)

    # The contestants, interleaved.
    int4_target = int4_copy(target) if scheme == "bf16" else None
    compiled = (scheme == "bf16" and (name == "qwen-1.5b" or args.compile_all)
                and not args.no_compile and run.fits("compile", name))
    max_len = max(len(p) for p in prompts) + args.new_tokens + 16
    entries = contestants(target, drafts, args.k, args.k_max, device, compiled, max_len,
                          int4_target, assisted=scheme == "bf16", head=head,
                          eager_prompts=EAGER_PROMPTS if scheme == "bf16" else EAGER_PROMPTS_70B)

    def warm(entries: dict) -> None:
        """One run of each contestant on the first prompt (graph capture, compilation, kernel
        selection; transformers' eager loops on a few tokens only); a contestant that fails
        here is dropped and named."""
        t0 = time.perf_counter()
        for label in list(entries):
            t = time.perf_counter()
            n = args.new_tokens if entries[label].gen is not None or label == "generate-static" \
                else min(16, args.new_tokens)
            try:
                timed(entries[label].run, prompts[0], n, run.sync)
            except Exception as e:
                traceback.print_exc()
                run.report["errors"].append(f"{name}: {label}: {type(e).__name__}: {e}".splitlines()[0])
                del entries[label]
                continue
            print(f"warm-up {label}: {time.perf_counter() - t:.1f} s", flush=True)
        pair["warm_up_s"] = time.perf_counter() - t0

    if run.fits("runs", name):
        run.stage(f"{name}: warm-up", warm, entries)
        t = time.perf_counter()
        result = run.stage(f"{name}: contestants", interleaved, run, entries, prompts,
                           args.new_tokens)
        pair["contestants_s"] = time.perf_counter() - t
        if result:
            pair["contestants"] = result
            for label, row in result.items():
                cost = curves.get("int4-gpu" if label.startswith("int4") else scheme, {}).get("ms")
                prefix = label.removesuffix(f"k{args.k}").removeprefix("int4-")
                draft_ms = pair.get(f"{prefix}draft_one_token_ms")
                if cost and draft_ms and label.endswith(f"k{args.k}"):
                    row["ideal_vs_plain"] = ideal(row, cost, draft_ms, args.k)
                if cost and "draft_pass_ms" in row:  # a head's cost, a draft model's
                    row["draft_pass_share_of_target_pass"] = row["draft_pass_ms"] / cost[1]
    entries = int4_target = head = None  # their generators' caches and graphs: freed before fp32

    # fp32: greedy speculation against generate, token for token.
    if name == "qwen-1.5b" and run.fits("fp32", name):
        run.stage(f"{name}: fp32 exactness", fp32_check, run, pair, target, draft, prompts)

    if device.type == "cuda":
        pair["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    run.save()
    target = draft = drafts = None
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
    lines = ["", "| pair | contestant | tok/s | tokens/pass | vs plain | vs assisted | = generate "
             "| = plain | tree steps, branch kept | syncs/step | graphs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, pair in report["pairs"].items():
        for label, row in pair.get("contestants", {}).items():
            graphs = "; ".join(f"{role} {state}" for role, state in row.get("graphs", {}).items())
            trees = f"{row['tree_steps']}, {row['branch_kept']}" if "tree_steps" in row else "-"
            syncs = row.get("syncs_per_step")
            syncs = "-" if syncs is None else f"{syncs:.2f}"
            lines.append(
                f"| {name} | {label} | {row['tokens_per_second']:.1f} | "
                f"{row['tokens_per_target_pass']:.2f} | {row.get('vs_plain', float('nan')):.2f} | "
                f"{row.get('vs_assisted', float('nan')):.2f} | {row.get('equal_to_generate', '')} | "
                f"{row.get('equal_to_plain', '')} | {trees} | {syncs} | {graphs or '-'} |")
    lines += ["", "| pair | scheme | " + " | ".join(f"w{w} ms" for w in WIDTHS)
              + " | w5/w1 | graphs | decoder | rows alone |", "|---|---|" + "---|" * (len(WIDTHS) + 4)]
    for name, pair in report["pairs"].items():
        for scheme, c in pair.get("verify_cost", {}).items():
            ms = c["ms"]
            lines.append(f"| {name} | {scheme} | " + " | ".join(f"{ms[w]:.2f}" for w in WIDTHS)
                         + f" | {c['w5_over_w1']:.2f} | {c.get('graphs', '-')} | "
                         f"{c.get('decoder', '-')} | {c.get('rows_alone', '-')} |")
    lines += ["", "| pair | scheme | " + " | ".join(f"w{w} kernels, ms" for w in WIDTHS) + " |",
              "|---|---|" + "---|" * len(WIDTHS)]
    for name, pair in report["pairs"].items():
        for scheme, c in pair.get("verify_cost", {}).items():
            if c.get("profile"):
                cells = [c["profile"][w] for w in WIDTHS]
                lines.append(f"| {name} | {scheme} | " + " | ".join(
                    "null (cpu)" if p["kernels_per_pass"] is None
                    else f"{p['kernels_per_pass']:.0f}, {p['kernel_ms_per_pass']:.2f}" for p in cells)
                    + " |")
    keys = ("agreement", "second_draft_agreement", "head_agreement", "damping", "draft_one_token_ms",
            "1b-draft_one_token_ms", "target_one_token_ms_without_graphs", "fp32_equal_to_generate",
            "peak_memory_bytes", "budget_s", "build_s", "curves_s", "warm_up_s", "contestants_s")
    for name, pair in report["pairs"].items():
        lines.append(f"{name}: {({k: pair[k] for k in keys if k in pair})}")
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
    ap.add_argument("--prompts", type=int, default=3, help="built-in bench prompts per bf16 pair")
    ap.add_argument("--prompts-70b", type=int, default=2, help="built-in bench prompts, 70B pair")
    ap.add_argument("--prompt-tokens", type=int, default=160, help="prompt length cap (byte ids)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="the fixed-K contestant's K")
    ap.add_argument("--k-max", type=int, default=8, help="the adaptive contestant's most K")
    ap.add_argument("--reps", type=int, default=10, help="timed passes per width of a curve")
    ap.add_argument("--budget", type=float, default=460,
                    help="seconds for the whole run (each pair has its own: PAIR_BUDGET); stages "
                         "that would not fit are skipped")
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
    for i, name in enumerate(names):
        run.begin_pair(name, names[i + 1:])
        run.stage(f"pair {name}", run_pair, run, name, shapes, kept)
    kept.clear()
    run.save()
    print(summary(run.report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
