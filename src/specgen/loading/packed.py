"""Packed models on disk: a model whose linear layers a CPU scheme quantized, stored with
every other tensor it holds (embeddings, norms, rotary tables) in one safetensors file, its
config and its tokenizer. A load builds the model's skeleton on the meta device and attaches
the stored tensors, memory-mapped from the file: the unquantized model is never built, and
the bytes in memory are the bytes the model runs with."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from torch import Tensor, nn

from specgen.errors import ModelError
from specgen.kernels import quantize
from specgen.loading import mapped
from specgen.loading.mapped import ST_NAMES, Reader
from specgen.models import config as config_values, llama

WEIGHTS = "model.safetensors"
LAYERS = "layers.json"  # the quantized layers' table (kernels.quantize.packed_state)



def _other_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every parameter and buffer (persistent or not) outside the quantized layers, each
    stored once: a tensor held under two names (tied weights) is an alias of the first."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for mod_name, module in model.named_modules():
        if isinstance(module, quantize.QuantLinear):
            continue
        own = {**module._parameters, **module._buffers}
        for attr, t in own.items():
            if t is None:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
            if key in seen:
                aliases[name] = seen[key]
                continue
            seen[key] = name
            t = t.detach()
            tensors[name] = t
    return tensors, aliases


def save(model: nn.Module, folder: Path) -> dict:
    """Write a quantized model's tensors and its layer table into `folder`; the table's
    summary (for the manifest) is returned. Config and tokenizer are the caller's."""
    packed, table = quantize.packed_state(model)
    others, aliases = _other_tensors(model)
    clash = set(packed) & set(others)
    if clash:
        raise ModelError(f"cannot pack the model: tensor names clash ({sorted(clash)[:3]})")
    write_tensors(folder / WEIGHTS, {**others, **packed})
    table = {**table, "tensors": sorted(others), "aliases": aliases}
    (folder / LAYERS).write_text(json.dumps(table) + "\n")
    return {"layers": len(table["layers"])}


ALIGN = 64  # every tensor starts on a 64-byte boundary: the CPU kernels load them aligned


def write_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """A safetensors file whose tensors all start ALIGN-aligned (safetensors' own writer packs
    them back to back, and the packed matmuls crash on misaligned weights): the gaps are
    filled by padding entries, so any safetensors reader still takes it."""
    header: dict[str, dict] = {}
    offset, order = 0, []
    for name, t in tensors.items():
        pad = -offset % ALIGN
        if pad:
            header[f"__pad{len(order)}__"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
            order.append(pad)
            offset += pad
        n = t.numel() * t.element_size()
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        order.append(t)
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for item in order:
            if isinstance(item, int):
                f.write(bytes(item))
            elif item.numel():
                f.write(item.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)


def _assign(model: nn.Module, name: str, t: Tensor) -> None:
    parent, _, attr = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    if attr in owner._parameters:
        owner._parameters[attr] = nn.Parameter(t, requires_grad=False)
    elif attr in owner._buffers:
        owner._buffers[attr] = t
    else:
        raise ModelError(f"the packed model stores {name}, which the model does not have: "
                         "the entry was made for another model.")


def load(folder: Path, dtype: torch.dtype, verifier: bool, trust_remote_code: bool = False,
         lean: str | None = None) -> nn.Module:
    """The packed model in `folder`, its tensors mapped from the file onto a skeleton built on
    the meta device (`verifier`: a target's layers compute each row alone). `lean`: the
    model's quantization scheme where the caller runs it with the lean decoder; the skeleton
    is then specgen's own tree wherever it fits (loading/mapped.py), else transformers'."""
    role = "target" if verifier else "draft"
    config = config_values.read(folder) if lean and not trust_remote_code else None
    if config is None or not mapped.fits(config, role, dtype, lean, "cpu", trust_remote_code):
        from transformers import AutoConfig  # a plain config only ever builds the tree

        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if lean and mapped.fits(config, role, dtype, lean, "cpu", trust_remote_code):
        model = llama.CausalLM(config, dtype)
    else:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                     trust_remote_code=trust_remote_code)
    table = json.loads((folder / LAYERS).read_text())
    read = Reader(folder / WEIGHTS)
    quantize.attach(model, table, read, verifier)
    for name in table["tensors"]:
        _assign(model, name, read(name))
    for name, target in table["aliases"].items():
        _assign(model, name, model.get_parameter(target) if _is_param(model, target)
                else model.get_buffer(target))
    empty = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if empty:
        raise ModelError(f"The packed model in {folder} lacks {', '.join(empty[:3])}: delete "
                         "the folder and run again to rebuild it.")
    if (folder / "generation_config.json").is_file() or getattr(model, "lean_only", False):
        model.generation_config = mapped.generation_config(folder, config)
    return model.eval()


def _is_param(model: nn.Module, name: str) -> bool:
    parent, _, attr = name.rpartition(".")
    return attr in (model.get_submodule(parent) if parent else model)._parameters
