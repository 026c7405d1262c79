"""Token trees: more than one guess per position, verified in one target pass.

A chain of K drafts is verified in one pass over K+1 rows; where the target rejects draft j
the step ends there. A tree adds, beside draft j, the draft model's next-likeliest tokens at
that position (its *branches*): the same pass also scores each branch, and where the target's
token is one of them the step keeps it and the target's token after it, one token more than
the chain. A branch is worth what the draft model says reaching it is worth: the chance the
chain survives to its depth times the draft's probability of the branch (EAGLE-2's ranking of
tree nodes by their path probability), and it costs one more row in the verify pass.

Layout. Node 0 is the pending token (the root); node j >= 1 holds a draft token whose parent
is parents[j] < j. Nodes are in depth-first preorder (every subtree is a contiguous run of
nodes), which is what lets a decoder verify a tree with its chain kernels: a run of nodes
each the child of the one before is a chain *segment*, and when segments are computed in
order, the cache slots below a segment's depth hold exactly its ancestors (decoding/lean.py:
`segments`, `LeanDecoder.tree_logits`). The chain's nodes are 1..K (node j at depth j);
branches follow, deepest first.

Sampling stays exact: at each node its children are tried in order by recursive rejection
(sampling.multi_rejection_accept), the chain's child against the draft's distribution it was
drawn from and each branch, a token chosen deterministically given the step so far, against
a one-hot distribution on itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specgen.core.sampling import multi_rejection_accept, sample

# Candidates per position a branch is chosen from (the chain's token excluded).
BRANCHES_PER_DEPTH = 3


@dataclass(frozen=True)
class Tree:
    """A token tree in preorder. tokens [N] (on the target's device), parents (host, -1 at
    the root), and per node the row of q its token was drawn from (the chain's nodes), or -1
    for a branch (a one-hot proposal)."""

    tokens: Tensor
    parents: tuple[int, ...]
    drawn_from: tuple[int, ...]

    @property
    def rows(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [j for j, parent in enumerate(self.parents) if parent == node]

    def path(self, leaf: int) -> list[int]:
        """The nodes from the root's first child down to `leaf` (empty for the root)."""
        nodes, leaf = [], int(leaf)  # a walk's 0-dim tensor, read
        while leaf > 0:
            nodes.append(leaf)
            leaf = self.parents[leaf]
        return nodes[::-1]

    def depths(self) -> Tensor:
        """Each node's depth (the root's 0) [N], on the host: the tree's shape is the host's."""
        return torch.tensor([len(self.path(j)) for j in range(self.rows)])

    def branches(self) -> Tensor:
        """Each node's `path`, padded with the root to the tree's depth [N, depth], on the
        host: the device finds a kept branch's tokens from its leaf without the host."""
        paths = [self.path(j) for j in range(self.rows)]
        depth = max(map(len, paths))
        return torch.tensor([path + [0] * (depth - len(path)) for path in paths])


def reach(q: Tensor, drafts: Tensor) -> Tensor:
    """The draft's probability of reaching each depth of its chain: reach[j] is the product
    of q_i(d_i) for i < j, so reach[0] = 1. q [K, V], drafts [K] -> [K]."""
    kept = q.gather(1, drafts[:, None])[:, 0].float()
    return torch.cat([kept.new_ones(1), kept[:-1]]).cumprod(0)


def branch_scores(q: Tensor, drafts: Tensor, per_depth: int = BRANCHES_PER_DEPTH
                  ) -> tuple[Tensor, Tensor]:
    """The best `per_depth` alternatives to each chain draft and their worth: reach times the
    draft's probability of the alternative, the chance (by the draft's own odds) that the
    target's token at that position is this branch. q [K, V] -> (scores, tokens), [K, per_depth]
    each; the chain's own token scores 0."""
    top = min(per_depth + 1, q.shape[-1])
    probs, tokens = q.float().topk(top, -1)
    probs = probs.masked_fill(tokens == drafts[:, None], 0.0)
    scores, order = (probs * reach(q, drafts)[:, None]).sort(-1, descending=True)
    return scores[:, :per_depth], tokens.gather(1, order)[:, :per_depth]


def choose_branches(scores: Tensor, tokens: Tensor, floor: float, budget: int
                    ) -> list[tuple[int, int, float]]:
    """The branches worth their row: those scoring above `floor`, best first, at most
    `budget` of them; as (index into the chain, token, score). scores and tokens are
    branch_scores' as the host read them (numpy: a device's tensor is refused, never waited
    for)."""
    if budget <= 0:
        return []
    flat, ids = scores.numpy().ravel(), tokens.numpy().ravel()
    best = (-flat).argsort(kind="stable")[:budget]
    per_depth = scores.shape[1]
    return [(int(i) // per_depth, int(ids[i]), float(flat[i])) for i in best if flat[i] > floor]


def build(pending: Tensor, drafts: Tensor, branches: Sequence[tuple[int, int]]) -> Tree:
    """The tree of a chain [pending, d1..dK] with `branches` (index i into the chain, token):
    a branch at index i is a sibling of d(i+1), a child of node i. Preorder: the chain, then the
    branches, deepest first (each a leaf, so every subtree stays contiguous)."""
    k = drafts.shape[0]
    extra = sorted(branches, key=lambda b: -b[0])
    parents = (-1, *range(k), *(index for index, _ in extra))
    drawn = (-1, *range(k), *(-1 for _ in extra))
    side = torch.tensor([token for _, token in extra], dtype=drafts.dtype).to(
        drafts.device, non_blocking=True)  # from the host without a wait
    return Tree(torch.cat([pending.view(1), drafts, side]), parents, drawn)


def rejection_walk(p: Tensor, q: Tensor, tree: Tree, generator: torch.Generator | None = None
                   ) -> tuple[Tensor, Tensor]:
    """Exact sampling down a tree: from the root, each node's children are tried by recursive
    rejection against the target's distribution at that node (p [N, V]); an accepted child is
    the next node, and where none is, the token is drawn from what the rejections left (or,
    at a leaf, from p). Each child is tried against the distribution it was drawn from: the
    chain's against q [K, V] (q[i] drew node i + 1), a branch against a one-hot on its own
    token. Returns (the deepest kept node, the token after it), 0-dim tensors on p's device.

    Nothing waits for the host: every node's trial is drawn up front, each with randomness of
    its own (in node order), and the walk follows the outcomes on the device. The nodes it
    visits see independent draws, as one at a time would give them, so the token is
    distributed exactly as the target's; the others' draws are never read."""
    nexts, tokens = [], []
    for node in range(tree.rows):
        children = tree.children(node)
        if not children:  # a leaf: the target's own token after it
            nexts.append(p.new_full((), -1, dtype=torch.long))
            tokens.append(sample(p[node], generator))
            continue
        options = torch.tensor([*children, -1]).to(p.device, non_blocking=True)  # no wait
        candidates = tree.tokens.index_select(0, options[:-1])
        proposals = torch.stack([
            q[tree.drawn_from[c]] if tree.drawn_from[c] >= 0
            else torch.nn.functional.one_hot(tree.tokens[c], p.shape[-1]).to(p.dtype)
            for c in children])
        index, token = multi_rejection_accept(p[node], proposals, candidates, generator)
        nexts.append(options.index_select(0, index.view(1))[0])  # -1: none was kept
        tokens.append(token)
    nexts, tokens = torch.stack(nexts), torch.stack(tokens)
    node = nexts.new_zeros(1)
    for _ in range(max(map(len, map(tree.path, range(tree.rows))))):
        step = nexts.index_select(0, node)
        node = torch.where(step >= 0, step, node)
    return node[0], tokens.index_select(0, node)[0]
