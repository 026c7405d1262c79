"""The lean decoder's design on a GPU: a Llama-family model's layers called directly over a
static, preallocated KV cache, with the forward of each small width replayed from a CUDA graph.

On a GPU a batch-1 step is bound by the host (Python, transformers' generic forward, hundreds
of kernel launches) long before it is bound by the card, which streams a small model's weights
in a millisecond. A captured graph replays every launch of a pass as one, so the host's cost of
a pass no longer depends on the model's depth. What makes a pass capturable:

- the KV cache is one tensor [layers, 2, 1, kv_heads, capacity, head_dim], allocated before any
  capture and never moved while graphs exist (rollback is a length, as in lean.py);
- the position of the first new token lives on the device (`pos`), so the same graph serves
  every position: rotary angles, cache slots (`index_copy_`) and the attention mask are computed
  from it inside the graph;
- a captured pass attends over the whole capacity with a mask (its shapes never depend on the
  cached length), with the query heads that share a key/value head stacked into one (so that
  CUDA's memory-efficient kernel takes the mask, which it does not with `enable_gqa`).

A decoder that keeps states for a drafting head (`capture_layers`) captures its graphs with
them: a graph's states are static buffers beside its output, copied into `captured` after each
replay, so a head's target passes replay as any other's.

One graph per (width, output rows, head, skip set), all captured when the cache is reserved
(before a generation's first pass, for widths up to its K + 1): width 1 for drafting and plain
decoding, 2..K+1 for verification and for a draft catching up. Wider passes (a prompt) run
eagerly. Graph inputs are copied into static buffers; outputs are kept with their graphs and
cloned, so a result stays valid after the next pass. The decoder itself never waits for the
device: the host knows the length, and the device learns it through a fill kernel.

The graphs of one cache share one memory pool, taken when the first of them is captured and
dropped with them (growth moves the cache; a failed capture). A fresh pool each time is not
a choice: once every graph captured into a pool is released, PyTorch's allocator keeps the
pool's id with no users until its blocks are freed, and a capture into that id fails its
assert `use_count > 0`. A capture that fails is retried once from an empty pool; a second
failure turns graphs off for the decoder, which then runs eagerly and says so in one line
(`graphs_off`, also a SpecgenWarning): decoding/graphs.py, which the heads share.

Without graphs (on a CPU, or where capture fails) the same code runs eagerly and attends over
exactly the cached positions as transformers does, which tests/test_cuda_decoder.py checks bit
for bit against transformers' forward in fp32; the captured form (whole capacity, masked) is
checked on the CPU against it within rounding.

A pass may leave out sub-layers (`skip`, lean.run_layers): a self-drafting target runs its own
layers with some skipped over its own cache; the verify pass rewrites every entry it drafted.

A token tree (core/tree.py) is verified in one pass of its rows at slots pos..pos+N-1: each row
rotated at the position of its depth and attending the cache below pos and its own ancestors.
The tree's shape is data, not code: a static table on the device (`_tree`, the kernels'
`tree_table`) that the host fills before the pass, so one graph per width serves every tree
of that width. `keep_branch` then moves the kept branch's entries to the slots of their
positions.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specgen.choices import MAX_K, MAX_TREE_ROWS
from specgen.decoding.base import Decoder
from specgen.decoding import graphs
from specgen.decoding.capture import Capture, States, keep_branch_states
from specgen.decoding.graphs import graphs_off_line
from specgen.decoding.lean import NO_SKIP, Skip, layer_projections, run_layers
from specgen.kernels.gpu import tree_table
from specgen.models.llama import apply_rotary_pos_emb

if TYPE_CHECKING:
    from transformers import PreTrainedModel

GRAPH_WIDTH = MAX_K + 1  # the widest pass replayed from a graph: a verify pass of MAX_K drafts
FIRST_CAPACITY = 256  # positions; the cache grows by doubling, in multiples of this
# The passes a decoder serves, as (rows out, head, skip, tree): rows 0 is every row (a target's
# verify and one-token passes), 1 the last row only (a draft catching up); tree: a token
# tree's verify pass (widths up to MAX_TREE_ROWS; reserved by a generator that may build one).
DEFAULT_VARIANTS = ((0, True, NO_SKIP, False), (1, True, NO_SKIP, False))
TREE_VARIANT = (0, True, NO_SKIP, True)


def on_one_gpu(model: PreTrainedModel) -> bool:
    """Whether the whole model sits on one CUDA device (not spread over several)."""
    if model.device.type != "cuda":
        return False
    placement = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in placement.values()}) <= 1


class CudaDecoder(Decoder):
    """A Llama-family model over a static KV cache, each small width replayed from a CUDA
    graph (`graphs`, default: on a CUDA device). Answers hidden, logits, crop, reset, length,
    and `reserve(positions)` so that a generation's cache is allocated before any capture.

    `static` (default: `graphs`): passes of up to GRAPH_WIDTH tokens take the captured form
    (whole capacity, masked) also when run eagerly, which lets a CPU test run it."""

    skips = True  # hidden and logits take `skip` (self-speculative drafting)
    verifies_trees = True  # tree_logits, keep_branch (a tree table on the device)

    def __init__(self, model: PreTrainedModel, graphs: bool | None = None,
                 static: bool | None = None) -> None:
        body = model.base_model
        self.embed, self.layers = body.embed_tokens, body.layers
        self.norm, self.rotary = body.norm, body.rotary_emb
        self.head = model.get_output_embeddings()
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        self.kv_heads = config.num_key_value_heads
        self.groups = config.num_attention_heads // self.kv_heads
        self.projections = layer_projections(model)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.static = self.graphs if static is None else static
        self.graph_error: str | None = None  # why capture was given up, if it was
        self.length = 0
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)  # == length, on the device
        self.kv: Tensor | None = None
        self._offsets = torch.arange(GRAPH_WIDTH, device=self.device)
        self._ids = torch.zeros(GRAPH_WIDTH, dtype=torch.long, device=self.device)
        # The last tree pass's shape (kernels.gpu.tree_table) and where it started; a chain
        # until the first tree (a capture reads it, and must find it well-formed).
        self._tree = tree_table(range(-1, MAX_TREE_ROWS - 1), MAX_TREE_ROWS).to(self.device)
        self._tree_start = 0
        self._slots: Tensor | None = None  # arange(capacity)
        # (width, rows out, head, skip, tree) -> the graph, its static output and (for a
        # drafting head) its static states, alive together
        self._captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor, States | None]] = {}
        self._pool = None  # the memory pool of the graphs in _captured (None: none yet)
        # (steps, head, skip, key, sampled) -> a draft chain's graph, its static outputs
        # (tokens, q) and inputs (first token, noise), alive together (`chain`)
        self._chains: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[Tensor, Tensor], tuple]] = {}
        self._variants: set[tuple] = set(DEFAULT_VARIANTS)
        self.widest = 1  # every kind of pass has its graphs for widths 1..widest
        self._wide: set[tuple] = set()  # keys of passes wider than that, met in use
        # For a drafting head (decoding/capture.py): graphs captured while it is set return
        # every row's states beside their output (`_states`: the last pass's).
        self._capture_layers: tuple[int, ...] | None = None
        self._states: States | None = None
        self.captured: list[Capture] = []

    @property
    def capture_layers(self) -> tuple[int, ...] | None:
        return self._capture_layers

    @capture_layers.setter
    def capture_layers(self, layers: tuple[int, ...] | None) -> None:
        """A graph keeps what it was captured to keep: another choice of layers drops them."""
        if layers != self._capture_layers:
            self._drop_graphs()
        self._capture_layers = layers

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[4]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        self.pos.fill_(self.length)

    def reset(self) -> None:
        self.crop(0)

    @property
    def graphs_off(self) -> str | None:
        """The one line that says this decoder gave up on graphs, and why (None: it did not)."""
        return graphs_off_line(self.graph_error)

    def reserve(self, positions: int, widest: int = 1, trees: bool = False) -> None:
        """Room for `positions` cached positions, and a graph captured for every pass of up
        to `widest` tokens (K + 1 for a generation of up to K drafts a step), and with
        `trees` for every token tree's pass. Growing moves the cache, so the graphs that read
        it are dropped and captured again: a generation reserves its whole length before its
        first pass, so that no capture lands among its timed tokens. A pass of a kind or
        width not met before is captured on first use."""
        self.widest = max(self.widest, min(widest, GRAPH_WIDTH))
        if trees:
            self._variants.add(TREE_VARIANT)
        if self.graphs:  # a capture writes as many entries past the length as its width
            room = max([self.widest, MAX_TREE_ROWS, *(key[0] for key in self._wide)])
            positions = max(positions, self.length + room)
        if positions > self.capacity:
            self._grow(positions)
        if self.graphs:
            self._capture_all()

    def _grow(self, positions: int) -> None:
        self._drop_graphs()  # they read the old cache
        size = max(positions, 2 * self.capacity, FIRST_CAPACITY)
        size = -(-size // FIRST_CAPACITY) * FIRST_CAPACITY
        kv = torch.zeros(len(self.layers), 2, 1, self.kv_heads, size, self.head_dim,
                         dtype=self.dtype, device=self.device)
        if self.kv is not None:
            kv[..., : self.length, :] = self.kv[..., : self.length, :]
        self.kv = kv
        self._slots = torch.arange(size, device=self.device)

    @torch.inference_mode()
    def hidden(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        return self._pass(ids, n, False, _frozen(skip))

    @torch.inference_mode()
    def logits(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        return self._pass(ids, n, True, _frozen(skip))

    @torch.inference_mode()
    def tree_logits(self, ids: Tensor, parents: tuple[int, ...]) -> Tensor:
        """The logits of every node of a token tree [N, V] (core/tree.py's layout: node j
        holds ids[j], a child of parents[j]; node 0 is the pending token), each row over the
        cache and its own ancestors. The cache then holds every node, at slots in the tree's
        order: `keep_branch` keeps the accepted branch."""
        m = len(parents)
        table = tree_table(parents, MAX_TREE_ROWS)  # the host's, copied without a wait
        self._tree.copy_(table.pin_memory() if self.device.type == "cuda" else table,
                         non_blocking=True)
        self._tree_start = self.length
        return self._pass(ids, m, True, NO_SKIP, tree=True)

    @torch.inference_mode()
    def keep_branch(self, nodes: list[int]) -> None:
        """After `tree_logits`: the cache holds the tree's root and then `nodes` (the accepted
        branch, root excluded, from the root down), at the slots of their positions, and
        nothing beyond. The entries move on the device (the tree's table knows the branch)."""
        start, depth = self._tree_start, len(nodes)
        if nodes != list(range(1, depth + 1)):  # else the branch is the chain: in place
            sources = start + self._tree[nodes[-1], 2 : depth + 2].long()
            targets = start + 1 + self._offsets[:depth]
            self.kv.index_copy_(4, targets, self.kv.index_select(4, sources))
        if self.capture_layers is not None:  # the branch's rows: its nodes from the root
            leaf = nodes[-1] if nodes else 0
            keep_branch_states(self.captured, start, self._tree[leaf, 1 : depth + 2].long())
        self.crop(start + 1 + depth)

    def _pass(self, ids: Tensor, n: int, head: bool, skip: Skip, tree: bool = False) -> Tensor:
        m = ids.shape[0]
        if self.length + m > self.capacity:
            self.reserve(self.length + m)
        out = None
        if self.graphs and m <= GRAPH_WIDTH:
            out = self._replay(ids, n, head, skip, tree)
        if out is None:
            static = self.static and m <= GRAPH_WIDTH
            out = self._forward(ids.to(self.device), n, head, skip,
                                None if static else self.length, tree)
        if self.capture_layers is not None:  # copies: a graph's states are its static buffers
            normed, inputs = self._states
            self.captured.append(Capture(self.length, normed.clone(), [t.clone() for t in inputs]))
        self.length += m
        self.pos.fill_(self.length)
        return out

    # --- one pass ------------------------------------------------------------------------

    def _forward(self, ids: Tensor, n: int, head: bool, skip: Skip,
                 start: int | None, tree: bool = False) -> Tensor:
        """The last n positions' hidden states (or logits) of a pass over `ids` [m] at
        positions pos..pos+m-1, writing their cache entries. `start` is the host's copy of pos
        for an eager pass (attention over exactly the cached positions); None for a captured
        pass (attention over the whole capacity, masked). `tree`: the rows are the token tree
        in `_tree`, at slots pos..pos+m-1 and positions pos + their depths."""
        m = ids.shape[0]
        slots = self.pos + self._offsets[:m] if m <= GRAPH_WIDTH else (
            self.pos + torch.arange(m, device=self.device))
        positions = self.pos + self._tree[:m, 0].long() if tree else slots
        x = self.embed(ids)  # [m, hidden]
        cos, sin = self.rotary(x[None], positions[None])
        # A tree's rows see one another where one is the other's ancestor (or itself): node
        # j is row r's ancestor where r's ancestor at j's depth is j.
        family = (self._tree[:m, 1:].gather(1, self._tree[None, :m, 0].long().expand(m, m))
                  == self._offsets[None, :m]) if tree else None
        if start is None:  # whole capacity; row r of a stacked query is position r % m
            visible = self._slots[None, :] <= slots[:, None]  # [m, capacity]
            if tree:  # below pos as a chain; at pos + j, where node j is in the row's family
                rel = self._slots - self.pos
                inside = (rel >= 0) & (rel < m)
                visible = (rel < 0)[None, :] | (family[:, rel.clamp(0, m - 1)] & inside[None, :])
            mask = visible.repeat(self.groups, 1) if self.groups > 1 else visible
        elif tree:
            mask = torch.cat([family.new_ones(m, start), family], 1)
        else:  # as transformers: no mask for one token, causal from an empty cache
            mask = None if m == 1 or start == 0 else torch.ones(
                m, start + m, dtype=torch.bool, device=self.device).tril(start)

        def attend(i: int, attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            q, k, v = (t.view(1, m, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = self.kv[i, 0], self.kv[i, 1]  # [1, kv_heads, capacity, head_dim]
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)
            if start is None:
                stacked = q.reshape(1, self.kv_heads, self.groups * m, self.head_dim)
                out = F.scaled_dot_product_attention(stacked, keys, values, attn_mask=mask,
                                                     scale=attn.scaling)
                return out.reshape(1, -1, m, self.head_dim).transpose(1, 2)[0]
            end = start + m
            return F.scaled_dot_product_attention(
                q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=attn.scaling,
                is_causal=start == 0 and m > 1 and not tree,
                enable_gqa=self.groups > 1).transpose(1, 2)[0]

        inputs: list[Tensor] = []
        x = run_layers(x, self.layers, self.projections, attend, skip, self.capture_layers, inputs)
        if self.capture_layers is not None:  # normed apart: the returned rows keep their bits
            self._states = (self.norm(x), inputs)
        x = self.norm(x[-n:])
        return self.head(x) if head else x

    # --- CUDA graphs -------------------------------------------------------------------------

    def _replay(self, ids: Tensor, n: int, head: bool, skip: Skip, tree: bool) -> Tensor | None:
        """The pass replayed from its graph; None if graphs are off (capture failed twice),
        after which this decoder runs eagerly. A pass of a kind not met before has every
        reserved width of its kind captured first; a wider pass, its own width."""
        m = ids.shape[0]
        key = (m, n, head, skip, tree)
        if key not in self._captured:
            self._variants.add((0 if n == m else n, head, skip, tree))
            if m > self.widest:  # a width no reserve asked for: that pass alone
                self._wide.add(key)
            self.reserve(self.length + m)  # room for the captures' writes, then the graphs
            if not self.graphs:
                return None
        self._ids[:m].copy_(ids, non_blocking=True)
        graph, out, self._states = self._captured[key]
        graph.replay()
        return out.clone()

    def _capture_all(self) -> None:
        """Every graph of every kind of pass served so far, those not captured yet; tried
        twice, from an empty pool the second time; a second failure turns graphs off."""
        def attempt() -> None:
            for key in [*graph_keys(self._variants, self.widest), *sorted(self._wide, key=repr)]:
                if key not in self._captured:
                    self._captured[key] = self._capture_graph(key)

        self._captured_or_off(attempt)

    def _captured_or_off(self, attempt: Callable[[], None]) -> None:
        """attempt() tried twice, from an empty pool the second time; a second failure turns
        graphs off (decoding/graphs.py)."""
        reason = graphs.captured_or_reason(attempt, self._drop_graphs, stacklevel=3)
        if reason is not None:
            self.graphs = self.static = False
            self.graph_error = reason

    def _drop_graphs(self) -> None:
        """Release every graph and, with them, their pool: one whose graphs are all gone
        takes no new capture (see the module's docstring); the next capture takes a fresh
        one. Nothing of theirs may still be running when they go."""
        if (self._captured or self._chains) and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._captured.clear()
        self._chains.clear()
        self._pool = None

    def _capture_graph(self, key: tuple) -> tuple[torch.cuda.CUDAGraph, Tensor, States | None]:
        """One pass captured as a graph into this cache's pool, with its static output and
        (for a drafting head) its static states."""
        m, n, head, skip, tree = key
        # A pass is idempotent: the capture's warm-ups rewrite the same cache entries from
        # the same inputs, past the cached length (reserve keeps room there for the widest
        # captured pass).
        graph, out = self._capture(lambda ids: self._forward(ids, n, head, skip, None, tree),
                                   (self._ids[:m],))
        return graph, out, self._states if self.capture_layers is not None else None

    def _capture(self, body: Callable[..., Any], inputs: tuple[Tensor, ...]
                 ) -> tuple[torch.cuda.CUDAGraph, Any]:
        """body(*inputs) captured into this cache's pool (graphs.capture)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return graphs.capture(body, inputs, self.device, self._pool)


    # --- a draft's chain of one-token passes as one graph ---------------------------------

    @property
    def draws_chains(self) -> bool:
        """`chain` replays one graph: graphs on, and no states kept for a head (a chain's
        passes keep none)."""
        return self.graphs and self.capture_layers is None

    @torch.inference_mode()
    def chain(self, first: Tensor, steps: int, pick: Pick, noise: Tensor | None,
              key: Hashable, skip: Skip = NO_SKIP, head: bool = True) -> tuple[Tensor, Tensor]:
        """A draft's `steps` one-token passes, the first over `first` [1] at the length, each
        next one over the token the pass before drew: `pick(out, noise_row)` (out: the pass's
        logits [V], or its hidden state with `head` False; noise_row: `noise`'s row for the
        step, the exponential noise a sampled draw divides by, None for greedy) gives the
        token and the q it was drawn from. Returns the tokens [steps] and q [steps, V]; the
        cache then holds `first` and every token but the last. One graph per (steps, head,
        skip, key): `key` names what `pick` computes (its caller's sampling settings).
        Nothing waits for the device: the host reads the drafts afterwards, once."""
        if not self.draws_chains:
            return self._chain_eagerly(first, steps, pick, noise, skip, head)
        if self.length + steps > self.capacity:  # room for the chain's (and a capture's) writes
            self.reserve(self.length + steps)
        graph_key = (steps, head, _frozen(skip), key, noise is not None)
        if graph_key not in self._chains:
            self._captured_or_off(lambda: self._capture_chain(graph_key, pick, noise))
            if not self.graphs:
                return self._chain_eagerly(first, steps, pick, noise, skip, head)
        graph, outputs, (s_first, s_noise) = self._chains[graph_key]
        s_first.copy_(first, non_blocking=True)
        if noise is not None:
            s_noise.copy_(noise, non_blocking=True)
        graph.replay()
        self.length += steps
        self.pos.fill_(self.length)
        return outputs[0].clone(), outputs[1].clone()

    def _chain_body(self, steps: int, pick: Pick, head: bool, skip: Skip
                    ) -> Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor]]:
        """The chain's passes as a graph replays them: each at `pos`, which they advance on
        the device and give back (a replay leaves `pos` as it found it)."""
        def body(first: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
            token, ids, qs = first, [], []
            for i in range(steps):
                out = self._forward(token, 1, head, skip, None)[0]
                self.pos.add_(1)
                drawn, q = pick(out, None if noise is None else noise[i])
                ids.append(drawn)
                qs.append(q)
                token = drawn.view(1)
            self.pos.sub_(steps)
            return torch.stack(ids), torch.stack(qs)
        return body

    def _capture_chain(self, graph_key: tuple, pick: Pick, noise: Tensor | None) -> None:
        steps, head, skip, _, _ = graph_key
        inputs = (torch.zeros(1, dtype=torch.long, device=self.device),
                  None if noise is None else torch.zeros_like(noise))
        graph, outputs = self._capture(self._chain_body(steps, pick, head, skip), inputs)
        self._chains[graph_key] = (graph, outputs, inputs)

    def _chain_eagerly(self, first: Tensor, steps: int, pick: Pick, noise: Tensor | None,
                       skip: Skip, head: bool) -> tuple[Tensor, Tensor]:
        """`chain`'s passes one at a time (graphs off)."""
        token, ids, qs = first, [], []
        for i in range(steps):
            out = self._pass(token, 1, head, _frozen(skip))[0]
            drawn, q = pick(out, None if noise is None else noise[i])
            ids.append(drawn)
            qs.append(q)
            token = drawn.view(1)
        return torch.stack(ids), torch.stack(qs)


# A chain's draw: (a pass's output, its noise row or None) -> (token, q)
Pick = Callable[[Tensor, "Tensor | None"], tuple[Tensor, Tensor]]


def graph_keys(variants: set[tuple], widest: int) -> Iterator[tuple]:
    """(width, rows out, head, skip, tree) of every graph the kinds of pass in `variants`
    need: widths 1..widest for every row out (rows 0), rows..widest otherwise; a tree's,
    2..MAX_TREE_ROWS (a tree has a branch)."""
    seen = set()
    for rows, head, skip, tree in sorted(variants, key=repr):
        widths = range(2, MAX_TREE_ROWS + 1) if tree else range(max(rows, 1), widest + 1)
        for m in widths:
            key = (m, rows or m, head, skip, tree)
            if key not in seen:
                seen.add(key)
                yield key


def _frozen(skip: Skip) -> Skip:
    """The skip set with frozen members: it keys the graph cache."""
    return Skip(frozenset(skip.attention), frozenset(skip.mlp))
