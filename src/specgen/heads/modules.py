"""The heads' forward math as small torch modules whose parameter names are the reference
checkpoints' (SafeAILab/EAGLE `cnets1.Model` and `cnets.Model`, FasterDecoding/Medusa's
`medusa_head`), so a published state dict loads with `load_state_dict(strict=True)` once
heads.layout has checked every tensor's shape against the target.

- EagleHead (EAGLE-1/2): x = fc(cat[embed(token_{t+1}), f_t]); one decoder layer without an
  input norm; its output is the predicted next feature, scored by the target's own output layer.
- Eagle3Head: g = fc(cat[h_low, h_mid, h_high]) on the first step (the draft's own pre-norm
  output on later ones); attention reads cat[input_layernorm(embed), hidden_norm(g)]; logits
  come from its own norm and output layer over a reduced draft vocabulary (d2t: offsets).
- MedusaHeads (Medusa-1): head i maps f_t through ResBlocks (x + SiLU(linear(x))) and its own
  output layer to token t+2+i.

Every module takes a batch [B, T, .] (training, no cache) or one sequence with a `HeadCache`
(drafting: the head's one layer keeps its own keys and values; rollback is a length).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class HeadConfig:
    """Shapes and settings of a head, read from its config.json (heads.layout)."""

    kind: str  # "eagle" | "eagle3" | "medusa"
    hidden: int  # the head's hidden size (the target's, except an EAGLE-3 with target_hidden_size)
    vocab: int  # the target vocabulary the head was made for
    heads: int = 0  # attention heads (EAGLE kinds)
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_positions: int = 2048
    fc_bias: bool = False
    qkv_bias: bool = False
    target_hidden: int = 0  # EAGLE-3: the target's hidden size (0: the head's own)
    draft_vocab: int = 0  # EAGLE-3: the reduced vocabulary; Medusa: output rows (0: vocab)
    aux_layers: tuple[int, ...] = ()  # EAGLE-3: target layers whose inputs are fused
    medusa_heads: int = 0
    medusa_layers: int = 1
    own_embedding: bool = False  # the file carries an embedding the head uses (not the target's)
    embed_rows: int = 0  # that embedding's rows (0: vocab)
    extra: dict = field(default_factory=dict, compare=False)  # config fields kept as they were


class RMSNorm(nn.Module):
    """Llama's RMSNorm: computed in float32, cast back."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Rotary position embeddings as transformers computes them for a Llama with this theta
    and scaling (default, linear, dynamic, llama3, ...)."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        llama = LlamaConfig(hidden_size=config.heads * config.head_dim,
                            num_attention_heads=config.heads, head_dim=config.head_dim,
                            rope_theta=config.rope_theta, rope_scaling=config.rope_scaling,
                            max_position_embeddings=config.max_positions)
        rope = LlamaRotaryEmbedding(llama)
        # Plain attributes, not buffers: a head moved to bf16 keeps float32 frequencies.
        self.inv_freq, self.scaling = rope.inv_freq.float(), rope.attention_scaling

    def forward(self, like: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [1 or B, T, head_dim] for `positions` [T] or [B, T]."""
        positions = positions if positions.dim() == 2 else positions[None]
        if self.inv_freq.device != like.device:  # moved once: a copy per step would wait for
            self.inv_freq = self.inv_freq.to(like.device)  # the device, and break a capture
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return ((angles.cos() * self.scaling).to(like.dtype),
                (angles.sin() * self.scaling).to(like.dtype))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class HeadCache:
    """The keys and values of a head's one decoder layer: one tensor grown by doubling;
    `length` positions are valid and rollback only moves it.

    A `static` cache is what a CUDA graph of a head's step can replay over (as the CUDA
    decoder's, decoding/cuda.py): its length is also on the device (`pos`), a pass writes
    there and attends over the whole capacity with a mask, and the pass leaves the length to
    its owner (`advance`: a replayed step cannot move the host's)."""

    def __init__(self, static: bool = False) -> None:
        self.kv: Tensor | None = None  # [2, 1, kv_heads, capacity, head_dim]
        self.length = 0
        self.static = static
        self.pos: Tensor | None = None  # static: the length, on the device

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[3]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        if self.pos is not None:
            self.pos.fill_(self.length)

    def advance(self, t: int) -> None:
        """A static cache's pass of t rows is done."""
        self.length += t
        self.pos.fill_(self.length)

    def reserve(self, needed: int, like: Tensor) -> bool:
        """Room for `needed` positions (like: [1, kv_heads, t, head_dim]); whether it moved."""
        capacity = self.capacity
        if needed <= capacity:
            return False
        kv = like.new_zeros(2, 1, like.shape[1], max(needed, 2 * capacity, 256), like.shape[3])
        if self.kv is not None:
            kv[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = kv
        if self.static and self.pos is None:
            self.pos = torch.full((1,), self.length, dtype=torch.long, device=like.device)
        return True


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings; input `in_dim` wide (EAGLE-3's
    reads the embedding and the hidden state side by side: 2H)."""

    def __init__(self, config: HeadConfig, in_dim: int) -> None:
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(in_dim, c.heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(in_dim, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(in_dim, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: HeadCache | None = None
                ) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif cache.static:  # at cache.pos, over the whole capacity (room reserved before)
            slots = cache.pos + torch.arange(t, device=x.device)
            keys, values = cache.kv[0], cache.kv[1]
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)
            visible = torch.arange(keys.shape[2], device=x.device)[None, :] <= slots[:, None]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible,
                                                 enable_gqa=True)
        else:  # one sequence: write the cache, then attend over everything up to each row
            start = cache.length
            end = start + t
            cache.reserve(end, k)
            cache.kv[0, :, :, start:end], cache.kv[1, :, :, start:end] = k, v
            keys, values = cache.kv[0, :, :, :end], cache.kv[1, :, :, :end]
            mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool,
                                                  device=x.device).tril(start)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
            cache.length = end
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """EAGLE-1's decoder layer 0: no input norm (the fc output goes straight in)."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config, config.hidden)
        self.mlp = MLP(config.hidden, config.intermediate)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: HeadCache | None) -> Tensor:
        x = x + self.self_attn(x, cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """EAGLE-1/2: predicts the target's next final hidden state (after its last norm) from the
    current one and the next token's embedding (the target's embedding and output layer)."""

    kind = "eagle"

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden, config.hidden, bias=config.fc_bias)
        self.layers = nn.ModuleList([EagleLayer(config)])
        self.rotary = Rotary(config)

    def forward(self, features: Tensor, embeds: Tensor, positions: Tensor,
                cache: HeadCache | None = None) -> Tensor:
        """features, embeds [B, T, H] (the pair (f_t, token_{t+1}) per position) -> the
        predicted features f_{t+1} [B, T, H]. The embedding comes first (cnets1 L623)."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        cos, sin = self.rotary(x, positions)
        return self.layers[0](x, cos, sin, cache)


class Eagle3Layer(nn.Module):
    """EAGLE-3's `midlayer`: attention over cat[input_layernorm(embed), hidden_norm(g)] (2H
    wide), the residual on g itself."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        h = config.hidden
        self.self_attn = Attention(config, 2 * h)
        self.mlp = MLP(h, config.intermediate)
        self.hidden_norm = RMSNorm(h, config.rms_eps)
        self.input_layernorm = RMSNorm(h, config.rms_eps)
        self.post_attention_layernorm = RMSNorm(h, config.rms_eps)

    def forward(self, embeds: Tensor, g: Tensor, cos: Tensor, sin: Tensor,
                cache: HeadCache | None) -> Tensor:
        joined = torch.cat([self.input_layernorm(embeds), self.hidden_norm(g)], dim=-1)
        x = g + self.self_attn(joined, cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """EAGLE-3: fuses three of the target's layer inputs, drafts over its own (reduced)
    vocabulary; draft id i is target id i + d2t[i]."""

    kind = "eagle3"

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h, vd = config.hidden, config.draft_vocab or config.vocab
        self.fc = nn.Linear(3 * (config.target_hidden or h), h, bias=config.fc_bias)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(h, config.rms_eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        self.register_buffer("d2t", torch.zeros(vd, dtype=torch.long))
        if config.own_embedding:  # narrower than the target: it cannot read the target's
            self.embed_tokens = nn.Embedding(config.embed_rows or config.vocab, h)
        self.rotary = Rotary(config)

    def forward(self, hidden: Tensor, embeds: Tensor, positions: Tensor,
                cache: HeadCache | None = None, fused: bool = True) -> tuple[Tensor, Tensor]:
        """hidden: the fused target states [B, T, 3*Ht] (`fused`) or the head's own previous
        output [B, T, H]; embeds [B, T, H]. -> (pre-norm output [B, T, H] fed back on the next
        step, logits over the draft vocabulary [B, T, Vd])."""
        g = self.fc(hidden) if fused else hidden
        cos, sin = self.rotary(g, positions)
        x = self.midlayer(embeds, g, cos, sin, cache)
        return x, self.lm_head(self.norm(x))

    def target_ids(self, draft_ids: Tensor) -> Tensor:
        # index_select: indexing by a 0-dim device tensor may read it on the host
        return draft_ids + self.d2t.index_select(0, draft_ids.reshape(-1)).view_as(draft_ids)


class ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(linear(x)); linear starts at zero (identity)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """Medusa-1's `medusa_head`: a ModuleList whose entry i is Sequential(ResBlock x n,
    Linear(H, rows)), so its state dict keys are the file's ({i}.{l}.linear.weight, {i}.{n}.weight).
    Head i maps the final hidden state at t to the logits of token t+2+i over the first
    `rows` token ids."""

    kind = "medusa"

    def __init__(self, config: HeadConfig) -> None:
        rows = config.draft_vocab or config.vocab
        super().__init__(
            nn.Sequential(*[ResBlock(config.hidden) for _ in range(config.medusa_layers)],
                          nn.Linear(config.hidden, rows, bias=False))
            for _ in range(config.medusa_heads))
        self.config = config

    def forward(self, features: Tensor) -> Tensor:
        """features [..., H] -> logits [heads, ..., rows]."""
        return torch.stack([head(features) for head in self])


Head = EagleHead | Eagle3Head | MedusaHeads
