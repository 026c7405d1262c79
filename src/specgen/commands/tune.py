"""`specgen tune` from parsed options to a stored skip set: load the target, measure plain
decoding, rank the sub-layers, search (tune/search.py) within the time budget with a progress
bar, measure plain and the best set once more side by side, store the best set for this
target (app/skipsets.py), print what was found. The CLI only parses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specgen.bench.runner import BenchPrompt, read_prompts
from specgen.commands.bench import MeasureRequest
from specgen.errors import ConfigError
from specgen.profiles import load_profile, with_overrides
from specgen.tune.search import Score, Search, SubLayer, rank

# A small set apart from the bench's, so that a bench after tuning measures other text: code
# (where a target's own guesses hold longest), and explanation in prose.
PROMPTS = (
    BenchPrompt("code-completion", "Write a Python function `is_palindrome(s)` that ignores "
                "case, spaces and punctuation, with a docstring and two doctests. Only the code."),
    BenchPrompt("code-completion", "Write a Python class `Inventory` with methods add(item, n), "
                "remove(item, n) that raises ValueError when there are too few, and total(). "
                "Only the code."),
    BenchPrompt("code-explanation", "Explain what a Python generator is and when to use one "
                "instead of a list, with a short example."),
)
MAX_MINUTES = 24 * 60


@dataclass
class TuneRequest(MeasureRequest):
    minutes: float = 8.0
    max_new_tokens: int = 48

    def check(self) -> None:
        if not 0 < self.minutes <= MAX_MINUTES:
            raise ConfigError(f"--minutes must be more than 0 and at most {MAX_MINUTES}, got "
                              f"{self.minutes}. Try 8.")
        if self.max_new_tokens < 8:
            raise ConfigError(f"--max-new-tokens must be at least 8 (a few speculative steps), "
                              f"got {self.max_new_tokens}.")
        self.check_threads()


@dataclass
class TuneResult:
    skip_layers: str
    tokens_per_second: float
    plain_tokens_per_second: float
    default_tokens_per_second: float | None
    trials: int
    path: Path
    all_equal: bool


def sub_layer_costs(config) -> dict[str, float]:
    """Weights a sub-layer reads per token, by kind (attention: q, k, v, o; MLP: gate, up,
    down), plus a square projection's worth of work that does not scale with them (norms,
    attention over the cache, calls)."""
    h = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    attention = h * h * 2 + 2 * h * config.num_key_value_heads * head_dim
    return {"attention": attention + h * h, "mlp": 3 * h * config.intermediate_size + h * h}


def importance(target, inputs: list) -> dict[SubLayer, float]:
    """How much each sub-layer turns the residual stream (1 - cosine of its input and output,
    the mean over the positions of `inputs` but the first; ShortGPT's block influence, per
    sub-layer): one pass of the target's own forward over each sequence, observed at its
    norms' inputs."""
    import torch

    body = target.base_model
    layers = list(body.layers)
    seen: dict[str, list] = {}

    def keep(name):
        return lambda module, args: seen.setdefault(name, []).append(args[0].detach().float())

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.input_layernorm.register_forward_pre_hook(keep(f"in{i}")))
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(keep(f"mid{i}")))
    handles.append(body.norm.register_forward_pre_hook(keep(f"in{len(layers)}")))
    sums: dict[SubLayer, float] = {}
    count = 0
    try:
        with torch.inference_mode():
            for ids in inputs:
                seen.clear()
                body(input_ids=ids[None], use_cache=False)
                count += 1

                def turn(a, b):
                    a, b = a.reshape(-1, a.shape[-1])[1:], b.reshape(-1, b.shape[-1])[1:]
                    return float(1 - torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())

                for i in range(len(layers)):
                    for kind, (a, b) in (("attention", (f"in{i}", f"mid{i}")),
                                         ("mlp", (f"mid{i}", f"in{i + 1}"))):
                        sums[(kind, i)] = sums.get((kind, i), 0.0) + turn(seen[a][0], seen[b][0])
    finally:
        for handle in handles:
            handle.remove()
    return {s: v / count for s, v in sums.items()}


