"""The speculative decoding loop: draft K, verify in one target pass, accept, roll back.

State between steps: `tokens` (prompt + output so far), on the host, which learns each step's
ids in its one read anyway: prompt lookup matches it without waiting for the device, and a
drafter copies the few ids it reads to its device without a wait. The target's KV cache
always holds every token but the last one, the "pending" token (also kept on the device), so
each step is one target forward over [pending, d1..dK] that yields the K+1 distributions
verification needs. A step waits for the device at most twice: a drafter that draws on the
device reads its drafts once (with their branch scores), and the verdict is read once. The
prompt's own pass gives the first token, as in plain decoding. Who drafts and how much is
the planner's (adaptive.Planner), beside the loop; the engine yields tokens as they are
decided and knows nothing of terminals, files or tokenizer display.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specgen import kernels
from specgen.choices import DEFAULT_METHOD, MAX_K, MIN_K
from specgen.core.adaptive import Book, Planner
from specgen.core.drafters import Drafter, as_set, check_pair, make_drafter, vocab_size
from specgen.core.sampling import (SamplingParams, greedy_accept, probs_from_logits, rejection_accept,
                                   top_probability, tree_greedy_accept)
from specgen.core.stats import Origin, Stats, Token
from specgen.core.step import PLAIN, Plan, Step
from specgen.core.tree import Tree, branch_scores, build, rejection_walk
from specgen.decoding import make_decoder
from specgen.errors import ConfigError
from specgen.models.config import layer_params

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specgen.decoding.llamacpp import LlamaCppDraft


# torch's generators take seeds below 2**64; the draft's is the seed + 1.
SEED_LIMIT = 2**64 - 1
# The target's top probability travels with a step's token ids, as an integer in these units.
SURE_SCALE = 1 << 20


@dataclass
class GenerationResult:
    token_ids: list[int]
    sources: list[Origin]
    stats: Stats


class SpeculativeGenerator:
    """Speculative decoding of a transformers causal LM `target` with a smaller `draft`
    (or any Drafter). Batch size 1. Output is exactly the target's: greedy equals the
    target's greedy decoding, sampling follows the target's (warped) distribution.

    `prepare` (the default) readies both models for their roles first, in place, as the CLI
    does (kernels.prepare): on a CPU, a fp32 or bf16 target then verifies row by row, so
    greedy output equals the target's own greedy decoding bit for bit, and both models take
    specgen's faster products. Afterwards the models compute one unpadded sequence per
    forward exactly as before for any number of rows; a batch of several sequences takes
    transformers' stock attention. `prepare=False` leaves the models as they are (verify
    passes then round as transformers' batched kernels do; see docs/exactness.md).

    A draft model drafts by `method` (choices.METHODS), by default the CLI's (`hybrid`:
    prompt lookup where the context has a match, the draft model elsewhere, the planner
    choosing each step); `draft-model` drafts with the model alone. A Drafter passed as
    `draft` drafts as it is.

    `tree` (the default) lets the planner verify a draft model's or a head's chain with
    branches, its next-likeliest tokens, as a token tree in the same pass, where its measured costs say a
    branch pays (core/tree.py; on the decoders that verify trees: the CPU's lean decoder and
    the GPU's)."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | LlamaCppDraft | Drafter,
        num_speculative_tokens: int = 4,
        adaptive: bool = True,
        prepare: bool = True,
        method: str = DEFAULT_METHOD,
        tree: bool = True,
    ) -> None:
        k = num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not MIN_K <= k <= MAX_K:
            raise ConfigError(
                f"num_speculative_tokens (K) must be an integer from {MIN_K} to {MAX_K}, got "
                f"{k!r}. Try 4; 0 turns speculation off."
            )
        if prepare:  # idempotent: models loaded by specgen are prepared already
            kernels.prepare(target, "target")
            if isinstance(draft, torch.nn.Module):  # a draft model, not a runtime or drafter
                kernels.prepare(draft, "draft")
        self.target = target
        if not isinstance(draft, Drafter):  # a draft model (or runtime): `method`'s drafter
            check_pair(target, draft)
            draft = make_drafter(method, draft, vocab_size(target))
        self.drafter: Drafter = draft
        self.k_max = k
        self.adaptive = adaptive
        self.device = target.device
        self.stats = Stats(k_max=self.k_max, adaptive=adaptive)
        # The target's forward over its KV cache (transformers', or the lean one where it is
        # bit-identical: decoding/). Kept between calls so that a prompt extending the last
        # one (a chat) reuses the KV caches instead of prefilling the whole history again.
        self._decoder = make_decoder(target, exact=True)
        self.tree = tree  # token trees, where the decoder verifies them (`_grow`)
        self._clock = _Clock(self.device)
        # A drafter that reads the target's hidden states (a head) or drafts with its own
        # weights or cache (self) gets the target's decoder, once.
        self.drafter.bind_target(self._decoder, target)
        self._tokens: Tensor = torch.empty(0, dtype=torch.long)
        self._reused = 0
        # What reading context costs on this machine, learnt across answers; a new
        # conversation keeps it (reset), since it is the machine's, not the context's.
        self.book = Book(target_size=layer_params(target.config))

    @property
    def graphs_off(self) -> str | None:
        """The line of the first decoder (target's, then draft's) that gave up on CUDA graphs
        and runs eagerly, several times slower; None where none did."""
        return self._decoder.graphs_off or self.drafter.graphs_off

    def reset(self) -> None:
        """Forget the cached context (start a new conversation)."""
        self._tokens = torch.empty(0, dtype=torch.long)
        self._decoder.reset()
        self.drafter.reset()

    def _prefill(self, tokens: Tensor, max_new_tokens: int) -> Tensor:
        """Bring the target cache to hold the whole prompt, reusing the longest common prefix
        with the previous call's context, and return the last position's logits [1, V]: the
        first token's distribution, as in plain decoding. The drafter is rolled back to that
        prefix; a draft model reads the rest when first asked to draft, so an answer that
        never drafts never pays for it."""
        prev = self._tokens
        n = min(len(prev), len(tokens)) - 1  # the cache holds all of prev but its last token
        same = int((prev[:n] == tokens[:n]).cumprod(0).sum()) if n > 0 else 0
        self._decoder.crop(same)
        # Static caches (the CUDA decoder's): room for it all, and a graph for each pass of up
        # to K + 1 tokens (and each token tree's) captured before the first timed pass.
        room = len(tokens) + max_new_tokens + self.k_max + 1
        self._decoder.reserve(room, self.k_max + 1, trees=self.adaptive and self._trees())
        self.drafter.reserve(room, self.k_max + 1)
        self.drafter.rollback(same)
        self._reused = same
        return self._decoder.logits(tokens[same:].to(self.device, non_blocking=True), 1)

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
        planner = Planner(self.k_max, self.adaptive, self.book)
        stats = self.stats = Stats(k_max=self.k_max, adaptive=self.adaptive)
        stats.prompt_tokens = len(tokens)
        max_new_tokens = self._room(len(tokens), max_new_tokens)

        start = time.perf_counter()
        try:
            logits = self._prefill(tokens, max_new_tokens)
            stats.prefill_tokens = len(tokens) - self._reused
            draft_passes_before = self.drafter.forward_passes

            # 0. The prompt's pass already gives the first token: a plain step.
            no_drafts = torch.zeros(0, dtype=torch.long, device=self.device)
            first = self._chain(logits, no_drafts, None, params, gen_t, planner.reads_confidence)
            step = self._settle(first, PLAIN, 0)
            stats.prefill_seconds = time.perf_counter() - start  # read back: the pass is done
            planner.prefilled(stats.prefill_tokens, stats.prefill_seconds)
            planner.sure(step.sure)
            tokens = self._tokens = _extended(tokens, step)
            stats.target_passes = 1
            if (yield from self._emit(step, stop, stats)):
                return
            while stats.new_tokens < max_new_tokens:
                # 1. Draft: the planner picks who drafts and how much (never more tokens than
                #    are still wanted); a drafter may find fewer, or end sooner.
                plan = planner.plan(self.drafter, tokens, max_new_tokens - stats.new_tokens - 1,
                                    stats.new_tokens)
                t0 = self._clock.mark()
                drafts, q = self._draft(plan, tokens, params, gen_d)
                t1 = self._clock.mark()

                # 2. Verify: one target pass over [pending, d1..dK] (or a token tree's rows)
                #    gives the distributions; acceptance runs on the device, and the host
                #    learns its outcome, the step, in one read.
                verdict = self._verify(planner, plan, step.tokens[-1:], drafts, q, params, gen_t)
                t2 = self._clock.mark()
                step = self._settle(verdict, plan, drafts.shape[0], (t0, t1, t2))

                # 3. Accept the kept drafts and the target's token; forget the rejected ones.
                tokens = self._tokens = self._accept(tokens, step)

                # 4. Observe: the planner learns what the step kept and what it cost.
                planner.observe(step)
                planner.sure(step.sure)
                stats.record(step)
                stats.draft_passes = self.drafter.forward_passes - draft_passes_before
                if (yield from self._emit(step, stop, stats)):
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
            stats.graphs_off = self.graphs_off

    def _draft(self, plan: Plan, tokens: Tensor, params: SamplingParams,
               generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        """The plan's drafts [k] on the target's device and their q (None: one-hot)."""
        if plan.drafter is None:
            return tokens.new_empty(0), None
        drafts, q = plan.drafter.propose(tokens, plan.k, params, generator, plan.stop_below)
        return drafts.to(self.device, non_blocking=True), q

    def _verify(self, planner: Planner, plan: Plan, pending: Tensor, drafts: Tensor,
                q: Tensor | None, params: SamplingParams, generator: torch.Generator
                ) -> _Verdict:
        """The step's verify pass over [pending, drafts] (on the device) and its verdict. Its
        one fork: a chain, or, where the planner finds the draft's next guesses worth their
        rows, a token tree (core/tree.py) whose kept branch the decoder then keeps."""
        tree = self._grow(planner, plan, pending, drafts, q)
        if tree is None:
            logits = self._decoder.logits(torch.cat([pending, drafts]), drafts.shape[0] + 1)
            return self._chain(logits, drafts, q, params, generator, planner.reads_confidence)
        logits = self._decoder.tree_logits(tree.tokens, tree.parents)
        return self._walk(logits, tree, q, params, generator, planner.reads_confidence)

    def _chain(self, logits: Tensor, drafts: Tensor, q: Tensor | None, params: SamplingParams,
               generator: torch.Generator, sure: bool) -> _Verdict:
        """A chain's verdict: how many drafts the target keeps, its own token after them, and
        how sure it was of the step's first position (its top probability, which the planner
        reads as the odds of a draft model's guesses; `sure`: the planner reads it), all on
        the device."""
        if params.greedy:
            n, token = greedy_accept(logits, drafts)
            return _Verdict(n, token, _top(logits[0], sure), drafts)
        p = probs_from_logits(logits, params)
        n, token = rejection_accept(p, _draft_probs(q, drafts, p.shape[-1]), drafts, generator)
        return _Verdict(n, token, p[0].max(), drafts)

    def _grow(self, planner: Planner, plan: Plan, pending: Tensor, drafts: Tensor,
              q: Tensor | None) -> Tree | None:
        """The step's token tree, where the planner finds branches worth their rows and the
        decoder verifies trees; else None (a chain). The drafter's q ranks the branches: their
        scores as the drafter read them with its drafts, or read here."""
        if (q is None or not drafts.numel() or not self._trees()
                or not plan.drafter.branches):
            return None
        offer = plan.drafter.read_branches
        if offer is None:
            scores, alternatives = branch_scores(q.to(drafts.device), drafts)
            offer = (scores.cpu(), alternatives.cpu())
        chosen = planner.branches(*offer, drafts.shape[0])
        return build(pending, drafts, chosen) if chosen else None

    def _trees(self) -> bool:
        """Whether steps may verify token trees: asked for, and a decoder that verifies them."""
        return self.tree and self._decoder.verifies_trees

    def _walk(self, logits: Tensor, tree: Tree, q: Tensor | None, params: SamplingParams,
              generator: torch.Generator, sure: bool) -> _Verdict:
        """A tree's verdict, on the device: its kept branch's leaf (the host reads it with the
        rest of the verdict, and finds the branch from the tree's shape), the branch's tokens,
        the target's token after it, its top probability at the root."""
        if params.greedy:
            _, leaf, token = tree_greedy_accept(logits, tree.parents, tree.tokens)
        else:
            p = probs_from_logits(logits, params)
            leaf, token = rejection_walk(p, _draft_probs(q, tree.tokens, p.shape[-1]), tree,
                                         generator)
        at = torch.as_tensor(leaf).view(1).to(self.device, non_blocking=True)
        branch = tree.tokens.index_select(0, _on(tree.branches(), at)[0])
        return _Verdict(_on(tree.depths(), at)[0], token, _top(logits[0], sure), branch,
                        tree, leaf=at[0])

    def _settle(self, verdict: _Verdict, plan: Plan, drafted: int, marks: Sequence = ()
                ) -> Step:
        """The step, its verdict read on the host in one transfer (its one sync with the
        device): the kept tokens' ids and the target's top probability (carried in the same
        integer transfer in units of 1/SURE_SCALE); then the times between the `marks` (start,
        drafted, verified; none for the prompt's pass), which that sync has passed."""
        n = verdict.kept.view(1)
        leaf = verdict.leaf.view(1) if verdict.leaf is not None else n  # a chain's: unread
        sure = (verdict.sure * SURE_SCALE).round().long().view(1)
        values = torch.cat([n, leaf, verdict.drafts, verdict.token.view(1), sure]).tolist()
        kept = values[0]
        ids = tuple(values[2 : 2 + kept] + values[-2:-1])
        path = tuple(verdict.tree.path(values[1])) if verdict.tree is not None else ()
        # Where a tree's branch leaves the chain: the kept drafts that are the chain's own.
        chain = next((i for i, node in enumerate(path) if node != i + 1), kept)
        seconds = self._clock.seconds
        draft_s, verify_s = (seconds(*marks[:2]), seconds(*marks[1:])) if marks else (0.0, 0.0)
        return Step(
            plan, drafted, kept, draft_s, verify_s, chain=chain, tree=verdict.tree,
            path=path,
            tokens=torch.cat([verdict.drafts[:kept], verdict.token.view(1)]), ids=ids,
            sure=values[-1] / SURE_SCALE)

    def _accept(self, tokens: Tensor, step: Step) -> Tensor:
        """The context with a step's kept tokens; both caches rolled back to hold all of it
        but the newest token (the next pending one): after a tree the decoder first keeps
        the kept branch's entries, and a draft model that holds its own drafts is valid only
        as far as the branch follows its chain."""
        if step.tree is not None:
            self._decoder.keep_branch(list(step.path))
        kept = len(tokens) + len(step.ids) - 1
        self._decoder.crop(kept)
        holds = step.plan.drafter is None or step.plan.drafter.holds_drafts  # a head: none
        self.drafter.rollback(min(kept, len(tokens) + step.chain_kept) if holds else kept)
        return _extended(tokens, step)

    def _room(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """max_new_tokens, cut to what the model's context leaves after the prompt."""
        context_limit = self._context_limit()
        if prompt_tokens + max_new_tokens > context_limit:
            max_new_tokens = context_limit - prompt_tokens
            if max_new_tokens < 1:
                raise ConfigError(
                    f"The prompt ({prompt_tokens} tokens) fills the model's context "
                    f"({context_limit} tokens); shorten it."
                )
        return max_new_tokens

    @staticmethod
    def _emit(step: Step, stop: _Stopper, stats: Stats) -> Generator[Token, None, bool]:
        """Yield a step's tokens (its kept drafts, then the target's own) up to a stop;
        whether generation stopped."""
        last: Origin = "bonus" if step.bonus else "resampled"
        for i, token_id in enumerate(step.ids):
            stats.new_tokens += 1
            yield Token(token_id, "accepted" if i < step.kept else last)
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
        return ids.cpu()

    def _eos_ids(self, eos_token_ids: int | Sequence[int] | None) -> set[int]:
        if eos_token_ids is None:  # the model's generation settings, where it has them
            config = self.target.generation_config  # transformers' and specgen's tree's alike
            eos_token_ids = None if config is None else config.eos_token_id
        return set() if eos_token_ids is None else as_set(eos_token_ids)

    def _generators(self, seed: int | None) -> tuple[torch.Generator, torch.Generator]:
        """One generator per device; seeded for reproducible sampling."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < SEED_LIMIT):
            raise ConfigError(f"seed must be an integer from 0 to {SEED_LIMIT - 1}, got {seed!r}.")
        seed = torch.seed() % SEED_LIMIT if seed is None else seed
        draft_device = self.drafter.device or self.device
        gen_t = torch.Generator(self.device).manual_seed(seed)
        gen_d = torch.Generator(draft_device).manual_seed(seed + 1)
        return gen_t, gen_d

    def _context_limit(self) -> int:
        config = self.target.config.get_text_config()  # a transformers config: may lack it
        return getattr(config, "max_position_embeddings", None) or 1 << 30


class _Clock:
    """Times a step's drafting and verification without waiting for the device: on a GPU,
    events recorded in the stream (read after the step's sync, when both have passed); on a
    CPU, the host's clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


@dataclass(frozen=True)
class _Verdict:
    """Verification's outcome on the device, before the host reads it: `kept` drafts stay,
    then the target's `token`; `sure`, its top probability at the step's first position (0
    where the planner does not read it); `drafts` begins with the kept ones (a chain's
    drafts; a tree's kept branch). A tree's verdict also names the tree and its kept
    branch's deepest node (`leaf`)."""

    kept: Tensor
    token: Tensor
    sure: Tensor
    drafts: Tensor
    tree: Tree | None = None
    leaf: Tensor | None = None


def _top(logits: Tensor, read: bool) -> Tensor:
    """The top probability of logits [V] where it is `read` (a softmax over the vocabulary);
    else 0."""
    return top_probability(logits) if read else logits.new_zeros(())


def _on(table: Tensor, at: Tensor) -> Tensor:
    """The rows `at` (on the device) of a host table, copied there without a wait."""
    return table.to(at.device, non_blocking=True).index_select(0, at)


def _extended(tokens: Tensor, step: Step) -> Tensor:
    """The host's context with a step's tokens, from the ids the host read."""
    return torch.cat([tokens, tokens.new_tensor(step.ids)])


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
