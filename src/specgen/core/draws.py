"""A draft's tokens drawn on the device and read by the host once (the GPU's way), for the
drafters that draw their drafts one at a time (core/drafters.py: a draft model, the target
with layers skipped; core/head_drafters.py: EAGLE and Medusa heads).

On a CPU a read costs nothing, and a drafter reads each token's probability as it draws it,
stopping the draft at once. On a GPU each read waits for the device: there a drafter draws
all k tokens without a read, then applies the same stop rule on the device (`kept_drafts`)
and reads how many it keeps, with their branch scores where a token tree may use them, in one
transfer (`read_once`). The drafts kept are the host's rule's, token for token."""

from __future__ import annotations

import torch
from torch import Tensor

from specgen.core.sampling import SamplingParams, probs_from_logits, sample
from specgen.core.tree import branch_scores


def pick(logits: Tensor, params: SamplingParams, generator: torch.Generator | None
         ) -> tuple[Tensor, Tensor]:
    """A draft token from `logits` [V] and the q it was drawn from (greedy: the softmax of the
    logits, which ranks a tree's branches), on the device."""
    if params.greedy:
        return logits.argmax(-1), torch.softmax(logits.float(), -1)
    q = probs_from_logits(logits, params)
    return sample(q, generator), q


def pick_with(logits: Tensor, params: SamplingParams, noise: Tensor | None
              ) -> tuple[Tensor, Tensor]:
    """`pick` with the exponential noise of a sampled draw given (`draw_noise`'s row; None
    for greedy): what a graph replays, since it draws from no generator of its own."""
    if noise is None:
        return logits.argmax(-1), torch.softmax(logits.float(), -1)
    q = probs_from_logits(logits, params)
    return (q / noise).argmax(-1), q


def draw_noise(steps: int, like: Tensor, generator: torch.Generator | None) -> Tensor:
    """The noise of `steps` sampled draws of q like `like` [V], drawn from `generator` one
    draw at a time in order, as `sample` draws each: [steps, V]."""
    noise = like.new_empty(steps, like.shape[-1])
    for row in noise:
        row.exponential_(1.0, generator=generator)
    return noise


def kept_drafts(p: Tensor, confidence: float, stop_below: float) -> Tensor:
    """How many of k drafts a draft keeps, on the device [0-dim]: up to and including the first
    whose own probability p_i is below `confidence` or after which the draft's probability of
    its whole draft, p_1 * ... * p_i, is below `stop_below`; all k where none is. The product
    is taken in float64 one factor at a time, as the host's rule takes it in Python floats, so
    both stop at the same token."""
    p = p.double()
    sure, stops = p.new_ones(()), []
    for i in range(p.shape[0]):
        sure = sure * p[i]
        stops.append((p[i] < confidence) | (sure < stop_below))
    stopped = torch.stack([*stops, p.new_ones((), dtype=torch.bool)])
    return (stopped.long().argmax() + 1).clamp_max(p.shape[0])


def read_once(drafts: Tensor, qs: Tensor, confidence: float, stop_below: float, branches: bool
              ) -> tuple[int, tuple[Tensor, Tensor] | None]:
    """The number of `drafts` [k] (drawn from qs [k, V]) the stop rule keeps and, where
    `branches`, the kept drafts' branch scores (tree.branch_scores, on the host), in one read
    of the device; no read where there is nothing to read (no stop rule, no tree)."""
    k = drafts.shape[0]
    if not (confidence or stop_below or branches):
        return k, None
    n = kept_drafts(qs.gather(1, drafts[:, None])[:, 0], confidence, stop_below)
    if not branches:
        return int(n), None
    scores, alternatives = branch_scores(qs, drafts)
    # float64 carries the scores (float32) and the ids (below 2**53) exactly
    values = torch.cat([n.double().view(1), scores.double().flatten(),
                        alternatives.double().flatten()]).cpu().numpy()
    kept, width = int(values[0]), scores.numel()
    shape = scores.shape
    read = (torch.from_numpy(values[1 : 1 + width].astype("float32")).view(shape)[:kept],
            torch.from_numpy(values[1 + width :].astype("int64")).view(shape)[:kept])
    return kept, read