def run(request: TuneRequest, load_session: Callable, err: Console) -> TuneResult:
    request.check()
    prompts = list(PROMPTS) + (read_prompts(request.prompts) if request.prompts else [])
    prof = load_profile(request.profile)
    # The target alone: no draft model is loaded, and plain decoding runs as the reference.
    prof = with_overrides(prof, method="prompt-lookup", temperature=0.0, device=request.device,
                          target_quantization=request.target_quantization,
                          num_speculative_tokens=request.k)
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from specgen.app import skipsets
    from specgen.app.session import encode_messages, messages_for
    from specgen.core.drafters import PromptLookupDrafter, SelfDrafter, default_skip, num_layers
    from specgen.core.engine import SpeculativeGenerator
    from specgen.decoding.lean import Skip

    if request.threads is not None:
        torch.set_num_threads(request.threads)
    start = time.perf_counter()
    deadline = start + 60 * request.minutes
    session = load_session(prof, lean=False)  # `importance` runs transformers' forward
    target, spec, gen = session.pair.target, prof.speculation, prof.generation
    layers = num_layers(target)
    SpeculativeGenerator(target, SelfDrafter(default_skip(layers)), 1)  # refuses what it cannot run
    inputs = [encode_messages(session.tokenizer, messages_for(p.prompt, gen.system_prompt),
                              gen.chat_template) for p in prompts]
    eos = session.eos_ids()
    k_max = spec.num_speculative_tokens or 8

    def to_skip(sub: frozenset[SubLayer]) -> Skip:
        return Skip(frozenset(i for kind, i in sub if kind == "attention"),
                    frozenset(i for kind, i in sub if kind == "mlp"))

    def from_skip(skip: Skip) -> frozenset[SubLayer]:
        return frozenset({("attention", i) for i in skip.attention} | {("mlp", i) for i in skip.mlp})

    plain_tokens: list[list[int]] = []

    def generate(drafter, k: int) -> tuple[float, list, float | None, float | None]:
        """Every prompt once: decoding tokens/s (the prompts' own passes left out, as they
        are the same for every candidate), the outputs, acceptance and tau."""
        g = SpeculativeGenerator(target, drafter, k, adaptive=spec.adaptive)
        tokens = seconds = 0.0
        outputs, proposed, accepted, passes, made = [], 0, 0, 0, 0
        for ids in inputs:
            g.reset()
            result = g.generate(ids, max_new_tokens=request.max_new_tokens, eos_token_ids=eos)
            s = result.stats
            tokens += s.new_tokens - 1
            seconds += s.total_seconds - s.prefill_seconds
            outputs.append(result.token_ids)
            proposed, accepted = proposed + s.proposed, accepted + s.accepted
            passes, made = passes + s.target_passes, made + s.new_tokens
        return (tokens / seconds if seconds else 0.0, outputs,
                accepted / proposed if proposed else None, made / passes if passes else None)

    def measure(sub: frozenset[SubLayer]) -> Score:
        rate, outputs, acceptance, tau = generate(SelfDrafter(to_skip(sub)), k_max)
        return Score(rate, acceptance, tau, outputs == plain_tokens)

    def measure_plain() -> float:
        rate, outputs, _, _ = generate(PromptLookupDrafter(), 0)
        plain_tokens[:] = outputs
        return rate

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
                        console=err, transient=False)
    default = from_skip(default_skip(layers))
    with progress:
        task = progress.add_task("measuring plain decoding", total=deadline - start)

        def tick(text: str) -> None:
            progress.update(task, completed=min(time.perf_counter() - start, deadline - start),
                            description=escape(text))

        for drafter, k in ((PromptLookupDrafter(), 0), (SelfDrafter(default_skip(layers)), 2)):
            SpeculativeGenerator(target, drafter, k, adaptive=False).generate(
                inputs[0], max_new_tokens=8, eos_token_ids=eos)  # first-call warm-up
        began = time.perf_counter()
        plain_rates = [measure_plain()]
        plain_seconds = time.perf_counter() - began
        tick("ranking the sub-layers")
        ranks = importance(target, [torch.cat([i, torch.tensor(o[:-1], dtype=torch.long)])
                                    for i, o in zip(inputs, plain_tokens)])
        costs = sub_layer_costs(target.config.get_text_config())
        cost = {s: costs[s[0]] for s in ranks}

        def on_trial(trial, best) -> None:
            tick(f"{len(search.trials)} sets tried · best "
                 f"{best.rate / plain_rates[0]:.2f}x plain ({skipsets.skip_text(to_skip(best.skip))})")

        # Leave room for the last measurement of plain and the best set, side by side.
        search = Search(rank(ranks, cost), cost, measure,
                        lambda: deadline - time.perf_counter() - 2 * plain_seconds,
                        default=default, on_trial=on_trial, layers=layers)
        tick("searching")
        best = search.run()
        if best is None:
            raise ConfigError(f"--minutes {request.minutes} left no time to measure a skip set; "
                              "give it more (the default is 8).")
        tick("measuring plain and the best set again")
        plain_rates.append(measure_plain())
        best.scores.append(measure(best.skip))
        progress.update(task, completed=deadline - start, description="done")
    plain_rate = max(plain_rates)  # as a candidate's: the best measurement
    default_trial = search.trials.get(default)
    skip = to_skip(best.skip)
    all_equal = all(s.equal for t in search.trials.values() for s in t.scores)
    path = skipsets.save_tuned(
        session.pair, skip, tokens_per_second=best.rate, plain_tokens_per_second=plain_rate,
        speedup=best.rate / plain_rate, acceptance=best.scores[-1].acceptance,
        tau=best.scores[-1].tau,
        default_tokens_per_second=default_trial.rate if default_trial else None,
        trials=len(search.trials), prompts=len(prompts), max_new_tokens=request.max_new_tokens,
        minutes=request.minutes, threads=torch.get_num_threads(), profile=prof.name,
        ranking=[f"{'a' if kind == 'attention' else 'm'}{i}" for kind, i in search.order],
        measured=[{"skip_layers": skipsets.skip_text(to_skip(t.skip)), "phase": t.phase,
                   "tokens_per_second": [round(s.tokens_per_second, 3) for s in t.scores],
                   "acceptance": t.scores[0].acceptance, "tau": t.scores[0].tau}
                  for t in search.trials.values()])
    return TuneResult(skipsets.skip_text(skip), best.rate, plain_rate,
                      default_trial.rate if default_trial else None, len(search.trials), path,
                      all_equal)


def report(result: TuneResult) -> None:
    """The search's outcome on stderr: the set stored, its speed against plain decoding and
    the default set's, and a warning should any output have differed."""
    from specgen.app.render import err

    speedup = result.tokens_per_second / result.plain_tokens_per_second
    err.print(f"skip set: [bold]{result.skip_layers}[/] · {result.tokens_per_second:.2f} tok/s, "
              f"{speedup:.2f}x plain decoding ({result.plain_tokens_per_second:.2f} tok/s) · "
              f"{result.trials} sets tried", highlight=False)
    if result.default_tokens_per_second:
        err.print(f"the default set: {result.default_tokens_per_second:.2f} tok/s, "
                  f"{result.default_tokens_per_second / result.plain_tokens_per_second:.2f}x plain",
                  highlight=False)
    err.print(f"stored in {result.path}; method \"self\" uses it for this target from now on.",
              highlight=False)
    if speedup < 1.0:
        err.print("[yellow]note:[/] no set drafted faster than plain decoding here; adaptive K "
                  "switches self drafting off where it does not pay.")
    if not result.all_equal:
        err.print("[bold red]warning:[/] some output differed from plain decoding, which an exact "
                  "target never gives: please report it.")
