"""The CUDA decoder with specgen's own kernels (kernels/gpu): a pass of up to GRAPH_WIDTH
tokens runs each decoder layer as five Triton kernels instead of PyTorch's dozens, and every
row of such a pass gets the bits of a one-token pass at its position.

A layer, over the residual stream kept as (residual, pending): the stream is residual +
pending, and each block's first kernel adds them as it norms (so no add runs on its own):

    norm_linear(pending, residual, qkv, rope=) -> q, residual  input_layernorm in the GEMM's
                                                        loads (q, k and v in one GEMM), the
                                                        rotation in its epilogue, k and v
                                                        written there at pos..pos+m-1
    attention(q, cache, pos)                            chunks, merged by the last to finish
    linear(., o) -> pending
    norm_linear(pending, residual, gate_up)             post_attention_layernorm in the
                                                        loads of gate and up's one GEMM
    linear(silu(gate) * up, down) -> pending            the SiLU computed in the GEMM's loads

(an int4 gate/up linear computes the SiLU in its epilogue instead, norm_linear(..., gate_up,
silu=True), not in the down projection's loads, where every output tile would recompute it:
docs/gpu-kernels.md)

then one add_rms_norm for the final norm and one linear for the output head, so that logits
too are row for row. Every kernel computes a row with the same tile shape and reduction order
whatever the pass's width (kernels/gpu/tiles.py), which cuBLAS does not promise: with these
kernels a verify pass of K + 1 tokens gives each token exactly the logits of plain decoding.

Wider passes (a prompt) take CudaDecoder's PyTorch path: they are run once, their cache
entries are what later rows read, and row invariance between them and later passes is not
needed (every pass that verifies is at most GRAPH_WIDTH wide).

Weights: q/k/v and gate/up are concatenated once per model, and the model's own q/k/v and
gate/up layers are pointed at slices of the concatenation, so the weights stay one copy.
int4-gpu layers are read back from tinygemm's layout into the kernels' (exactly: the same
int4 values and scales) and replaced in the model by layers that run these kernels, so they
too are kept once, and the model's own forward (and a prompt's pass) still runs. The
rotary cos and sin tables [capacity, head_dim] come from the model's own rotary embedding
(any rope scaling honoured) and are rebuilt when the cache grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from specgen.decoding.cuda import GRAPH_WIDTH, CudaDecoder
from specgen.decoding.lean import Skip, _projections
from specgen.kernels import gpu
from specgen.kernels.cuda_int4 import Int4Linear

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class FusedLayer:
    qkv: gpu.Weight
    o: gpu.Weight
    gate_up: gpu.Weight
    down: gpu.Weight
    norm_1: Tensor
    eps_1: float
    norm_2: Tensor
    eps_2: float
    scale: float


def _kind(linear: nn.Module) -> str | None:
    return "float" if gpu.takes(linear) else "int4" if isinstance(linear, Int4Linear) else None


def _groups(layer: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """A layer's linears as the kernels take them: q/k/v, o, gate/up, down (owner, name)."""
    a, mlp = layer.self_attn, layer.mlp
    return [[(a, "q_proj"), (a, "k_proj"), (a, "v_proj")], [(a, "o_proj")],
            [(mlp, "gate_proj"), (mlp, "up_proj")], [(mlp, "down_proj")]]


def fused_supported(model: PreTrainedModel) -> bool:
    """Whether FusedDecoder computes this model: float or int4-gpu linear layers (each joined
    group of one kind), a SiLU MLP, an even head size (rotate_half), every norm an RMSNorm
    with its `variance_epsilon`, and rotary angles that depend on the position alone (the
    tables are made once per capacity; dynamic and longrope scaling change with the length)."""
    config = model.config
    body = model.base_model
    if (getattr(config, "hidden_act", "silu") != "silu"
            or not hasattr(body.norm, "variance_epsilon")):
        return False
    rope = getattr(body.rotary_emb, "rope_type", "default")
    if "dynamic" in rope or rope == "longrope":
        return False
    for layer in body.layers:
        for group in _groups(layer):
            kinds = {_kind(getattr(owner, name)) for owner, name in group}
            if len(kinds) != 1 or None in kinds:
                return False
        if not all(hasattr(n, "variance_epsilon")
                   for n in (layer.input_layernorm, layer.post_attention_layernorm)):
            return False
        if getattr(layer.self_attn, "head_dim", 0) % 2:
            return False
    return True


def _joined(group: list[tuple[nn.Module, str]]) -> gpu.Weight:
    """A group's weights as one, its layers then reading slices of it, so that the values
    are kept once: a float layer's weight (and bias) becomes a view of the joined one; an
    int4-gpu layer is replaced by a FusedLinear over its slice (tinygemm's copy is freed)."""
    linears = [getattr(owner, name) for owner, name in group]
    if len(linears) == 1 and gpu.takes(linears[0]):
        return gpu.Weight.from_linear(linears[0])
    weight = gpu.Weight.concat([gpu.Weight.from_linear(m) for m in linears])
    at = 0
    for (owner, name), m in zip(group, linears):
        end = at + m.out_features
        if isinstance(m, Int4Linear):
            setattr(owner, name, gpu.FusedLinear(weight.rows(at, end)))
        else:
            m.weight.data = weight.data[at:end]
            if m.bias is not None:
                m.bias.data = weight.bias[at:end]
        at = end
    return weight


