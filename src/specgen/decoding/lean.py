"""The lean forward for Llama-family models on a CPU: the model's own layers called directly
over a preallocated KV cache, with none of transformers' generic machinery around a one-token
pass (cache objects, mask building, attention dispatch).

A draft's lean forward need not match any other bit for bit: what the draft computes is what
q is (exactness is the target's). A target's must, since its greedy output is the guarantee:
the lean decoder serves a target only when the target attends row by row (kernels.prepare
decided so), which it then calls exactly as transformers does, with every other operation in
transformers' order; tests/test_decoding.py checks the logits bit for bit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence, Set
from typing import TYPE_CHECKING, NamedTuple
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import Tensor

from specgen.decoding.base import Decoder
from specgen.decoding.capture import Capture, keep_branch_states
from specgen.kernels import gguf, rows as c_rows
from specgen.kernels.rows import NAME as ROW_ATTENTION, row_attention
from specgen.kernels.quantize import QuantLinear, join_int8_dyn
from specgen.models.config import FAMILIES
from specgen.models.llama import apply_rotary_pos_emb  # transformers' Llama and Qwen2 rotation

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LEAN_FAMILIES = FAMILIES  # pre-norm decoders with rotary, GQA and a SwiGLU MLP
SILU = ("silu", "swish")  # the configs' names of the SwiGLU MLP's activation


def attends_by_rows(model: PreTrainedModel) -> bool:
    return model.config._attn_implementation == ROW_ATTENTION


def lean_supported(model: PreTrainedModel) -> bool:
    """Whether LeanDecoder computes this model as transformers does (tested per family)."""
    config = model.config
    return (
        config.model_type in LEAN_FAMILIES
        and not getattr(config, "use_sliding_window", False)  # full causal attention only
    )


class Skip(NamedTuple):
    """Sub-layers a pass leaves out, by layer index: a self-speculative draft (the target
    with some attention and MLP sub-layers skipped). A skipped sub-layer adds nothing to the
    residual stream, and a skipped attention writes nothing to the KV cache."""

    attention: Set[int] = frozenset()
    mlp: Set[int] = frozenset()


NO_SKIP = Skip()


class Projections:
    """Linear layers that read one input [m, in], called as one with no module in between
    (fewer, larger calls): a GGUF model's layers by one kernel call (gguf.Joined: each
    output has its own call's bits), an int8-dyn draft's joined into one layer; any other
    layers called one by one."""

    def __init__(self, layers: list[torch.nn.Module], swiglu: bool = False) -> None:
        self.layers = layers
        self.gguf = gguf.Joined.of(layers)
        self.swiglu = swiglu  # gate/up of a SwiGLU MLP (`activate`)
        self.joined = all(isinstance(layer, QuantLinear) and layer.kind == "int8-dyn"
                          and not layer.batch_invariant for layer in layers)
        if self.joined:
            self.layer = join_int8_dyn(layers)
            self.sizes = [layer.out_features for layer in layers]

    def __call__(self, x: Tensor) -> list[Tensor]:
        if self.gguf is not None:
            return self.gguf(x)
        if not self.joined:
            return [layer(x) for layer in self.layers]
        y = self.layer.dyn(x.float())
        if self.layer.bias is not None:
            y = y + self.layer.bias
        return list(y.to(x.dtype).split(self.sizes, -1))

    def activate(self, gate: Tensor, up: Tensor, act_fn: torch.nn.Module) -> Tensor:
        """The MLP's activation of these gate/up outputs: GGUF block layers' is gguf.swiglu,
        as the one-call layer (gguf.Layer) computes it, so a row has its bits either way;
        any other layers' act_fn(gate) * up."""
        if self.swiglu and self.gguf is not None and gate.dtype == torch.float32:
            return gguf.swiglu(gate, up)
        return act_fn(gate) * up


