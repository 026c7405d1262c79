"""A checkpoint's config.json and generation_config.json read as plain values, without
importing transformers (much of a command's start: docs/benchmarks.md), for a model the
tree builds.

Only a config that states every value the tree and the decoders read is read this way: one
transformers saved itself (a converted or packed cache entry, most hub checkpoints), a
Llama-family model with the standard rotary angles. For anything else `read` answers None
and the caller asks transformers' `AutoConfig`, which knows each class's defaults.
Invariant: for a config read here, every attribute specgen reads equals the one
transformers' config class gives (tests/test_models.py compares them)."""

from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("llama", "qwen2")  # pre-norm decoders with rotary, GQA and a SwiGLU MLP
# Rotary kinds whose angles transformers changes during a forward (dynamic_rope_update): the
# tree computes fixed angles only, so models with these keep transformers' classes.
MOVING_ROPE = ("dynamic", "longrope")

# What the tree (models/llama.py), the decoders and the loaders read with no default of
# their own; a config lacking any of them goes through transformers.
STATED = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
          "tie_word_embeddings", "hidden_act", "rope_parameters", "pad_token_id", "eos_token_id")
# Generation settings GenerationConfig.from_model_config takes from a model's config.
FROM_MODEL = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def layer_params(config) -> int | None:
    """The multiply-adds of a Llama-family model's decoder layers per token (its q/k/v, o and
    MLP weights; attention over the context and the output layer left out): what reading a
    prompt costs, whatever the weights' format. None where the config does not say."""
    try:
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        attention = hidden * head_dim * (2 * heads + 2 * config.num_key_value_heads)
        return config.num_hidden_layers * (attention + 3 * hidden * config.intermediate_size)
    except (AttributeError, TypeError):
        return None


def rope_parameters(config) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    return {"rope_type": "default", **params}


def builds(config) -> bool:
    """Whether the tree (models/llama.py) computes `config`'s model as transformers does (a
    plain Config or transformers' own)."""
    rope = rope_parameters(config)["rope_type"]
    return (config.model_type in FAMILIES and config.get_text_config() is config
            and not getattr(config, "use_sliding_window", False)
            and not any(kind in rope for kind in MOVING_ROPE)
            and getattr(config, "hidden_act", "silu") == "silu"
            and getattr(config, "pretraining_tp", 1) <= 1)


class Config:
    """A model's configuration as attributes, as transformers' config object answers them."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update(values)
        self._attn_implementation = None  # set by the model's set_attn_implementation

    def get_text_config(self) -> Config:
        return self

    def __repr__(self) -> str:
        return f"Config(model_type={self.model_type!r}, layers={self.num_hidden_layers})"


class GenerationSettings:
    """A checkpoint's generation settings as attributes (specgen reads `eos_token_id`)."""

    def __init__(self, values: dict) -> None:
        self.eos_token_id = None  # unless the settings name one
        self.__dict__.update(values)

    @classmethod
    def implied_by(cls, config) -> GenerationSettings:
        """The settings a model saved without any has (as transformers'
        GenerationConfig.from_model_config gives them)."""
        return cls({k: getattr(config, k) for k in FROM_MODEL if hasattr(config, k)})


def read(folder: Path) -> Config | None:
    """The config in `folder` as plain values, or None where transformers must read it."""
    try:
        values = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(values, dict) or any(k not in values for k in STATED):
        return None
    rope = values["rope_parameters"]
    if (values["model_type"] not in FAMILIES or "text_config" in values or "auto_map" in values
            or not isinstance(rope, dict) or rope.get("rope_type") != "default"
            or "rope_theta" not in rope):
        return None
    config = Config(values)
    return config if builds(config) else None


def generation_settings(folder: Path, config: Config) -> GenerationSettings:
    """The checkpoint's generation settings, or those its config implies (as transformers'
    GenerationConfig.from_model_config gives a model saved without them)."""
    path = folder / "generation_config.json"
    if path.is_file():
        return GenerationSettings(json.loads(path.read_text()))
    return GenerationSettings.implied_by(config)
