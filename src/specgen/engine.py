"""The speculative decoding loop: draft K, verify in one target pass, accept, roll back.

State between steps: `tokens` (prompt + output so far). The target's KV cache always holds
every token but the last one, the "pending" token, so each step is one target forward over
[pending, d1..dK] that yields the K+1 distributions verification needs. The prompt's own
pass gives the first token, as in plain decoding. The engine yields tokens as they are
decided and knows nothing of terminals, files or tokenizer display.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
from torch import Tensor
from transformers import PreTrainedModel

from specgen.adaptive import AdaptiveK, FixedK, Policies, choose_guesser, record_pass
from specgen.decoder import make_decoder
from specgen.drafters import MODEL, Drafter, ModelDrafter
from specgen.errors import ConfigError, ModelError
from specgen.figures import step_speedup
from specgen.llamacpp import LlamaCppDraft
from specgen.profiles import MAX_K
from specgen.sampling import SamplingParams, greedy_verify, probs_from_logits, rejection_verify

Source = Literal["accepted", "resampled", "bonus"]
SOURCES: tuple[Source, ...] = ("accepted", "resampled", "bonus")


@dataclass(frozen=True)
class Token:
    """One emitted token. `accepted`: a draft token the target kept; `resampled`: the
    target's replacement at the first rejection; `bonus`: the target's extra token after all
    K drafts passed (with K = 0, a plain target step, every token is a bonus)."""

    id: int
    source: Source


@dataclass
class Stats:
    """What one generation did. Plain data: `to_dict()` is what JSON and the history store."""

    k_max: int
    adaptive: bool
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the target actually ran (fewer when reused)
    new_tokens: int = 0
    target_passes: int = 0  # passes that made tokens: the prompt's (token 1), then one a step
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    per_position_proposed: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    accepted_length_hist: list[int] = field(default_factory=list)  # steps with K > 0
    k_per_step: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    stop_reason: str = "running"

    def __post_init__(self) -> None:
        self.per_position_proposed = self.per_position_proposed or [0] * self.k_max
        self.per_position_accepted = self.per_position_accepted or [0] * self.k_max
        self.accepted_length_hist = self.accepted_length_hist or [0] * (self.k_max + 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per target pass (1.0 is plain decoding)."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def speedup_estimate(self) -> float:
        """The steps' estimated speedup over plain decoding (figures.step_speedup)."""
        return step_speedup(self.new_tokens, self.target_passes, len(self.k_per_step),
                            self.draft_seconds, self.verify_seconds)

    def record_step(self, k: int, n_accepted: int) -> None:
        self.target_passes += 1
        self.k_per_step.append(k)
        if k == 0:
            return
        self.proposed += k
        self.accepted += n_accepted
        self.accepted_length_hist[n_accepted] += 1
        for i in range(k):
            self.per_position_proposed[i] += 1
            self.per_position_accepted[i] += i < n_accepted

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("acceptance_rate", "tau", "tokens_per_second", "speedup_estimate"):
            d[name] = getattr(self, name)
        return d


@dataclass
class GenerationResult:
    token_ids: list[int]
    sources: list[Source]
    stats: Stats


def vocab_size(model: PreTrainedModel) -> int:
    return model.config.get_text_config().vocab_size


def check_pair(target: PreTrainedModel, draft: PreTrainedModel | LlamaCppDraft) -> None:
    """Refuse a draft whose vocabulary is not the target's. Sizes may differ a little
    (padded embedding rows, e.g. 151,936 vs 152,064); token ids are compared over the
    shared range. Cross-tokenizer drafting is not supported."""
    v_t = vocab_size(target)
    if isinstance(draft, LlamaCppDraft):
        v_d, eos_d = draft.vocab_size, draft.eos_token_id
    else:
        v_d, eos_d = vocab_size(draft), draft.config.get_text_config().eos_token_id
    if min(v_t, v_d) / max(v_t, v_d) < 0.98:
        raise ModelError(
            f"The draft's vocabulary ({v_d:,} tokens) does not match the target's ({v_t:,}): "
            "the draft must use the same tokenizer as the target. Pick a draft model from "
            "the target's family (e.g. a smaller model of the same series)."
        )
    eos_t = target.config.get_text_config().eos_token_id
    if eos_t is not None and eos_d is not None and _as_set(eos_t).isdisjoint(_as_set(eos_d)):
        raise ModelError(
            f"The draft's end-of-sequence token ({eos_d}) differs from the target's ({eos_t}): "
            "they do not share a tokenizer. Pick a draft model from the target's family."
        )


def _as_set(ids: int | Sequence[int]) -> set[int]:
    return {ids} if isinstance(ids, int) else set(ids)