# Joined weights are a copy: made once per draft model, however many drafters share it.
_projections: WeakKeyDictionary[PreTrainedModel, list[tuple[Projections, ...]]] = WeakKeyDictionary()


def layer_projections(model: PreTrainedModel) -> list[tuple[Projections, ...]]:
    """Per decoder layer: q/k/v, o, gate/up and down, as `Projections`."""
    if model not in _projections:
        swiglu = model.config.hidden_act in SILU
        _projections[model] = [
            (Projections([a.q_proj, a.k_proj, a.v_proj]), Projections([a.o_proj]),
             Projections([mlp.gate_proj, mlp.up_proj], swiglu), Projections([mlp.down_proj]))
            for a, mlp in ((layer.self_attn, layer.mlp) for layer in model.base_model.layers)]
    return _projections[model]


def one_call_layers(model: PreTrainedModel, projections: list[tuple[Projections, ...]],
                    head_dim: int) -> list[gguf.Layer] | None:
    """Each decoder layer as one kernel call (gguf.Layer), where every linear is a GGUF block
    layer, the norms run in C, the MLP is SwiGLU and rows.c's attention takes the heads;
    else None (the layers are called one op at a time, `run_layers`)."""
    config = model.config
    layers = model.base_model.layers
    if not (head_dim % 8 == 0 and c_rows.library() is not None
            and all(gate_up.swiglu for _, _, gate_up, _ in projections)
            and all(p.gguf is not None for layer in projections for p in layer)
            and all(isinstance(norm, c_rows.RowRMSNorm) for layer in layers
                    for norm in (layer.input_layernorm, layer.post_attention_layernorm))):
        return None
    shape = gguf.AttentionShape(config.num_attention_heads, config.num_key_value_heads,
                                head_dim, layers[0].self_attn.scaling)
    return [gguf.Layer(*(p.gguf for p in parts),
                       (layer.input_layernorm, layer.post_attention_layernorm), shape)
            for layer, parts in zip(layers, projections)]


def run_layers(x: Tensor, layers, projections: list[tuple[Projections, ...]], attend,
               skip: Skip = NO_SKIP, capture: Collection[int] | None = None,
               inputs: list[Tensor] | None = None) -> Tensor:
    """The decoder layers over x [m, hidden], in transformers' order of operations: per layer
    a residual attention block (norm, q/k/v, `attend(i, attn, q, k, v)` -> [m, heads, d],
    o) and a residual SwiGLU MLP block. `skip` names sub-layers left out (a Skip): a skipped
    block adds nothing to the residual stream (and a skipped attention writes no cache entry).
    The inputs of the layers in `capture` are appended to `inputs` (for a drafting head)."""
    m = x.shape[0]
    for i, (layer, (qkv, o, gate_up, down)) in enumerate(zip(layers, projections)):
        if capture and i in capture:
            inputs.append(x)
        if i not in skip.attention:
            q, k, v = qkv(layer.input_layernorm(x))
            x = x + o(attend(i, layer.self_attn, q, k, v).reshape(m, -1))[0]
        if i not in skip.mlp:
            gate, up = gate_up(layer.post_attention_layernorm(x))
            x = x + down(gate_up.activate(gate, up, layer.mlp.act_fn))[0]
    return x


def segments(parents: Sequence[int]) -> tuple[list[tuple[int, int, int]], list[int]]:
    """A preorder tree's chain segments, as (first node, end node, depth of the first): runs
    of nodes each the child of the one before (a chain is one segment); and every node's
    depth."""
    depths = [0] * len(parents)
    runs: list[tuple[int, int, int]] = []
    for j, parent in enumerate(parents):
        if j:
            depths[j] = depths[parent] + 1
        if j and parent == j - 1:
            continue
        if runs:
            runs[-1] = (runs[-1][0], j, runs[-1][2])
        runs.append((j, len(parents), depths[j]))
    return runs, depths


