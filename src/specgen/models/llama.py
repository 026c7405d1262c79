"""The Llama-family module tree (Llama, Qwen2) with transformers' parameter names and math,
and no forward of its own: the lean decoder (decoding/lean.py) calls its layers directly.

A packed model or a converted checkpoint is attached to this tree on the meta device
(loading/mapped.py, loading/load.py) when the lean decoder will serve it, so a command that
only generates never imports transformers' model code (a large share of every start). Each
piece computes what transformers' own does, operation for operation: RMSNorm in float32,
the rotary angles from the stored or computed inverse frequencies, SiLU; tests/test_models.py
checks the logits bit for bit against transformers' forward.

Invariant: only what the lean decoder reads is here. Anything that needs transformers'
forward (`generate`, an HF decoder, training a head) loads transformers' classes instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specgen.models.config import rope_parameters


def empty(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    """A parameter on the meta device, for a loader to replace: no initialisation (nn.init on
    a meta tensor imports torch's compiler at every start, for values never used)."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device="meta"), requires_grad=False)


def linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    """An nn.Linear on the meta device, built without its initialisation (see `empty`)."""
    layer = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(layer)
    layer.in_features, layer.out_features = n_in, n_out
    layer.weight = empty(n_out, n_in, dtype=dtype)
    layer.register_parameter("bias", empty(n_out, dtype=dtype) if bias else None)
    return layer


def embedding(n: int, size: int, padding_idx: int | None, dtype: torch.dtype) -> nn.Embedding:
    """An nn.Embedding on the meta device, built without its initialisation (see `empty`)."""
    return nn.Embedding(n, size, padding_idx, _weight=empty(n, size, dtype=dtype), _freeze=True)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """q, k [B, heads, M, D]; cos, sin [B, M, D]: transformers' rotation, in its order."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps), the mean taken in float32."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = empty(size, dtype=dtype)
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def inverse_frequencies(config) -> tuple[Tensor, float]:
    """The rotary inverse frequencies and the cos/sin scale, as transformers computes them."""
    params = rope_parameters(config)
    if params["rope_type"] != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # no model code

        return ROPE_INIT_FUNCTIONS[params["rope_type"]](config)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


class Rotary(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = inverse_frequencies(config)
        # Not saved with a checkpoint (as transformers'); a packed model stores them anyway.
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [B, M, D] in x's dtype for positions [B, M]."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.sliding_window = None
        bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        heads, kv = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = linear(config.hidden_size, heads, bias, dtype)
        self.k_proj = linear(config.hidden_size, kv, bias, dtype)
        self.v_proj = linear(config.hidden_size, kv, bias, dtype)
        o_bias = config.model_type == "llama" and getattr(config, "attention_bias", False)
        self.o_proj = linear(heads, config.hidden_size, o_bias, dtype)


class SiLU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class MLP(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = linear(h, i, bias, dtype)
        self.up_proj = linear(h, i, bias, dtype)
        self.down_proj = linear(i, h, bias, dtype)
        self.act_fn = SiLU()


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx, dtype)
        self.mlp = MLP(config, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class Body(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size, config.pad_token_id, dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = Rotary(config)  # real tables: a checkpoint need not store them


class CausalLM(nn.Module):
    """The tree of transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` (same parameter
    names), answering what specgen reads of a model: `config`, `generation_config`,
    `base_model`, `get_output_embeddings`, `device`, `dtype`. Built on the meta device, its
    parameters in `dtype`: a loader attaches every tensor (loading/mapped.py)."""

    lean_only = True  # no forward: the lean decoder runs it (decoding.make_decoder)

    def __init__(self, config, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.generation_config = None
        self.model = Body(config, dtype)
        self.lm_head = linear(config.hidden_size, config.vocab_size, False, dtype)
        self.tie_weights()

    def tie_weights(self) -> None:
        """The output head shares the input embeddings where the config ties them (again after
        the loader attaches new tensors)."""
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def base_model(self) -> Body:
        return self.model

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def set_attn_implementation(self, name: str) -> None:
        """Recorded only: the lean decoder reads it (decoding.lean.attends_by_rows)."""
        self.config._attn_implementation = name

    def forward(self, *args, **kwargs):
        raise TypeError("specgen's CausalLM has no forward of its own: run it through "
                        "specgen.decoding.make_decoder, or load transformers' class")
