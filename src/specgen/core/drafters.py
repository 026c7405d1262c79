"""Drafters: whatever proposes the K tokens the target verifies.

A drafter answers `propose(tokens, k, params, generator, stop_below)` with up to k token ids
and the distribution each was drawn from (None means one-hot: a deterministic guess, exact
under rejection sampling), and `rollback(n_valid)` when only the first n_valid context tokens
survived verification. `guessers(tokens)` names who could draft the next step, in order of
preference, each with the drafter that drafts for it ({"lookup-3": lookup, "model": model}):
the planner keeps one estimate per guesser, since their costs and acceptance differ, and asks
the one it chose. Prompt lookup names its guess by the length of the n-gram it matched: a
3-gram match is a far better guess than a 1-gram one (in prose a 1-gram match is almost always
there and almost always wrong), so each length learns its own acceptance and K. A drafter that
knows its confidence (`ends_own_drafts`) stops a draft once the draft's probability of its
whole draft falls below `stop_below`, which is part of what it is asked for, as k is.

A drafter that must read context before it guesses (a draft model catching up) may say how
much: `unread(tokens)`, the tokens it would read, and after a propose `catch_up`, the
(tokens, seconds) of that reading when its first forward read CATCH_UP_TOKENS or more. The
planner charges and measures that reading apart from drafting. Drafters that read nothing
of their own (prompt lookup, a head) keep the defaults: nothing unread, nothing read.

Four drafters: a small draft model (ModelDrafter), the target itself with some sub-layers
skipped (SelfDrafter: no second model, no extra weights), prompt lookup (PromptLookupDrafter:
the guess is already in the context, e.g. code being edited; no model, no forward passes),
and lookup together with a model (HybridDrafter: the draft model, or the target itself);
heads on the target itself (EAGLE, EAGLE-3, Medusa) are in head_drafters.py. `make_drafter`
builds one from a profile's `method`.

Every kind inherits `Drafter` (core/base.py), which declares each optional ability with its
default (a kind that has one overrides it): `bind_target(decoder, model)`, which the
generator calls once with the target's decoder (a drafter that drafts with the target's own
weights or cache, or reads its hidden states, takes them there), `holds_drafts`, `branches`,
`unread`, `size`, `catch_up`, `reserve`, `graphs_off`, `device`. The engine and the planner
read them as attributes; whether something passed to the generator is a drafter at all is
whether it is a `Drafter`.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from specgen.choices import CATCH_UP_TOKENS, HEAD_KINDS, METHODS, listing
from specgen.core.base import Drafter
from specgen.core.draws import draw_noise, pick, pick_with, read_once
from specgen.core.sampling import SamplingParams
from specgen.decoding import Decoder, lean_supported, make_decoder
from specgen.decoding.base import DraftModel
from specgen.decoding.cuda import Pick
from specgen.decoding.lean import LEAN_FAMILIES, NO_SKIP, Skip
from specgen.errors import ConfigError, ModelError
from specgen.kernels.gguf import GGUFLinear, GGUFWeight
from specgen.kernels.quantize import QuantLinear
from specgen.models.config import layer_params

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specgen.decoding.llamacpp import LlamaCppDraft
    from specgen.heads.modules import Head

MODEL = "model"  # the draft model's guesser name
SELF = "self"  # the self-speculative drafter's guesser name


def vocab_size(model: PreTrainedModel) -> int:
    return model.config.get_text_config().vocab_size


def check_pair(target: PreTrainedModel, draft: PreTrainedModel | LlamaCppDraft) -> None:
    """Refuse a draft whose vocabulary is not the target's. Sizes may differ a little
    (padded embedding rows, e.g. 151,936 vs 152,064); token ids are compared over the
    shared range. Cross-tokenizer drafting is not supported."""
    v_t = vocab_size(target)
    if isinstance(draft, torch.nn.Module):
        v_d, eos_d = vocab_size(draft), draft.config.get_text_config().eos_token_id
    else:  # a runtime of its own (llama.cpp) says its vocabulary and EOS itself
        v_d, eos_d = draft.vocab_size, draft.eos_token_id
    if min(v_t, v_d) / max(v_t, v_d) < 0.98:
        raise ModelError(
            f"The draft's vocabulary ({v_d:,} tokens) does not match the target's ({v_t:,}): "
            "the draft must use the same tokenizer as the target. Pick a draft model from "
            "the target's family (e.g. a smaller model of the same series)."
        )
    eos_t = target.config.get_text_config().eos_token_id
    if eos_t is not None and eos_d is not None and as_set(eos_t).isdisjoint(as_set(eos_d)):
        raise ModelError(
            f"The draft's end-of-sequence token ({eos_d}) differs from the target's ({eos_t}): "
            "they do not share a tokenizer. Pick a draft model from the target's family."
        )


def as_set(ids: int | Sequence[int]) -> set[int]:
    return {ids} if isinstance(ids, int) else set(ids)


class OutputRows:
    """The first rows of an output layer, called as the layer is: a float layer's weight rows
    (a view), an int8-dyn layer's rows and scales (views), an int4-dyn layer's packed rows (a
    view) with their scales (a copy of those rows' scales, which the kernel reads contiguous),
    or a GGUF layer's first rows of blocks (a view of the file: its rows are independent)."""

    def __init__(self, out: torch.nn.Module, rows: int) -> None:
        if isinstance(out, GGUFLinear):
            w = out.weight
            self.layer, self.weight = GGUFLinear(GGUFWeight(w.data[:rows], w.kind, rows, w.k)), None
        elif isinstance(out, QuantLinear):
            scales = out.scales[:rows] if out.kind == "int8-dyn" else out.scales[:, :rows].contiguous()
            self.layer: torch.nn.Module | None = QuantLinear(
                out.in_features, rows, out.kind, out.group_size, out.weight[:rows], scales, None)
            self.layer.batch_invariant = out.batch_invariant
            self.weight = None
        else:
            self.layer, self.weight = None, out.weight[:rows]

    def __call__(self, hidden: Tensor) -> Tensor:
        if self.layer is not None:
            return self.layer(hidden)
        return torch.nn.functional.linear(hidden, self.weight)


def trimmed_output(model: PreTrainedModel, head_rows: int | None) -> OutputRows | None:
    """The model's output layer cut to its first head_rows rows, or None where it drafts over
    its whole vocabulary: no trim asked, or a layer whose rows cannot be taken apart (int8-wo
    and int4-wo layers are packed by PyTorch as a whole, an int8-dyn layer by fbgemm where
    specgen's int8 kernel cannot be built)."""
    out = model.get_output_embeddings()
    # `bias`: a torch layer's (an output layer of transformers' may have one; torch's Linear
    # has the attribute, a quantized layer of specgen's has none).
    if head_rows is None or head_rows >= vocab_size(model) or getattr(out, "bias", None) is not None:
        return None
    if isinstance(out, QuantLinear):
        apart = (out.kind == "int4-dyn" and out.joined is None
                 or out.kind == "int8-dyn" and out.weight is not None)
        return OutputRows(out, head_rows) if apart else None
    return OutputRows(out, head_rows) if isinstance(out, (torch.nn.Linear, GGUFLinear)) else None


class DecoderLM(DraftModel):
    """A language model drafted with over one of specgen's decoders (TorchDraft, SkippedTarget):
    its length, crop and draft chains. `output`: its output layer cut to its first rows (None:
    the decoder's own); `skip`: the sub-layers its passes leave out."""

    decoder: Decoder
    output: OutputRows | None
    skip: Skip = NO_SKIP

    @property
    def length(self) -> int:
        return self.decoder.length

    def crop(self, length: int) -> None:
        self.decoder.crop(length)

    @property
    def draws_chains(self) -> bool:
        return self.decoder.draws_chains

    def chain(self, first: Tensor, steps: int, pick: Pick, noise: Tensor | None,
              key: Hashable) -> tuple[Tensor, Tensor]:
        """The decoder's draft chain (cuda.py: `chain`), `pick` given logits: the decoder's
        own, or its hidden state through `output`."""
        if self.output is None:
            return self.decoder.chain(first, steps, pick, noise, key, self.skip)
        output = self.output
        return self.decoder.chain(first, steps, lambda out, row: pick(output(out), row), noise,
                                  key, self.skip, head=False)


class TorchDraft(DecoderLM):
    """A transformers causal LM as a draft model: its decoder (the lean one where it can) and
    its output layer, answering `logits(ids)`, `crop(length)`, `reset()` and `length`, as
    llamacpp.LlamaCppDraft does for a GGUF file run by llama.cpp.

    `head_rows` drafts over the first head_rows token ids only (byte-level BPE ids are ranked
    by merge frequency, so these are the common tokens; FR-Spec, Zhao et al. 2025): the
    output layer, a fifth of a small model's weights, shrinks in proportion (a float or an
    int4-dyn layer: trimmed_output). q is then zero on the other ids, which rejection sampling
    handles exactly; only acceptance can suffer."""

    def __init__(self, model: PreTrainedModel, head_rows: int | None = None) -> None:
        self.device = model.device
        self.input_vocab = model.get_input_embeddings().num_embeddings
        self.vocab_size = vocab_size(model)
        self.output = trimmed_output(model, head_rows)
        self.decoder = make_decoder(model)  # made once: it may prepare joined weights
        self.size = layer_params(model.config)  # what reading a token costs, in multiply-adds

    def logits(self, ids: Tensor) -> Tensor:
        """The next token's logits [V] after reading `ids` [T] into the cache."""
        if self.output is None:
            return self.decoder.logits(ids)[0]
        return self.output(self.decoder.hidden(ids)[0])

    def reset(self) -> None:
        self.decoder.reset()

    def reserve(self, positions: int, widest: int = 1) -> None:
        self.decoder.reserve(positions, widest)

    @property
    def graphs_off(self) -> str | None:
        return self.decoder.graphs_off


class ModelDrafter(Drafter):
    """A small causal LM that drafts autoregressively with its own KV cache: a transformers
    model (TorchDraft) or a GGUF file run by llama.cpp (llamacpp.LlamaCppDraft).

    Its cache lags the context: after proposing d1..dK it holds d1..d(K-1) but not dK, and
    after a plain step it has not seen the newest tokens. `propose` feeds whatever is
    missing in one forward, so catching up never costs an extra pass. The prompt is read the
    same way, when first asked to draft: an answer that never drafts never pays for it.

    `window` (0: none) bounds that reading: with more than `window` tokens unread, the draft
    forgets what it holds and reads `first` tokens from the context's start (by default a
    quarter of the window: the system prompt and the instruction) and the rest from its
    end, as if the context were those two parts joined; the `skipped` tokens between them
    are never read. The draft's context is not the guarantee (only the target's is): a
    shorter one can only make its guesses worse.

    A draft ends early, after the token that brings it below either of two limits: the
    draft's probability of that token under `confidence` (a fixed cut-off, as transformers'
    assisted generation has), or its probability of the whole draft so far under the
    `stop_below` of a `propose` call (adaptive K's estimate of where drafting stops paying).
    Later guesses are unlikely to survive and would only cost draft passes. The stop depends
    on the draft's outputs alone, never on the target's, so every position is still either
    verified by rejection sampling or drawn by the target: the output distribution is
    unchanged.

    `model` None: the language model is given later (SelfDrafter's, by `bind_target`)."""

    ends_own_drafts = True
    # Its q (returned with greedy drafts too: the softmax of its logits) ranks the
    # next-likeliest tokens a token tree may branch to (core/tree.py).
    branches = True
    # Its cache holds its own drafts (the Drafter default, holds_drafts).

    def __init__(self, model: PreTrainedModel | LlamaCppDraft | None, vocab_size: int,
                 head_rows: int | None = None, confidence: float = 0.0, window: int = 0,
                 first: int | None = None) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ConfigError(f"The draft's window must be an integer >= 0 (0: the whole "
                              f"context), got {window!r}.")
        first = window // 4 if first is None else first
        if not 0 <= first < max(window, 1):
            raise ConfigError(f"The draft window's first part must be from 0 to the window less "
                              f"one ({window - 1}) tokens, got {first!r}.")
        self.confidence = confidence
        # The GPU's way (core/draws.py): the stop rule on the device, the drafts read once,
        # with their branch scores where the target verifies trees (bind_target). None: on
        # a CUDA device, decided when its language model is known.
        self.stop_on_device: bool | None = None
        self.scores_branches = False
        self.window, self.first = window, first
        # The draft's cache holds the context's first `skip_at` tokens, then (after `skipped`
        # tokens it never read) the rest; skipped > 0 only while it holds all of the first.
        self.skip_at = self.skipped = 0
        self._passes = 0
        self.catch_up = (0, 0.0)  # the last propose's reading: (tokens, seconds)
        self.lm: DraftModel | None = None
        self.vocab_size = 0
        if model is not None:
            lm = TorchDraft(model, head_rows) if isinstance(model, torch.nn.Module) else model
            self._use(lm, vocab_size)

    def _use(self, lm: DraftModel, vocab_size: int) -> None:
        """Draft with the language model `lm`."""
        self.lm, self.size = lm, lm.size
        if self.stop_on_device is None:
            self.stop_on_device = lm.device.type == "cuda"
        # Draft tokens must be ids the target knows; the draft may have extra rows.
        self.vocab_size = min(vocab_size, lm.vocab_size)

    @property
    def device(self) -> torch.device:
        return self.lm.device if self.lm is not None else torch.device("cpu")

    def bind_target(self, decoder: Decoder, model: PreTrainedModel) -> None:
        self.scores_branches = decoder.verifies_trees

    def reset(self) -> None:
        self.lm.reset()
        self.skip_at = self.skipped = 0
        self._passes = 0

    def reserve(self, positions: int, widest: int = 1) -> None:
        """Room for a generation of `positions` in the draft's cache, before its first pass
        (a draft that never drafts reserves nothing it would not have grown to)."""
        self.lm.reserve(positions, widest)

    @property
    def graphs_off(self) -> str | None:
        """The draft decoder's line if it gave up on CUDA graphs (decoding/cuda.py)."""
        return self.lm.graphs_off

    @property
    def forward_passes(self) -> int:
        return self._passes

    def unread(self, tokens: Tensor) -> int:
        """Tokens of `tokens` the draft would read in its next forward."""
        unread = len(tokens) - self.skipped - self.lm.length
        return min(unread, self.window) if self.window else unread

    def _missing(self, tokens: Tensor) -> Tensor:
        if self.window and len(tokens) - self.skipped - self.lm.length > self.window:
            self.lm.reset()  # start over on the window: its first part and its tail
            self.skip_at, self.skipped = self.first, len(tokens) - self.window
            missing = torch.cat([tokens[: self.first], tokens[self.first + self.skipped:]])
        else:
            missing = tokens[self.skipped + self.lm.length:]
        # Ids past the draft's embedding rows (a target with a larger vocabulary) are
        # clamped: that only worsens the guess, never the output's exactness.
        # From the host's context: copied without waiting for the device.
        return missing.to(self.device, non_blocking=True).clamp_max(self.lm.input_vocab - 1)

    def _logits(self, ids: Tensor) -> Tensor:
        return self.lm.logits(ids)[: self.vocab_size]

    def guessers(self, tokens: Tensor) -> dict[str, Drafter]:
        return {MODEL: self}

    @torch.no_grad()  # when called outside the engine's inference mode, as tests do
    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
        stop_below: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        self.read_branches = None
        self.catch_up = (0, 0.0)
        if k < 1:
            return tokens.new_empty(0), None
        pending = self._missing(tokens)
        reading = pending.numel() >= CATCH_UP_TOKENS
        start = self._mark() if reading else None
        logits = self._logits(pending)
        self._passes += 1
        end = self._mark() if reading else None
        if self.stop_on_device:
            drafts, qs = self._draw(logits, k, params, generator)
            n, self.read_branches = read_once(drafts, qs, self.confidence, stop_below,
                                              self.scores_branches)
            self.lm.crop(self.lm.length - (k - n))  # as if the draft had stopped there
            drafts, qs = drafts[:n], qs[:n]
        else:
            drafts, qs = self._draw_and_stop(logits, k, params, generator, stop_below)
        if reading:  # the marks have passed: the read above (or the stop rule's) waited
            self.catch_up = (pending.numel(), self._seconds(start, end))
        return drafts, qs

    def _draw(self, logits: Tensor, k: int, params: SamplingParams,
              generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """k drafts [k] and their q [k, V] drawn on the device from the first one's `logits`
        without a read: k - 1 more passes, each reading the draft before."""
        token, q = pick(logits, params, generator)
        if k > 1 and self.lm.draws_chains:  # the k - 1 passes as one graph
            noise = None if params.greedy else draw_noise(k - 1, q, generator)
            ids, qs = self.lm.chain(token.view(1), k - 1, self._chain_pick(params), noise, params)
            self._passes += k - 1
            return torch.cat([token.view(1), ids]), torch.cat([q[None], qs])
        ids, qs = [token], [q]
        for _ in range(k - 1):
            token, q = pick(self._logits(token[None]), params, generator)
            self._passes += 1
            ids.append(token)
            qs.append(q)
        return torch.stack(ids), torch.stack(qs)

    def _chain_pick(self, params: SamplingParams) -> Pick:
        """`pick` as a chain's graph draws: from the logits cut to the drafts' vocabulary, with
        the noise drawn before the replay (`draw_noise`)."""
        return lambda logits, noise: pick_with(logits[: self.vocab_size], params, noise)

    def _draw_and_stop(self, logits: Tensor, k: int, params: SamplingParams,
                       generator: torch.Generator | None, stop_below: float
                       ) -> tuple[Tensor, Tensor]:
        """Drafts drawn one at a time from the first one's `logits`, each token's
        probability read as it is drawn (only where a draft may stop), stopping at once."""
        ids, qs = [], []
        sure = 1.0  # the draft's probability of its whole draft so far
        for i in range(k):
            if i:
                logits = self._logits(ids[-1][None])
                self._passes += 1
            token, q = pick(logits, params, generator)
            qs.append(q)
            ids.append(token)
            if self.confidence or stop_below:  # a host read: only where a draft may stop
                p = float(q[token])
                sure *= p
                if p < self.confidence or sure < stop_below:
                    break
        return torch.stack(ids), torch.stack(qs)

    def _mark(self) -> float | torch.cuda.Event:
        """Now, without waiting for the device: an event in its stream on a GPU."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, start, end) -> float:
        """Between two marks, once the device has passed both."""
        if self.device.type != "cuda":
            return end - start
        if not end.query():  # passed already where the draft read its drafts
            end.synchronize()
        return start.elapsed_time(end) / 1e3

    def rollback(self, n_valid: int) -> None:
        if self.skipped and n_valid < self.skip_at + self.skipped:
            # The context now ends before the window's tail: keep what is a prefix of it.
            self.lm.crop(min(n_valid, self.skip_at))
            self.skip_at = self.skipped = 0
        else:
            self.lm.crop(n_valid - self.skipped)


def default_skip(layers: int) -> Skip:
    """The skip set of a target with no tuned or pinned one: the MLP of every other layer in
    the middle half of the layers (MLPs hold most of a layer's weights; the first and last
    layers matter most to the output)."""
    return Skip(frozenset(), frozenset(range(layers // 4, layers - layers // 4, 2)))


def num_layers(model: PreTrainedModel) -> int:
    return model.config.get_text_config().num_hidden_layers


def check_skip(skip: Skip, layers: int) -> None:
    """Refuse a skip set naming layers the model lacks, or leaving nothing to run."""
    for kind, indices in (("attention", skip.attention), ("MLP", skip.mlp)):
        missing = sorted(i for i in indices if not 0 <= i < layers)
        if missing:
            raise ConfigError(
                f"The skip set names the {kind} of layer {missing[0]}, but the target has "
                f"{layers} layers (0 to {layers - 1}). Fix speculation.skip_layers, or run "
                "`specgen tune` for this target.")
    if len(skip.attention) + len(skip.mlp) == 2 * layers:
        raise ConfigError("The skip set skips every layer of the target, which leaves nothing to "
                          "draft with. Skip fewer sub-layers (a third to a half is typical).")
    if not skip.attention and not skip.mlp:
        raise ConfigError("The skip set skips nothing, so each draft pass would cost a whole "
                          "target pass. Name some sub-layers to skip, or leave the set out for "
                          "the tuned or default one.")


def check_self_target(model: PreTrainedModel, decoder: Decoder) -> None:
    """Refuse a target the self drafter cannot run: one outside the Llama family, or one
    whose decoder cannot skip sub-layers (transformers' forward)."""
    kind = model.config.get_text_config().model_type
    if kind not in LEAN_FAMILIES:
        raise ConfigError(
            f"Self-speculative drafting (method \"self\") supports Llama-family targets "
            f"({listing(LEAN_FAMILIES)}); this target is {kind!r}. Use method = "
            "\"prompt-lookup\", or a draft model (method = \"draft-model\").")
    if not lean_supported(model):
        raise ConfigError(
            "Self-speculative drafting (method \"self\") needs full causal attention; this "
            "target uses sliding-window attention. Use method = \"prompt-lookup\" or a draft model.")
    if not decoder.skips:
        raise ConfigError(
            "Self-speculative drafting (method \"self\") runs the target through specgen's lean "
            "decoder, which serves a target on the CPU in float32 or bfloat16 (with specgen's C "
            "kernels: an x86 CPU with AVX2 and gcc), int8-dyn or int4-dyn, or its CUDA decoder "
            "(one GPU); this target runs transformers' forward instead. Change target.quantization or the device, or use "
            "method = \"prompt-lookup\" or a draft model.")


class SkippedTarget(DecoderLM):
    """The target run through its own decoder with a set of sub-layers skipped, as the
    language model ModelDrafter drafts with (`logits`, `length`).

    It holds no weights and no cache of its own: it reads the target's KV cache for the
    context (the target's entries, from its full passes) and writes entries for the
    positions it drafts, of the layers it runs, into the same cache. SelfDrafter rolls those
    back after each draft, so that the verify pass writes every position again with every
    layer; the rest of the cache's life is the generator's."""

    def __init__(self, decoder: Decoder, model: PreTrainedModel, skip: Skip,
                 head_rows: int | None = None) -> None:
        self.decoder, self.skip = decoder, skip
        self.device = model.device
        self.input_vocab = model.get_input_embeddings().num_embeddings
        self.vocab_size = vocab_size(model)
        self.output = trimmed_output(model, head_rows)

    def logits(self, ids: Tensor) -> Tensor:
        """The next token's logits [V] after reading `ids` [T] with the skipped layers."""
        if self.output is None:
            return self.decoder.logits(ids, 1, skip=self.skip)[0]
        return self.output(self.decoder.hidden(ids, 1, skip=self.skip)[0])

    def reset(self) -> None:
        self.decoder.reset()


class SelfDrafter(ModelDrafter):
    """Self-speculative drafting: the target drafts for itself with some attention and MLP
    sub-layers skipped (Draft & Verify, Zhang et al. 2023), ending with its own final norm
    and output layer. No second model, no extra weights, no cache of its own.

    Bound to the target by `bind_target` (the generator calls it), it drafts over the
    target's KV cache: the context's entries are the target's own, and the entries its draft
    passes write (for the layers they run) are dropped when the draft ends, so the verify
    pass overwrites every drafted position; rollback stays a length. Drafting and stopping
    are the draft model's (ModelDrafter): q is the skipped model's distribution, and a draft
    ends itself below `confidence` or `stop_below`.

    `skip` None: `default_skip` for the target."""

    # The target's decoder says its own line (the engine reads it); the skipped passes run
    # on it.
    graphs_off = None

    def __init__(self, skip: Skip | None = None, head_rows: int | None = None,
                 confidence: float = 0.0) -> None:
        # No model yet (bound to the target by bind_target), and no window: the target's
        # cache holds the whole context.
        super().__init__(None, 0, head_rows, confidence)
        self.skip, self.head_rows = skip, head_rows

    def bind_target(self, decoder: Decoder, model: PreTrainedModel) -> None:
        super().bind_target(decoder, model)
        check_self_target(model, decoder)
        skip = self.skip if self.skip is not None else default_skip(num_layers(model))
        check_skip(skip, num_layers(model))
        lm = SkippedTarget(decoder, model, skip, self.head_rows)
        self._use(lm, lm.vocab_size)

    def reserve(self, positions: int, widest: int = 1) -> None:
        pass  # the cache is the target's, reserved by the generator

    def guessers(self, tokens: Tensor) -> dict[str, Drafter]:
        return {SELF: self}

    def reset(self) -> None:
        self._passes = 0  # the cache is the target's: the generator resets it

    def rollback(self, n_valid: int) -> None:
        pass  # the generator rolls the target's cache back; the draft's entries are gone

    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
        stop_below: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        if self.lm is None:
            raise ConfigError("A self drafter drafts with its target's own layers: hand it to a "
                              "SpeculativeGenerator, which binds it to the target, first.")
        start = self.lm.length
        try:
            return super().propose(tokens, k, params, generator, stop_below)
        finally:
            # Forget the draft's entries: positions from `start` on were written by passes
            # that skipped layers, and the verify pass must write all of them again.
            self.lm.crop(start)


def ngram_match(tokens: Tensor, max_ngram: int, min_ngram: int = 1) -> tuple[int, int]:
    """The longest n-gram (max_ngram >= n >= min_ngram) ending `tokens` [T] that also occurs
    earlier, at its most recent earlier occurrence: (n, index just past that occurrence),
    or (0, 0) when there is none. One vectorised pass over the context, whatever max_ngram:
    row j compares the token j places before each candidate end with the one j places
    before the context's end, and a cumulative product turns the rows into match lengths."""
    # The engine's context is the host's: matching it waits for no device.
    t = (tokens if tokens.device.type == "cpu" else tokens.cpu()).numpy()
    n_ends = t.shape[0] - 1  # candidate occurrence ends 0..T-2 (T-1 is the tail itself)
    if n_ends < min_ngram:
        return 0, 0
    equal = np.zeros((max_ngram, n_ends), dtype=np.int64)
    for j in range(min(max_ngram, n_ends)):
        equal[j, j:] = t[: n_ends - j] == t[n_ends - j]
    length = equal.cumprod(0).sum(0)  # [T-1] match length ending at each position
    # Longest first, then most recent: rank by length, break ties by position.
    n, end = divmod(int((length * n_ends + np.arange(n_ends)).max()), n_ends)
    return (n, end + 1) if n >= min_ngram else (0, 0)


class PromptLookupDrafter(Drafter):
    """Proposes what followed the most recent earlier occurrence of the context's tail
    (prompt lookup decoding, Saxena 2023). Deterministic, so q is one-hot (None); it runs
    no model, so it holds no state to roll back and costs no forward passes."""

    ends_own_drafts = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not isinstance(min_ngram, int) or not isinstance(max_ngram, int) or not (
            1 <= min_ngram <= max_ngram
        ):
            raise ConfigError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram!r}, "
                f"max_ngram={max_ngram!r}. Try max_ngram = 3, min_ngram = 1."
            )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.matches = 0  # proposals made (steps with a match)
        self._last: tuple[Tensor, tuple[int, int]] | None = None  # a hybrid asks twice a step

    def reset(self) -> None:
        self.matches, self._last = 0, None

    def guessers(self, tokens: Tensor) -> dict[str, Drafter]:
        n = self.match(tokens)[0]
        return {f"lookup-{n}": self} if n else {}

    def match(self, tokens: Tensor) -> tuple[int, int]:
        """`ngram_match` on the context, remembered for the same context tensor."""
        if self._last is None or self._last[0] is not tokens:
            self._last = (tokens, ngram_match(tokens, self.max_ngram, self.min_ngram))
        return self._last[1]

    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
        stop_below: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        if k < 1:
            return tokens.new_empty(0), None
        n, start = self.match(tokens)
        if n == 0:
            return tokens.new_empty(0), None
        self.matches += 1
        return tokens[start : start + k], None  # shorter when the context ends first


class HybridDrafter(Drafter):
    """Prompt lookup when the context has a match, a model otherwise: the draft model, or the
    target itself with layers skipped (SelfDrafter). With adaptive
    K each guesser (the model, lookup at each match length) has its own estimate and each step
    goes to the best expected rate: the model drafts where lookup's matches are short and
    wrong (prose), lookup drafts long where its guesses hold (edits).

    The model drafter skips the steps lookup drafts, so its cache falls behind the context;
    its next `propose` feeds every missing token in one forward (ModelDrafter catches up
    lazily), and `rollback` crops it only where it ran ahead. Each step's q is either None
    (lookup, one-hot) or the model's, never a mix."""

    ends_own_drafts = True  # when the model drafts: a direct `propose` may reach it

    # The model drafter's own: its device, its decoder's graphs, its passes.
    device = property(lambda self: self.model_drafter.device)
    graphs_off = property(lambda self: self.model_drafter.graphs_off)
    forward_passes = property(lambda self: self.model_drafter.forward_passes)

    def __init__(self, model_drafter: ModelDrafter, lookup_drafter: PromptLookupDrafter) -> None:
        self.model_drafter, self.lookup_drafter = model_drafter, lookup_drafter

    def bind_target(self, decoder: Decoder, model: PreTrainedModel) -> None:
        self.model_drafter.bind_target(decoder, model)

    def reset(self) -> None:
        self.model_drafter.reset()
        self.lookup_drafter.reset()

    def reserve(self, positions: int, widest: int = 1) -> None:
        self.model_drafter.reserve(positions, widest)

    def guessers(self, tokens: Tensor) -> dict[str, Drafter]:
        return {**self.lookup_drafter.guessers(tokens), **self.model_drafter.guessers(tokens)}

    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
        stop_below: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        """Lookup when the context has a match, else the model (a caller that plans asks the
        guesser it chose instead: `guessers`)."""
        ids, q = self.lookup_drafter.propose(tokens, k, params, generator)
        if ids.numel() or k < 1:
            return ids, q
        return self.model_drafter.propose(tokens, k, params, generator, stop_below)

    def rollback(self, n_valid: int) -> None:
        self.model_drafter.rollback(n_valid)
        self.lookup_drafter.rollback(n_valid)


def make_drafter(
    method: str,
    draft_model: PreTrainedModel | LlamaCppDraft | None,
    target_vocab: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
    head_rows: int | None = None,
    confidence: float = 0.0,
    skip: Skip | None = None,
    head: Head | None = None,
    window: int = 0,
) -> Drafter:
    """The drafter for a profile's `method`. `draft-model` needs a draft model; `hybrid`
    drafts with it where there is one, else with the target itself (self); a head method
    (HEAD_KINDS) needs a head of its kind (heads/); the others ignore both. `skip`: the self
    drafter's skip set (None: default_skip). Pairing checks (same tokenizer as the target)
    are the caller's: check_pair."""
    if method not in METHODS:
        raise ConfigError(f"Unknown drafting method {method!r}; choose {listing(METHODS)}.")
    if method in HEAD_KINDS:
        if head is None or head.kind != method:
            have = f"a {head.kind} head" if head is not None else "none"
            raise ConfigError(
                f"method {method!r} drafts with a {method} head, and the profile has {have}: set "
                f"[draft] head = \"...\" and kind = \"{method}\" (docs/heads.md).")
        from specgen.core.head_drafters import make_head_drafter

        return make_head_drafter(head, target_vocab, head_rows, confidence)
    if method == "prompt-lookup":
        return PromptLookupDrafter(max_ngram, min_ngram)
    if method == "self" or (method == "hybrid" and draft_model is None):
        drafter: ModelDrafter = SelfDrafter(skip, head_rows, confidence)
    elif draft_model is None:
        raise ConfigError(
            f"method {method!r} needs a draft model; set one in the profile, or use "
            "method = \"self\" or \"prompt-lookup\", which need none."
        )
    else:
        drafter = ModelDrafter(draft_model, target_vocab, head_rows, confidence, window)
    if method == "hybrid":
        return HybridDrafter(drafter, PromptLookupDrafter(max_ngram, min_ngram))
    return drafter
