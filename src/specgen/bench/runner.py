"""`specgen bench`: specgen against plain decoding and transformers' assisted generation on
the same model pair, in one process, contestants interleaved prompt by prompt so that
machine drift hits all of them alike.

Contestants: `baseline` (the target's own `generate`, greedy, KV cache), `peer`
(`generate(assistant_model=draft)`), specgen with fixed K (`k2`, `k4`, `k6`) and adaptive K
(`adaptive`; `chain`: the same without token trees), the drafting methods `lookup` (prompt
lookup) and `hybrid`, self-speculative
drafting (`self`: the target with the profile's pinned, the tuned or the default skip set;
`self-default`: with the default set; `hybrid-self`: lookup first, then self), the profile's
draft head by its kind (`eagle`, `eagle3`, `medusa`; adaptive K, no draft model), `bf16`: plain
decoding of the target unquantized in bfloat16, loaded beside the pair, the reference of a
quantized target, `llamacpp`: llama.cpp's plain decoding of the target's GGUF file (when
llama-cpp-python is installed), `llamacpp-spec`: llama.cpp's own speculative decoding of the
target's and the draft's GGUF files (its `llama-speculative-simple`, built by `make llamacpp`,
run as a subprocess; timed by its own clock, model loading left out), and `api`: the Python API as a user who holds the two
transformers models calls it, `SpeculativeGenerator(target, draft)` with its defaults and
nothing from the profile (a llama.cpp draft's transformers copy drafts). Every figure of a prompt is the median over repeats; summaries are
geometric means of per-prompt ratios (report.py).
"""

from __future__ import annotations

import json
import platform
import re
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from specgen.bench.harness import Trial, interleave
from specgen.bench.prompts import PROMPTS
from specgen.choices import CONTESTANTS, HEAD_KINDS, MODEL_METHODS
from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.stats import Stats
from specgen.decoding import llamacpp
from specgen.decoding.lean import Skip
from specgen.errors import ConfigError
from specgen.profiles import utf8_text


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    prompt: str


@dataclass(frozen=True)
class Contestant:
    name: str
    kind: str  # "baseline" | "peer" | "specgen" | "reference" (the unquantized bf16 target) | "llamacpp" | "llamacpp-spec" | "api"
    method: str = "draft-model"
    k: int = 0
    adaptive: bool = False
    self_drafts: bool = False  # drafts with the target's own layers (self, or hybrid with self)
    tree: bool = True  # the draft model's chain may branch (core/tree.py)
    default_skip: bool = False  # self drafting with the default skip set, whatever is tuned

    @property
    def needs_draft_model(self) -> bool:
        return self.kind in ("peer", "api") or (self.kind == "specgen" and not self.self_drafts
                                       and self.method in MODEL_METHODS)

    @property
    def needs_head(self) -> bool:
        return self.kind == "specgen" and self.method in HEAD_KINDS


# specgen's own loop and forward with speculation off (K = 0: nothing drafts)
PLAIN = Contestant("plain", "specgen", "prompt-lookup", 0)