# Made once per model, however many decoders share it (a self-drafting target's).
_fused: WeakKeyDictionary[PreTrainedModel, list[FusedLayer]] = WeakKeyDictionary()


def fused_layers(model: PreTrainedModel) -> list[FusedLayer]:
    """Per decoder layer, its joined weights and norms. Int4-gpu layers are replaced in the
    model (FusedLinear): the lean layer loop's cached projections are dropped to see them."""
    if model not in _fused:
        layers = []
        # Joined tensors of the kind the model's own are (inference tensors or plain ones),
        # whatever mode this runs in: the model's layers read them.
        made_in_inference = model.base_model.embed_tokens.weight.is_inference()
        with torch.inference_mode(made_in_inference), torch.no_grad():
            for layer in model.base_model.layers:
                qkv, o, gate_up, down = (_joined(g) for g in _groups(layer))
                layers.append(FusedLayer(
                    qkv, o, gate_up, down, layer.input_layernorm.weight,
                    layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.weight,
                    layer.post_attention_layernorm.variance_epsilon, layer.self_attn.scaling))
        _fused[model] = layers
        _projections.pop(model, None)
    return _fused[model]


def layer_pass(w: FusedLayer, pending: Tensor, residual: Tensor | None, kv: Tensor, cos: Tensor,
               sin: Tensor, pos: Tensor, q_heads: int, kv_heads: int, tree: Tensor | None = None,
               attention: bool = True, mlp: bool = True) -> tuple[Tensor, Tensor | None]:
    """One decoder layer over the stream (residual, pending) -> (pending, residual): the
    kernels a layer launches, in order (decoding/fused_offline.py records this very list).
    kv: this layer's cache [2, kv_heads, capacity, head_dim]."""
    m = pending.shape[0]
    if attention:
        rope = gpu.Rope(cos, sin, kv, pos, q_heads, kv_heads, tree)
        q, residual = gpu.norm_linear(pending, residual, w.norm_1, w.eps_1, w.qkv, rope=rope)
        pending = gpu.linear(gpu.attention(q, kv, pos, w.scale, tree).view(m, -1), w.o)
    if mlp:
        if w.gate_up.is_int4:  # the SiLU in the gate/up linear's epilogue, once an output
            h, residual = gpu.norm_linear(pending, residual, w.norm_2, w.eps_2, w.gate_up,
                                          silu=True)
            pending = gpu.linear(h, w.down)
        else:
            gate_up, residual = gpu.norm_linear(pending, residual, w.norm_2, w.eps_2,
                                                w.gate_up)
            if w.down.is_int4:  # its loop has no instructions to spare for a SiLU per input
                pending = gpu.linear(gpu.silu_mul(gate_up), w.down)
            else:  # the SiLU in the down projection's loads: one launch fewer, the same bits
                pending = gpu.linear(gate_up, w.down, gated=True)
    return pending, residual


class FusedDecoder(CudaDecoder):
    """CudaDecoder whose passes of up to GRAPH_WIDTH tokens run specgen's kernels
    (kernels/gpu), each row independent of the pass's width; the same interface, graphs and
    skip sets. Needs `fused_supported(model)` and `kernels.gpu.available(device)`."""

    def __init__(self, model: PreTrainedModel, graphs: bool | None = None,
                 static: bool | None = None) -> None:
        self.fused = fused_layers(model)  # first: it may replace the model's int4 layers
        gpu.reserve(model.device)  # split-K's counts: before any graph is captured
        super().__init__(model, graphs, static)
        self.q_heads = model.config.num_attention_heads
        head = self.head
        self.head_weight = gpu.Weight.from_linear(head) if gpu.takes(head) else None
        self._tables: tuple[Tensor, Tensor] | None = None  # rotary cos, sin [capacity, D]

    def _grow(self, positions: int) -> None:
        super()._grow(positions)
        self._rope_tables()  # before any capture: a graph reads the tables of its capacity

    def _rope_tables(self) -> tuple[Tensor, Tensor]:
        """The rotary cos and sin at every slot of the cache, as the model's own rotary
        embedding computes them (a row's angles do not depend on the other positions)."""
        if self._tables is None or self._tables[0].shape[0] != self.capacity:
            like = torch.zeros(1, 1, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(like, torch.arange(self.capacity, device=self.device)[None])
            self._tables = cos[0].contiguous(), sin[0].contiguous()
        return self._tables

    def _forward(self, ids: Tensor, n: int, head: bool, skip: Skip,
                 start: int | None, tree: bool = False) -> Tensor:
        m = ids.shape[0]
        if m > GRAPH_WIDTH:
            return super()._forward(ids, n, head, skip, start)
        cos, sin = self._rope_tables()
        shape = self._tree if tree else None
        pending, residual = self.embed(ids), None  # the stream is residual + pending
        inputs: list[Tensor] = []
        capture = self.capture_layers
        for i, w in enumerate(self.fused):
            if capture and i in capture:
                inputs.append(pending if residual is None else residual + pending)
            pending, residual = layer_pass(
                w, pending, residual, self.kv[i, :, 0], cos, sin, self.pos, self.q_heads,
                self.kv_heads, shape, i not in skip.attention, i not in skip.mlp)
        x, _ = gpu.add_rms_norm(pending, residual, self.norm.weight, self.norm.variance_epsilon)
        if capture is not None:
            self._states = (x, inputs)
        x = x[-n:]
        if not head:
            return x
        return gpu.linear(x, self.head_weight) if self.head_weight is not None else self.head(x)
