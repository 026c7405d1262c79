"""Tiny random causal LMs for tests: built in memory, or saved as a local model directory."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def tiny_model(family: str = "llama", *, vocab: int = 64, hidden: int = 32, layers: int = 2,
               seed: int = 0, eos: int | None = None, **overrides):
    """A random fp32 causal LM small enough to run thousands of steps in seconds."""
    config = FAMILIES[family](
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False, **overrides,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def sharpen(model, scale: float) -> None:
    """Scale the output head so that the random model's distributions are less flat
    (drafts then agree with the target often enough to exercise acceptance)."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)


def save_tiny(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path