def contestants(method: str = "draft-model", k_max: int = 4, has_draft: bool = True
                ) -> dict[str, Contestant]:
    """Every contestant by name. `method` drafts for the fixed-K and adaptive entries (with
    the target itself for "self", and for "hybrid" without a draft model); `lookup`,
    `hybrid`, `self` and the others always use their own method, adaptive up to `k_max`."""
    own = method == "self" or (method == "hybrid" and not has_draft)
    made = {
        "baseline": Contestant("baseline", "baseline"),
        "plain": PLAIN,
        "peer": Contestant("peer", "peer"),
        **{f"k{k}": Contestant(f"k{k}", "specgen", method, k, self_drafts=own) for k in (2, 4, 6)},
        "adaptive": Contestant("adaptive", "specgen", method, k_max, adaptive=True, self_drafts=own),
        "lookup": Contestant("lookup", "specgen", "prompt-lookup", k_max, adaptive=True),
        "hybrid": Contestant("hybrid", "specgen", "hybrid", k_max, adaptive=True),
        "chain": Contestant("chain", "specgen", method, k_max, adaptive=True, self_drafts=own,
                            tree=False),
        "self": Contestant("self", "specgen", "self", k_max, adaptive=True, self_drafts=True),
        "self-default": Contestant("self-default", "specgen", "self", k_max, adaptive=True,
                                   self_drafts=True, default_skip=True),
        "hybrid-self": Contestant("hybrid-self", "specgen", "hybrid", k_max, adaptive=True,
                                  self_drafts=True),
        **{kind: Contestant(kind, "specgen", kind, k_max, adaptive=True) for kind in HEAD_KINDS},
        "bf16": Contestant("bf16", "reference"),
        "llamacpp": Contestant("llamacpp", "llamacpp"),
        "llamacpp-spec": Contestant("llamacpp-spec", "llamacpp-spec"),
        "api": Contestant("api", "api"),
    }
    return {name: made[name] for name in CONTESTANTS}  # choices.py's order, every one


def default_names(everyone: dict[str, Contestant], quantized: bool, with_llama: bool,
                  self_drafting: bool = False, head_kind: str | None = None,
                  with_llama_spec: bool = False) -> list[str]:
    """Every contestant but `plain`, `chain` and `api` (asked for by name), `bf16` (only beside a quantized
    target), `llamacpp` (only when llama-cpp-python is installed and the target is a GGUF
    file), `llamacpp-spec` (only when llama.cpp's tools are built and the target and the
    draft are GGUF files), the self-drafting ones (only when the profile drafts that way: they need a
    Llama-family target that specgen's lean decoder runs), the head kinds other than the
    profile's head's, and `lookup` or `hybrid` where `adaptive` already runs that method."""
    same = {"prompt-lookup": "lookup", "hybrid": "hybrid"}.get(everyone["adaptive"].method)
    return [n for n in everyone if n not in ("plain", "chain", "api") and (n != "bf16" or quantized)
            and (n != "llamacpp" or with_llama) and (n != "llamacpp-spec" or with_llama_spec)
            and n != same
            and (not everyone[n].self_drafts or self_drafting)
            and (n not in HEAD_KINDS or n == head_kind)]


def builtin_prompts() -> list[BenchPrompt]:
    return [BenchPrompt(c, p) for c, p in PROMPTS]


def read_prompts(path: Path) -> list[BenchPrompt]:
    """A JSONL file, one {"category": ..., "prompt": ...} object a line (blank lines skipped)."""
    try:
        lines = utf8_text(path.read_bytes(), f"The prompts file {path}").splitlines()
    except OSError as e:
        raise ConfigError(f"Cannot read the prompts file {path}: {e.strerror}.") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{number}: not valid JSON ({e.msg}).") from None
        if not (isinstance(item, dict) and isinstance(item.get("category"), str)
                and isinstance(item.get("prompt"), str) and item["prompt"].strip()):
            raise ConfigError(f'{path}:{number}: each line must be an object '
                              f'{{"category": "...", "prompt": "..."}} with a non-empty prompt.')
        prompts.append(BenchPrompt(item["category"], item["prompt"]))
    if not prompts:
        raise ConfigError(f"{path} holds no prompts.")
    return prompts


# --- measuring ---------------------------------------------------------------------------------