class SpeculativeGenerator:
    """Speculative decoding of a transformers causal LM `target` with a smaller `draft`
    (or any Drafter). Batch size 1. Output is exactly the target's: greedy equals the
    target's greedy decoding, sampling follows the target's (warped) distribution."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | Drafter,
        num_speculative_tokens: int = 4,
        adaptive: bool = True,
    ) -> None:
        if not isinstance(num_speculative_tokens, int) or not 0 <= num_speculative_tokens <= MAX_K:
            raise ConfigError(
                f"num_speculative_tokens (K) must be an integer from 0 to {MAX_K}, got "
                f"{num_speculative_tokens!r}. Try 4; 0 turns speculation off."
            )
        self.target = target
        if isinstance(draft, (PreTrainedModel, LlamaCppDraft)):
            check_pair(target, draft)
            draft = ModelDrafter(draft, vocab_size(target))
        self.drafter: Drafter = draft
        self.k_max = num_speculative_tokens
        self.adaptive = adaptive
        self.device = target.device
        self.stats = Stats(k_max=self.k_max, adaptive=adaptive)
        # The target's forward over its KV cache (transformers', or the lean one where it is
        # bit-identical: decoder.py). Kept between calls so that a prompt extending the last
        # one (a chat) reuses the KV caches instead of prefilling the whole history again.
        self._decoder = make_decoder(target, exact=True)
        self._tokens: Tensor = torch.empty(0, dtype=torch.long)
        self._reused = 0

    def reset(self) -> None:
        """Forget the cached context (start a new conversation)."""
        self._tokens = torch.empty(0, dtype=torch.long)
        self._decoder.reset()
        self.drafter.reset()

    def _prefill(self, tokens: Tensor) -> Tensor:
        """Bring the target cache to hold the whole prompt, reusing the longest common prefix
        with the previous call's context, and return the last position's logits [1, V]: the
        first token's distribution, as in plain decoding. The drafter is rolled back to that
        prefix; a draft model reads the rest when first asked to draft, so an answer that
        never drafts never pays for it."""
        prev = self._tokens.to(tokens.device)
        n = min(len(prev), len(tokens)) - 1  # the cache holds all of prev but its last token
        same = int((prev[:n] == tokens[:n]).cumprod(0).sum()) if n > 0 else 0
        self._decoder.crop(same)
        self.drafter.rollback(same)
        self._reused = same
        return self._decoder.logits(tokens[same:], 1)

    def generate(self, input_ids: Tensor | Sequence[int], **kwargs) -> GenerationResult:
        """Run `stream` to the end and collect its tokens and statistics."""
        tokens = list(self.stream(input_ids, **kwargs))
        return GenerationResult([t.id for t in tokens], [t.source for t in tokens], self.stats)

    @torch.inference_mode()
    def stream(
        self,
        input_ids: Tensor | Sequence[int],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_token_ids: int | Sequence[int] | None = None,
        stop_strings: Sequence[str] | None = None,
        tokenizer=None,
    ) -> Iterator[Token]:
        """Yield tokens as verification decides them. `self.stats` is live while it runs."""
        params = SamplingParams(temperature, top_k, top_p)
        tokens = self._prompt(input_ids)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}.")
        if stop_strings and tokenizer is None:
            raise ConfigError("stop_strings need a tokenizer to read the text; pass tokenizer=.")
        stop = _Stopper(self._eos_ids(eos_token_ids), stop_strings or (), tokenizer)
        gen_t, gen_d = self._generators(seed)
        # One K policy per guesser (a hybrid's lookup and model differ in cost and acceptance);
        # the target's pass costs are measured once for all of them.
        verify_cost: dict[int, float] = {}
        policies = Policies(lambda guesser: AdaptiveK(
            self.k_max, verify_cost=verify_cost, self_stopping=guesser == MODEL,
        ) if self.adaptive else FixedK(self.k_max))
        stats = self.stats = Stats(k_max=self.k_max, adaptive=self.adaptive)
        stats.prompt_tokens = len(tokens)
        context_limit = self._context_limit()
        if len(tokens) + max_new_tokens > context_limit:
            max_new_tokens = context_limit - len(tokens)
            if max_new_tokens < 1:
                raise ConfigError(
                    f"The prompt ({len(tokens)} tokens) fills the model's context "
                    f"({context_limit} tokens); shorten it."
                )

        start = time.perf_counter()
        try:
            logits = self._prefill(tokens)
            stats.prefill_tokens = len(tokens) - self._reused
            stats.prefill_seconds = time.perf_counter() - start
            draft_passes_before = self.drafter.forward_passes

            # 0. The prompt's pass already gives the first token: a step with no drafts.
            nxt = self._verify(logits, tokens.new_empty(0), None, params, gen_t)[1]
            tokens = self._tokens = torch.cat([tokens, nxt[None]])
            stats.target_passes = 1
            if (yield from self._emit(nxt[None], 0, 0, stop, stats)):
                return
            while stats.new_tokens < max_new_tokens:
                # 1. Draft: pick the guesser and its K, then propose up to K tokens (never
                #    more than are still wanted; a draft model may end sooner).
                t0 = time.perf_counter()
                guesser, k = choose_guesser(policies, self.drafter.guessers(tokens),
                                            max_new_tokens - stats.new_tokens - 1)
                stop_below = policies[guesser].stop_below(k) if guesser else 0.0
                drafts, q = self.drafter.propose(tokens, k, params, gen_d, guesser, stop_below)
                drafts = drafts.to(self.device)
                k = drafts.shape[0]  # a drafter may find fewer than asked
                if self.device.type == "cuda":
                    torch.cuda.synchronize()  # so draft and verify times are apart
                t1 = time.perf_counter()

                # 2. Verify: one target pass over [pending, d1..dK] gives K+1 distributions.
                logits = self._decoder.logits(torch.cat([tokens[-1:], drafts]), k + 1)
                n, nxt = self._verify(logits, drafts, q, params, gen_t)
                t2 = time.perf_counter()

                # 3. Accept d1..dn and the target's token; forget the rejected drafts.
                self._decoder.crop(len(tokens) + n)
                self.drafter.rollback(len(tokens) + n)
                new = torch.cat([drafts[:n], nxt[None]])
                tokens = self._tokens = torch.cat([tokens, new])
                record_pass(verify_cost, k, t2 - t1)
                if k:
                    policies[guesser].update(k, n, t1 - t0)
                stats.record_step(k, n)
                stats.draft_passes = self.drafter.forward_passes - draft_passes_before
                stats.draft_seconds += t1 - t0
                stats.verify_seconds += t2 - t1
                if (yield from self._emit(new, n, k, stop, stats)):
                    return
            stats.stop_reason = "max_new_tokens"
        except GeneratorExit:  # the consumer stopped between tokens: caches are consistent
            stats.stop_reason = "interrupted"
            raise
        except BaseException:  # e.g. Ctrl-C inside a forward: a cache may be half-written
            stats.stop_reason = "interrupted"
            self.reset()
            raise
        finally:
            stats.total_seconds = time.perf_counter() - start

    def _verify(self, logits: Tensor, drafts: Tensor, q: Tensor | None, params: SamplingParams,
                generator: torch.Generator) -> tuple[int, Tensor]:
        """How many drafts the target keeps, and its own token after them."""
        if params.greedy:
            return greedy_verify(logits, drafts)
        p = probs_from_logits(logits, params)
        return rejection_verify(p, _draft_probs(q, drafts, p.shape[-1]), drafts, generator)

    @staticmethod
    def _emit(new: Tensor, n: int, k: int, stop: _Stopper, stats: Stats
              ) -> Generator[Token, None, bool]:
        """Yield a step's tokens (n accepted drafts, then the target's own) up to a stop;
        whether generation stopped."""
        last: Source = "bonus" if n == k else "resampled"
        for i, token_id in enumerate(new.tolist()):
            stats.new_tokens += 1
            yield Token(token_id, "accepted" if i < n else last)
            reason = stop.check(token_id)
            if reason:
                stats.stop_reason = reason
                return True
        return False

    def _prompt(self, input_ids: Tensor | Sequence[int]) -> Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ConfigError(
                    f"specgen decodes one sequence at a time (batch size 1); got a batch of "
                    f"{ids.shape[0]}. Call it once per prompt."
                )
            ids = ids[0]
        if ids.dim() != 1:
            raise ConfigError(f"input_ids must have shape [T] or [1, T], got {list(ids.shape)}.")
        if ids.numel() == 0:
            raise ConfigError("The prompt is empty: give at least one token.")
        return ids.to(self.device)

    def _eos_ids(self, eos_token_ids: int | Sequence[int] | None) -> set[int]:
        if eos_token_ids is None:
            config = getattr(self.target, "generation_config", None)
            eos_token_ids = getattr(config, "eos_token_id", None)
        return set() if eos_token_ids is None else _as_set(eos_token_ids)

    def _generators(self, seed: int | None) -> tuple[torch.Generator, torch.Generator]:
        """One generator per device; seeded for reproducible sampling."""
        seed = torch.seed() if seed is None else seed
        draft_device = getattr(self.drafter, "device", self.device)
        gen_t = torch.Generator(self.device).manual_seed(seed)
        gen_d = torch.Generator(draft_device).manual_seed(seed + 1)
        return gen_t, gen_d

    def _context_limit(self) -> int:
        config = self.target.config.get_text_config()
        return getattr(config, "max_position_embeddings", None) or 1 << 30


def _draft_probs(q: Tensor | None, drafts: Tensor, vocab: int) -> Tensor:
    """The draft distributions on the target's vocabulary: one-hot for deterministic
    drafters, zero-padded when the draft's vocabulary is smaller."""
    if q is None:
        return torch.nn.functional.one_hot(drafts, vocab).float()
    q = q.to(drafts.device)
    if q.shape[-1] < vocab:
        q = torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
    return q


class _Stopper:
    """Decides, token by token, whether generation is finished: an EOS id, or a stop string
    appearing in the text of the recent tokens."""

    def __init__(self, eos_ids: set[int], stop_strings: Sequence[str], tokenizer) -> None:
        self.eos_ids = eos_ids
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        self.window = 2 * max((len(s) for s in self.stop_strings), default=0) + 8
        self.recent: list[int] = []

    def check(self, token_id: int) -> str | None:
        if token_id in self.eos_ids:
            return "eos"
        if not self.stop_strings:
            return None
        self.recent = (self.recent + [token_id])[-self.window :]
        text = self.tokenizer.decode(self.recent)
        return "stop_string" if any(s in text for s in self.stop_strings) else None
