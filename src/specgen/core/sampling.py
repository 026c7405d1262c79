"""The math of speculative decoding as pure tensor functions: no models, no I/O.

Names follow the paper (Leviathan et al. 2023; Chen et al. 2023): p is the target's
distribution, q the draft's, K the number of drafted tokens. Every function here is
tested on its own, and the engine only strings them together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specgen.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ConfigError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature}."
            )
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1] (1 turns it off), got {self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Temperature, then top-k, then top-p over the last dimension; removed tokens get -inf.

    The same warping is applied to target and draft so that p and q are the distributions
    tokens are really drawn from."""
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p; the top token always stays.
        remove_sorted = mass_before >= params.top_p
        remove_sorted[..., 0] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def probs_from_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution a token is sampled from (float32). Greedy gives a one-hot argmax."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp_logits(logits, params).softmax(-1)


def top_probability(logits: Tensor) -> Tensor:
    """How sure a model is at one position: the softmax probability of its likeliest token,
    0-dim, on the logits' device (no host sync). logits [V]."""
    return (logits.max().float() - logits.float().logsumexp(-1)).exp()


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one index per row of `probs` [..., V] -> [...], without a host sync.

    argmax(p / E) with E ~ Exp(1) picks i with probability p_i (the exponential race)."""
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


def residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)): where to resample after a rejection.

    When p == q the residual has no mass; a rejection is then a rounding accident (p/q is
    1 in exact arithmetic), and falling back to p keeps the output distribution p."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-30), p)


def greedy_accept(target_logits: Tensor, draft_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verification on the device: keep drafts while they equal the target's argmax.

    target_logits [K+1, V] (row i scores the position of draft i; row K is the bonus);
    draft_ids [K]. Returns (n accepted, the target's token after them), both 0-dim tensors on
    the logits' device: nothing waits for the device, so the caller reads both with its
    step's one host sync."""
    choices = target_logits.argmax(-1)
    k = draft_ids.shape[0]
    n = (choices[:k] == draft_ids).long().cumprod(0).sum()
    return n, choices.index_select(0, n.view(1))[0]


def greedy_verify(target_logits: Tensor, draft_ids: Tensor) -> tuple[int, Tensor]:
    """`greedy_accept` with n read on the host."""
    n, token = greedy_accept(target_logits, draft_ids)
    return int(n), token


def rejection_accept(
    p: Tensor, q: Tensor, draft_ids: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Modified rejection sampling (Leviathan et al. 2023, Alg. 1), vectorised, on the device.

    p [K+1, V] target distributions, q [K, V] the distributions the drafts were drawn from,
    draft_ids [K]. Draft i is accepted with probability min(1, p(x)/q(x)); at the first
    rejection the token is drawn from norm(max(0, p - q)); if all K pass, a bonus token is
    drawn from p[K]. The emitted tokens are distributed exactly as the target's. Returns
    (n accepted, the token after them) as 0-dim tensors, with no host sync: the row to draw
    from is selected on the device by n."""
    k = draft_ids.shape[0]
    if k == 0:
        return torch.zeros((), dtype=torch.long, device=p.device), sample(p[0], generator)
    rows = torch.arange(k, device=p.device)
    p_x, q_x = p[rows, draft_ids], q[rows, draft_ids]
    u = torch.rand(k, device=p.device, generator=generator)
    accepted = u * q_x < p_x  # u < p/q without dividing by q
    n = accepted.long().cumprod(0).sum()
    p_n = p.index_select(0, n.view(1))[0]  # row n: the first rejected draft's, or the bonus
    q_n = q.index_select(0, n.clamp_max(k - 1).view(1))[0]
    return n, sample(torch.where(n < k, residual(p_n, q_n), p_n), generator)


def rejection_verify(
    p: Tensor, q: Tensor, draft_ids: Tensor, generator: torch.Generator | None = None
) -> tuple[int, Tensor]:
    """`rejection_accept` with n read on the host."""
    n, token = rejection_accept(p, q, draft_ids, generator)
    return int(n), token


def multi_rejection_accept(
    p: Tensor, q: Tensor, candidates: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Recursive rejection sampling over m candidates for one position (SpecInfer's
    multi-step speculative sampling; EAGLE's tree verification, node by node), on the device.

    p [V] the target's distribution; candidates [m] (the children of one tree node), candidate
    i drawn from q_i: q [V] for all alike (independent draws from one q) or [m, V] one per
    candidate, where q_i may depend on the candidates before it (a one-hot on a token chosen
    from them: a tree's branch). Candidate i is tried against p_i, where p_1 = p and each
    rejection leaves p_{i+1} = norm(max(0, p_i - q_i)); it is accepted with probability
    min(1, p_i(x_i) / q_i(x_i)). The first accepted candidate is the token; if all are
    rejected, the token is drawn from p_{m+1}. Each stage is one step of `rejection_accept`,
    whose output is distributed as its p_i whatever q_i it proposes from, so the token is
    distributed exactly as p. The p_i depend on p and the q_i alone, never on the draws, so
    all are computed up front and nothing waits for the host. Returns (index of the accepted
    candidate, or m if none, the token), 0-dim tensors."""
    m = candidates.shape[0]
    if m == 0:
        return torch.zeros((), dtype=torch.long, device=p.device), sample(p, generator)
    qs = q.expand(m, -1) if q.dim() == 1 else q
    stages = [p]
    for i in range(m):
        stages.append(residual(stages[-1], qs[i]))
    ps = torch.stack(stages)  # [m+1, V]: ps[i] is what candidate i (and, at m, the draw) faces
    rows = torch.arange(m, device=p.device)
    u = torch.rand(m, device=p.device, generator=generator)
    accepted = u * qs[rows, candidates] < ps[rows, candidates]
    first = torch.cat([accepted, accepted.new_ones(1)]).long().argmax()  # m where none is
    drawn = sample(ps.index_select(0, first.view(1))[0], generator)
    chosen = candidates.index_select(0, first.clamp_max(m - 1).view(1))[0]
    return first, torch.where(first < m, chosen, drawn)


def tree_greedy_accept(target_logits: Tensor, parents: Sequence[int], tokens: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification of a token tree in one target pass, on the device.

    Node 0 is the pending token (the root); node j >= 1 holds draft token tokens[j], a child
    of parents[j] < j. target_logits [N, V]: row i scores the position after node i along its
    own branch (a tree attention mask gives it exactly that context). A node is kept where
    its token is the target's argmax after its parent and its parent is kept; siblings hold
    different tokens, so the kept nodes form one path. Returns (n accepted: the deepest kept
    node's depth, that node's index, the target's token after it), 0-dim tensors: on a chain
    (parents[j] = j - 1) this is `greedy_accept`. The tree's shape (`parents`) is the host's,
    as built; the tokens stay on the device, and nothing here waits for it."""
    choices = target_logits.argmax(-1)
    n = tokens.shape[0]
    kept = torch.zeros(n, dtype=torch.bool, device=choices.device)
    depth = torch.zeros(n, dtype=torch.long, device=choices.device)
    kept[0] = True
    for j in range(1, n):  # parents come first: one pass settles every node
        parent = parents[j]
        kept[j] = kept[parent] & (tokens[j] == choices[parent])
        depth[j] = depth[parent] + 1
    leaf = torch.where(kept, depth, depth.new_full((), -1)).argmax()
    at = leaf.view(1)  # index_select: indexing by a 0-dim tensor may read it on the host
    return depth.index_select(0, at)[0], leaf, choices.index_select(0, at)[0]