class PeakMemory:
    """Peak memory of one measurement: CUDA's allocator peak on a GPU; on Linux the process's
    resident high-water mark, reset before each measurement (/proc/self/clear_refs); else the
    process's lifetime peak (getrusage), which cannot be reset."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def read(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        try:
            status = Path("/proc/self/status").read_text()
            return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
        except (OSError, AttributeError):
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return peak if platform.system() == "Darwin" else peak * 1024


class ForwardCounter:
    """Counts a model's forward calls (how many passes transformers' generate made) and
    notes when the first (the prompt's prefill) ended."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.first_end: float | None = None
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.calls += 1
        if self.first_end is None:
            self.first_end = time.perf_counter()

    def close(self) -> None:
        self._handle.remove()


@dataclass
class Measurement:
    """One contestant on one prompt, one repeat."""

    prompt: int
    category: str
    contestant: str
    repeat: int
    new_tokens: int
    seconds: float
    tokens_per_second: float
    decode_tokens_per_second: float | None  # after the prefill; None where not separable (peer)
    target_passes: int
    draft_passes: int
    acceptance_rate: float | None  # None: nothing drafted (baseline, plain)
    tau: float
    draft_seconds: float | None  # None: not measurable inside transformers' generate
    verify_seconds: float | None
    rest_seconds: float | None
    prefill_seconds: float | None
    peak_memory_bytes: int
    token_ids: list[int] = field(repr=False)
    k_per_step: list[int] = field(default_factory=list, repr=False)
    per_position_proposed: list[int] = field(default_factory=list, repr=False)
    per_position_accepted: list[int] = field(default_factory=list, repr=False)
    graphs_off: str | None = None  # a CUDA decoder ran without graphs: its one line
    tree_steps: int = 0  # steps verified as token trees
    branch_kept: int = 0  # of those, steps that kept a branch


class Bench:
    """Runs contestants on a loaded target (and draft) and returns Measurements."""

    def __init__(self, target, draft, max_new_tokens: int, eos_ids: Sequence[int],
                 max_ngram: int = 3, min_ngram: int = 1, head_rows: int | None = None,
                 confidence: float = 0.0, reference=None, llama=None, peer_draft=None,
                 skip: Skip | None = None, head=None, window: int = 0, llama_spec=None) -> None:
        self.target, self.draft, self.reference, self.llama = target, draft, reference, llama
        self.llama_spec = llama_spec  # llamacpp_tools.SpecRunner: llama-speculative-simple
        self.child_peak = 0  # llamacpp-spec's last run: its subprocess's peak memory
        self.head = head
        # The peer's assistant must be a transformers model: a llama.cpp draft's copy.
        self.peer_draft = peer_draft if peer_draft is not None else draft
        self.max_new_tokens = max_new_tokens
        self.eos_ids = list(eos_ids)
        self.drafter_options = (max_ngram, min_ngram, head_rows, confidence)
        self.window = window  # the draft model's reading (make_drafter)
        self.skip = skip  # the self drafter's (None: the default set)
        self.memory = PeakMemory(target.device)
        self.generators: dict[str, SpeculativeGenerator] = {}
        self.last_stats: dict[str, Stats] = {}

    def generator(self, c: Contestant) -> SpeculativeGenerator:
        if c.name not in self.generators:
            vocab = self.target.config.get_text_config().vocab_size
            skip = None if c.default_skip else self.skip
            drafter = make_drafter(c.method, None if c.self_drafts else self.draft, vocab,
                                   *self.drafter_options, skip=skip, head=self.head,
                                   window=self.window)
            self.generators[c.name] = SpeculativeGenerator(self.target, drafter, c.k, c.adaptive,
                                                           prepare=False,  # load_pair did
                                                           tree=c.tree)
        return self.generators[c.name]

    def api_generator(self) -> SpeculativeGenerator:
        """What `specgen.SpeculativeGenerator(target, draft)` builds: the API's own defaults
        (method, K, preparation; loading prepared the models already, and preparing is
        idempotent), with a transformers draft as a user would hold it."""
        if "api" not in self.generators:
            if not isinstance(self.peer_draft, PreTrainedModel):
                raise ConfigError("The api contestant needs a transformers draft model; the "
                                  "profile has none.")
            self.generators["api"] = SpeculativeGenerator(self.target, self.peer_draft)
        return self.generators["api"]

    def measure(self, c: Contestant, input_ids: Tensor, max_new_tokens: int | None = None
                ) -> tuple[list[int], Stats]:
        """Generate with one contestant; its tokens and a Stats of what it did."""
        n = max_new_tokens or self.max_new_tokens
        if c.kind == "baseline" and getattr(self.target, "lean_only", False):
            c = PLAIN  # a model on specgen's tree (a GGUF run as stored) has no `generate`
        if c.kind in ("specgen", "api"):
            gen = self.generator(c) if c.kind == "specgen" else self.api_generator()
            gen.reset()  # no KV reuse across measurements: every contestant prefills
            result = gen.generate(input_ids, max_new_tokens=n, eos_token_ids=self.eos_ids)
            return result.token_ids, result.stats
        if c.kind == "llamacpp":
            return self._llamacpp_generate(input_ids, n)
        if c.kind == "llamacpp-spec":
            return self._llamacpp_spec_generate(input_ids, n)
        return self._hf_generate(c, input_ids, n)

    def _llamacpp_spec_generate(self, input_ids: Tensor, n: int) -> tuple[list[int], Stats]:
        """llama-speculative-simple on the same prompt: its tokens, and its own timings (the
        prompt pass and the decoding, the models' loading left out) as total_seconds."""
        if self.llama_spec is None:
            raise ConfigError("The llamacpp-spec contestant needs llama.cpp's tools and the "
                              "target's and the draft's GGUF files.")
        tokens, run = self.llama_spec.generate(input_ids.tolist(), n, self.eos_ids)
        self.child_peak = run.peak_memory_bytes
        stats = Stats(k_max=self.llama_spec.settings.n_max, adaptive=False,
                      prompt_tokens=run.prompt_tokens, prefill_tokens=run.prompt_tokens,
                      new_tokens=run.new_tokens, total_seconds=run.seconds,
                      prefill_seconds=run.prompt_seconds, target_passes=run.target_passes,
                      proposed=run.drafted, accepted=run.accepted)
        stats.stop_reason = "eos" if run.new_tokens < n else "max_new_tokens"
        return tokens, stats

    def _llamacpp_generate(self, input_ids: Tensor, n: int) -> tuple[list[int], Stats]:
        if self.llama is None:
            raise ConfigError("The llamacpp contestant needs llama.cpp loaded on the target's GGUF file.")
        tokens, first, seconds = llamacpp.generate(self.llama, input_ids.tolist(), n, self.eos_ids)
        stats = Stats(k_max=0, adaptive=False, prompt_tokens=len(input_ids),
                      prefill_tokens=len(input_ids), new_tokens=len(tokens), total_seconds=seconds,
                      prefill_seconds=first, target_passes=len(tokens))
        stats.stop_reason = "eos" if tokens and tokens[-1] in self.eos_ids else "max_new_tokens"
        return tokens, stats

    def _hf_generate(self, c: Contestant, input_ids: Tensor, n: int) -> tuple[list[int], Stats]:
        """transformers' own generate: plain greedy (baseline, reference) or assisted (peer).
        Passes are counted with forward hooks; acceptance follows from them (each target pass
        keeps its accepted drafts plus one token of its own)."""
        kwargs = dict(do_sample=False, max_new_tokens=n, eos_token_id=self.eos_ids or None,
                      pad_token_id=self.eos_ids[0] if self.eos_ids else None)
        if c.kind == "peer":
            if not isinstance(self.peer_draft, PreTrainedModel):
                raise ConfigError("The peer contestant needs a transformers draft model; the "
                                  "profile has none.")
            kwargs["assistant_model"] = self.peer_draft
        model = self.reference if c.kind == "reference" else self.target
        if model is None:
            raise ConfigError("The bf16 contestant needs the unquantized target loaded beside the pair.")
        ids = input_ids.to(model.device)[None]
        counters = [ForwardCounter(model)]
        if c.kind == "peer":
            counters.append(ForwardCounter(self.peer_draft))
        try:
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            seconds = time.perf_counter() - start
        finally:
            for counter in counters:
                counter.close()
        tokens = out[0, ids.shape[1]:].tolist()
        stats = Stats(k_max=0, adaptive=False, prompt_tokens=ids.shape[1],
                      prefill_tokens=ids.shape[1], new_tokens=len(tokens), total_seconds=seconds)
        stats.target_passes = counters[0].calls  # includes the prefill, which makes token 1
        if c.kind != "peer" and counters[0].first_end is not None:
            stats.prefill_seconds = counters[0].first_end - start
        if c.kind == "peer":
            stats.draft_passes = counters[1].calls
            stats.proposed = counters[1].calls  # one draft forward per proposed token
            stats.accepted = max(0, len(tokens) - stats.target_passes)
        stats.stop_reason = "eos" if tokens and tokens[-1] in self.eos_ids else "max_new_tokens"
        return tokens, stats

    def run_one(self, c: Contestant, prompt_index: int, category: str, repeat: int,
                input_ids: Tensor) -> Measurement:
        self.memory.reset()
        start = time.perf_counter()
        tokens, stats = self.measure(c, input_ids)
        seconds = time.perf_counter() - start
        self.last_stats[c.name] = stats
        specgen = c.kind in ("specgen", "api")
        # A subprocess: its own clock and count (the wall time would add loading both models),
        # and its own peak memory.
        child = c.kind == "llamacpp-spec"
        if child:
            seconds = stats.total_seconds
        n_new = stats.new_tokens if child else len(tokens)
        split = (stats.draft_seconds, stats.verify_seconds,
                 seconds - stats.draft_seconds - stats.verify_seconds) if specgen else (None,) * 3
        # Decode speed: every contestant's prefill yields the first token.
        decoded = n_new - 1
        decode_s = seconds - stats.prefill_seconds
        decode_tps = decoded / decode_s if c.kind != "peer" and decode_s > 0 and decoded else None
        return Measurement(
            prompt=prompt_index, category=category, contestant=c.name, repeat=repeat,
            new_tokens=n_new, seconds=seconds,
            tokens_per_second=n_new / seconds if seconds else 0.0,
            decode_tokens_per_second=decode_tps,
            target_passes=stats.target_passes, draft_passes=stats.draft_passes,
            acceptance_rate=stats.acceptance_rate if stats.proposed else None,  # None: no drafts
            tau=n_new / stats.target_passes if stats.target_passes else 0.0,
            draft_seconds=split[0], verify_seconds=split[1], rest_seconds=split[2],
            prefill_seconds=stats.prefill_seconds if c.kind != "peer" else None,
            peak_memory_bytes=self.child_peak if child else self.memory.read(), token_ids=tokens,
            k_per_step=list(stats.k_per_step),
            per_position_proposed=list(stats.per_position_proposed) if specgen else [],
            per_position_accepted=list(stats.per_position_accepted) if specgen else [],
            graphs_off=stats.graphs_off, tree_steps=stats.tree_steps, branch_kept=stats.branch_kept,
        )


def run_bench(bench: Bench, prompts: Sequence[BenchPrompt], inputs: Sequence[Tensor],
              chosen: Sequence[Contestant], repeats: int = 1, warmup_tokens: int = 8,
              on_measurement: Callable[[Measurement, Stats], None] | None = None
              ) -> list[Measurement]:
    """Every contestant on every prompt, `repeats` times, through the harness's interleaving,
    after one short unrecorded warm-up generation per contestant (first-call allocations and
    lazy initialisation)."""
    by_name = {c.name: c for c in chosen}

    def warm_up(name: str) -> None:
        bench.measure(by_name[name], inputs[0], warmup_tokens)

    def call(name: str, p: int, r: int) -> Measurement:
        return bench.run_one(by_name[name], p, prompts[p].category, r, inputs[p])

    def seen(trial: Trial[Measurement]) -> None:
        if on_measurement is not None:
            on_measurement(trial.value, bench.last_stats[trial.name])

    trials = interleave(list(by_name), len(prompts), call, repeats=repeats,
                        warm_up=warm_up if warmup_tokens else None, on_trial=seen)
    return [t.value for t in trials]
