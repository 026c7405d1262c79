"""The CUDA decoder with specgen's own kernels (kernels/gpu): a pass of up to GRAPH_WIDTH
tokens runs each decoder layer as ten Triton kernels instead of PyTorch's dozens, and every row
of such a pass gets the bits of a one-token pass at its position.

A layer, over the residual stream kept as (residual, pending): the stream is residual +
pending, and each block's first kernel adds them as it norms (so no add runs on its own):

    add_rms_norm(pending, residual) -> h, residual      input_layernorm
    linear(h, qkv)                                      q, k and v in one GEMM
    rope_write(qkv, cos, sin, cache, pos) -> q          k and v written at pos..pos+m-1
    attention(q, cache, pos)                            two kernels (chunks, then their merge)
    linear(., o) -> pending
    add_rms_norm(pending, residual) -> h, residual      post_attention_layernorm
    linear(h, gate_up)                                  gate and up in one GEMM
    silu_mul(.)
    linear(., down) -> pending

then one add_rms_norm for the final norm and one linear for the output head, so that logits
too are row for row. Every kernel computes a row with the same tile shape and reduction order
whatever the pass's width (kernels/gpu/tiles.py), which cuBLAS does not promise: with these
kernels a verify pass of K + 1 tokens gives each token exactly the logits of plain decoding.

Wider passes (a prompt) take CudaDecoder's PyTorch path: they are run once, their cache
entries are what later rows read, and row invariance between them and later passes is not
needed (every pass that verifies is at most GRAPH_WIDTH wide).

Weights: q/k/v and gate/up are concatenated once per model, and the model's own q/k/v and
gate/up layers are pointed at slices of the concatenation, so the weights stay one copy. The
rotary cos and sin tables [capacity, head_dim] come from the model's own rotary embedding
(any rope scaling honoured) and are rebuilt when the cache grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from specgen.decoding.capture import Capture
from specgen.decoding.cuda import GRAPH_WIDTH, CudaDecoder
from specgen.decoding.lean import Skip
from specgen.kernels import gpu

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


def fused_supported(model: PreTrainedModel) -> bool:
    """Whether FusedDecoder computes this model: float linear layers, a SiLU MLP, an even
    head size (rotate_half), every layer norm an RMSNorm with its `variance_epsilon`."""
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return False
    if not hasattr(model.base_model.norm, "variance_epsilon"):
        return False
    for layer in model.base_model.layers:
        a, mlp = layer.self_attn, layer.mlp
        linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(gpu.takes(m) for m in linears):
            return False
        if not all(hasattr(n, "variance_epsilon")
                   for n in (layer.input_layernorm, layer.post_attention_layernorm)):
            return False
    return a.head_dim % 2 == 0 if hasattr(a, "head_dim") else True


def _joined(linears: list[nn.Linear]) -> gpu.Weight:
    """The layers' weights as one, and the layers pointed at its slices (one copy kept)."""
    weight = gpu.Weight.concat([gpu.Weight.from_linear(m) for m in linears])
    at = 0
    for m in linears:
        m.weight.data = weight.data[at:at + m.out_features]
        if m.bias is not None:
            m.bias.data = weight.bias[at:at + m.out_features]
        at += m.out_features
    return weight


# Made once per model, however many decoders share it (a self-drafting target's).
_fused: WeakKeyDictionary[PreTrainedModel, list[FusedLayer]] = WeakKeyDictionary()


def fused_layers(model: PreTrainedModel) -> list[FusedLayer]:
    if model not in _fused:
        with torch.no_grad():
            _fused[model] = [FusedLayer(
                _joined([a.q_proj, a.k_proj, a.v_proj]), gpu.Weight.from_linear(a.o_proj),
                _joined([mlp.gate_proj, mlp.up_proj]), gpu.Weight.from_linear(mlp.down_proj),
                layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                a.scaling) for layer, a, mlp in ((layer, layer.self_attn, layer.mlp)
                                                 for layer in model.base_model.layers)]
    return _fused[model]


class FusedDecoder(CudaDecoder):
    """CudaDecoder whose passes of up to GRAPH_WIDTH tokens run specgen's kernels
    (kernels/gpu), each row independent of the pass's width; the same interface, graphs and
    skip sets. Needs `fused_supported(model)` and `kernels.gpu.available(device)`."""

    def __init__(self, model: PreTrainedModel, graphs: bool | None = None,
                 static: bool | None = None) -> None:
        super().__init__(model, graphs, static)
        self.fused = fused_layers(model)
        self.q_heads = model.config.num_attention_heads
        head = self.head
        self.head_weight = gpu.Weight.from_linear(head) if gpu.takes(head) else None
        self._tables: tuple[Tensor, Tensor] | None = None  # rotary cos, sin [capacity, D]

    def reserve(self, positions: int) -> None:
        super().reserve(positions)
        self._rope_tables()

    def _rope_tables(self) -> tuple[Tensor, Tensor]:
        """The rotary cos and sin at every slot of the cache, as the model's own rotary
        embedding computes them (a row's angles do not depend on the other positions)."""
        if self._tables is None or self._tables[0].shape[0] != self.capacity:
            like = torch.zeros(1, 1, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(like, torch.arange(self.capacity, device=self.device)[None])
            self._tables = cos[0].contiguous(), sin[0].contiguous()
        return self._tables

    def _forward(self, ids: Tensor, n: int, head: bool, skip: Skip,
                 start: int | None) -> Tensor:
        m = ids.shape[0]
        if m > GRAPH_WIDTH:
            return super()._forward(ids, n, head, skip, start)
        cos, sin = self._rope_tables()
        pending, residual = self.embed(ids), None  # the stream is residual + pending
        inputs: list[Tensor] = []
        capture = self.capture_layers
        for i, w in enumerate(self.fused):
            if capture and i in capture:
                inputs.append(pending if residual is None else residual + pending)
            if i not in skip.attention:
                kv = self.kv[i, :, 0]  # [2, kv_heads, capacity, head_dim]
                h, residual = gpu.add_rms_norm(pending, residual, w.norm_1, w.eps_1)
                q = gpu.rope_write(gpu.linear(h, w.qkv), cos, sin, kv, self.pos,
                                   self.q_heads, self.kv_heads)
                pending = gpu.linear(gpu.attention(q, kv, self.pos, w.scale).view(m, -1), w.o)
            if i not in skip.mlp:
                h, residual = gpu.add_rms_norm(pending, residual, w.norm_2, w.eps_2)
                pending = gpu.linear(gpu.silu_mul(gpu.linear(h, w.gate_up)), w.down)
        x, _ = gpu.add_rms_norm(pending, residual, self.norm.weight, self.norm.variance_epsilon)
        if capture is not None:
            self.captured.append(Capture(self.length, x, inputs))
        x = x[-n:]
        if not head:
            return x
        return gpu.linear(x, self.head_weight) if self.head_weight is not None else self.head(x)