class LeanDecoder(Decoder):
    """The model's layers called directly over a KV cache of its own: one preallocated
    tensor, grown by doubling, rolled back by moving `length`; no mask for one token.
    `skip` leaves sub-layers out of a pass (a self-speculative draft's)."""

    skips = True  # hidden and logits take `skip`
    verifies_trees = True  # tree_logits, keep_branch

    def __init__(self, model: PreTrainedModel) -> None:
        body = model.base_model
        self.embed, self.layers = body.embed_tokens, body.layers
        self.norm, self.rotary = body.norm, body.rotary_emb
        self.head = model.get_output_embeddings()
        self.rows = attends_by_rows(model)  # a target's attention, called as transformers does
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        self.kv_heads = config.num_key_value_heads
        self.projections = layer_projections(model)
        self.one_call = one_call_layers(model, self.projections, self.head_dim)  # None: op by op
        self.kv: Tensor | None = None  # [layers, 2 (k, v), 1, kv_heads, capacity, head_dim]
        self.length = 0
        # For a drafting head (decoding/__init__.py: Capture): the layers whose inputs each
        # pass keeps, or None to keep nothing.
        self.capture_layers: tuple[int, ...] | None = None
        self.captured: list[Capture] = []
        # The last tree pass's start and, per layer, every node's keys and values.
        self._branches: tuple[int, list[Tensor]] = (0, [])

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def reset(self) -> None:
        self.length = 0

    def _reserve(self, needed: int, like: Tensor) -> None:
        capacity = 0 if self.kv is None else self.kv.shape[4]
        if needed <= capacity:
            return
        kv = like.new_zeros(len(self.layers), 2, 1, self.kv_heads, max(needed, 2 * capacity, 256),
                            self.head_dim)
        if self.kv is not None:
            kv[..., : self.length, :] = self.kv[..., : self.length, :]
        self.kv = kv

    def logits(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        return self.head(self.hidden(ids, n, skip))

    def hidden(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        m = ids.shape[0]
        return self.norm(self._pass(ids, torch.arange(m, device=ids.device), [(0, m, 0)], skip)[-n:])

    def tree_logits(self, ids: Tensor, parents: Sequence[int]) -> Tensor:
        """The logits of every node of a token tree (core/tree.py) [N, V]: node j holds
        ids[j] and is a child of parents[j] (node 0, the root, is the pending token; nodes
        in preorder). Each row is computed over the cache and its own ancestors, as a
        one-token pass along its branch would: the tree's chain segments are attended one
        after another, each at the slots of its depth, and in preorder the slots below a
        segment's depth then hold its ancestors. The cache then holds no one branch:
        `keep_branch` writes the accepted one."""
        runs, depths = segments(parents)
        start = self.length
        self._branches = (start, [])
        x = self._pass(ids, torch.tensor(depths, device=ids.device), runs, NO_SKIP, keep=True)
        self.length = start + 1 + max(depths)
        return self.head(self.norm(x))

    def keep_branch(self, nodes: list[int]) -> None:
        """After `tree_logits`: the cache holds the root and then `nodes` (the accepted
        branch, root excluded), and nothing beyond."""
        start, saved = self._branches
        end = start + 1 + len(nodes)
        if nodes:
            index = torch.tensor(nodes, device=saved[0].device)
            for layer, kv in zip(self.kv, saved):
                layer[..., start + 1 : end, :] = kv.index_select(-2, index)
        if self.capture_layers is not None:
            keep_branch_states(self.captured, start, torch.tensor([0, *nodes]))
        self.length = end

    def _pass(self, ids: Tensor, depths: Tensor, runs: list[tuple[int, int, int]], skip: Skip,
              keep: bool = False) -> Tensor:
        """The last layer's output (before the final norm) [m, H] of rows `ids` at positions
        length + depths, each chain segment of `runs` (first row, end row, its depth)
        attending the cache below its depth and itself causally; `keep`: each layer's keys
        and values of every row are kept apart (in rows' order) for keep_branch."""
        m, start = ids.shape[0], self.length
        x = self.embed(ids)  # [m, hidden]
        self._reserve(start + int(depths.max()) + 1, x)
        cos, sin = self.rotary(x[None], (start + depths)[None])
        # Rotary, cache write and attention in one C call: for a target, row_attention's
        # bits; for a draft, whose bits are its own, the cheaper way (PyTorch's SDPA and
        # rotary dispatch a dozen ops per layer).
        in_c = c_rows.usable(x, self.head_dim)
        # Row r of a run sees the cache below the run and the run up to its own row; one
        # token sees everything.
        masks = [None if hi - lo == 1 or self.rows or in_c else
                 torch.ones(hi - lo, start + depth + hi - lo, dtype=torch.bool,
                            device=ids.device).tril(start + depth)
                 for lo, hi, depth in runs]

        def attend_run(i: int, attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor,
                       run: int) -> Tensor:
            lo, hi, depth = runs[run]
            at = start + depth
            if in_c:  # rows.c's attention, with transformers' rotary to the bit
                return c_rows.rope_attend(q[lo:hi], k[lo:hi], v[lo:hi], cos[0, lo:hi],
                                          sin[0, lo:hi], self.kv[i], at, attn.scaling)
            return self._attend(i, attn, q[lo:hi], k[lo:hi], v[lo:hi], cos[:, lo:hi],
                                sin[:, lo:hi], at, masks[run]).reshape(hi - lo, -1)

        def attend(i: int, attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            outs = []
            for run, (lo, hi, depth) in enumerate(runs):
                outs.append(attend_run(i, attn, q, k, v, run))
                if keep:
                    at = start + depth
                    if lo == 0:
                        self._branches[1].append(self.kv[i].new_empty(
                            *self.kv[i].shape[:-2], m, self.head_dim))
                    self._branches[1][i][..., lo:hi, :] = self.kv[i][..., at : at + hi - lo, :]
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        inputs: list[Tensor] = []
        if self.one_call is not None and in_c and len(runs) == 1 and not keep:
            x = self._one_call_layers(x, cos[0].contiguous(), sin[0].contiguous(), start, skip,
                                      inputs)
        else:
            x = run_layers(x, self.layers, self.projections, attend, skip, self.capture_layers,
                           inputs)
        self.length = start + m
        if self.capture_layers is not None:  # normed apart: the returned rows keep their bits
            self.captured.append(Capture(start, self.norm(x), inputs))
        return x

    def _one_call_layers(self, x: Tensor, cos: Tensor, sin: Tensor, start: int, skip: Skip,
                         inputs: list[Tensor]) -> Tensor:
        """run_layers' pass of one chain, each layer one gguf.Layer call (the same bits)."""
        capture = self.capture_layers
        work = self.one_call[0].work(x.shape[0], start)
        for i, layer in enumerate(self.one_call):
            if capture and i in capture:
                inputs.append(x)
            x = layer(x, cos, sin, self.kv[i], start, work, i not in skip.attention,
                      i not in skip.mlp)
        return x

    def _attend(self, i: int, attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor,
                cos: Tensor, sin: Tensor, start: int, mask: Tensor | None) -> Tensor:
        """Layer i's attention in PyTorch: rotate, write the cache, attend; [m, heads, d]."""
        m = q.shape[0]
        end = start + m
        q, k, v = (t.view(1, m, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = self.kv[i, 0], self.kv[i, 1]
        keys[:, :, start:end], values[:, :, start:end] = k, v
        if self.rows:  # [1, m, heads, head_dim], as the model's own forward gets it
            return row_attention(attn, q, keys[:, :, :end], values[:, :, :end], None,
                                 scaling=attn.scaling)[0]
        return F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=attn.scaling,
            enable_gqa=True).transpose(1, 2)[0]
