"""Models on specgen's own tree (models/llama.py): a checkpoint's safetensors memory-mapped
onto the tree built on the meta device, with no transformers model code imported and no
weight copied where the stored dtype is the one asked for.

The tree serves a model only where the lean decoder will run it (`fits`); any other model,
or a checkpoint that does not map cleanly (another layout, .bin weights), loads through
transformers as before (the caller's fallback on None).

Packed models (`save_packed`, `load_packed`) are mapped the same way: a model whose linear
layers a CPU scheme quantized, stored with every other tensor it holds (embeddings, norms,
rotary tables) in one safetensors file, its config and its tokenizer. A load builds the
model's skeleton on the meta device (the tree where it fits, else transformers') and attaches
the stored tensors, memory-mapped from the file: the unquantized model is never built, and
the bytes in memory are the bytes the model runs with. kernels.quantize is imported only
there (a float or GGUF load never needs it)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch
from torch import Tensor, nn

from specgen.choices import DYNAMIC_SCHEMES
from specgen.errors import ModelError
from specgen.kernels import linear
from specgen.models import config as config_values, llama

INDEX = "model.safetensors.index.json"
PACKED_WEIGHTS = "model.safetensors"  # a packed entry's tensors, one file
LAYERS = "layers.json"  # the quantized layers' table (kernels.quantize.packed_state)

ST_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
             "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
             "F32": torch.float32, "F64": torch.float64}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def fits(config, role: str, dtype: torch.dtype, quantization: str, device: str,
         trust_remote_code: bool) -> bool:
    """Whether the model can run on the tree: a Llama-family config the tree computes, on the
    CPU, and for a target a form whose every layer computes each row alone (the lean decoder
    serves a target only then: kernels.prepare, decoding.make_decoder)."""
    if trust_remote_code or device != "cpu" or not config_values.builds(config):
        return False
    if role == "draft" or quantization in DYNAMIC_SCHEMES:
        return True
    return (quantization == "none" and dtype in (torch.float32, torch.bfloat16)
            and linear.library() is not None)


def load_lean(folder: Path, config, role: str, dtype: torch.dtype, quantization: str, device: str,
              trust_remote_code: bool) -> llama.CausalLM | None:
    """The checkpoint on the tree with its generation settings, where it `fits` and maps
    cleanly; else None (transformers' classes load it)."""
    if not fits(config, role, dtype, quantization, device, trust_remote_code):
        return None
    model = load(folder, config, dtype)
    if model is not None:
        model.generation_config = generation_config(folder, config)
    return model


def generation_config(folder: Path, config):
    """The checkpoint's generation settings, or those its config implies (as transformers
    gives a model loaded without them): as plain values for a config read as plain values."""
    if isinstance(config, config_values.Config):
        return config_values.generation_settings(folder, config)
    from transformers import GenerationConfig

    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(folder)
    return GenerationConfig.from_model_config(config)


def weight_files(folder: Path) -> list[Path] | None:
    """The checkpoint's safetensors files, or None where it has none."""
    index = folder / INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def load(folder: Path, config, dtype: torch.dtype) -> llama.CausalLM | None:
    """The checkpoint in `folder` on the tree, each tensor mapped from its file (a copy only
    where its stored dtype is not `dtype`); None where it does not map cleanly."""
    files = weight_files(folder)
    if files is None:
        return None
    model = llama.CausalLM(config, dtype)
    wanted = {name for name, p in model.named_parameters(remove_duplicate=False)}
    for path in files:
        read = Reader(path)
        for name in read.names():
            if name not in wanted:  # transformers also ignores stray entries (old rotary tables)
                continue
            t = read(name)
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent)
            if tuple(t.shape) != tuple(owner._parameters[attr].shape):
                return None
            owner._parameters[attr] = nn.Parameter(t if t.dtype == dtype else t.to(dtype),
                                                   requires_grad=False)
    model.tie_weights()
    if any(p.is_meta for p in model.parameters()):
        return None
    return model.eval()


class Reader:
    """A safetensors file (one `write_tensors` wrote, or any other): its tensors
    memory-mapped (a private mapping: the file is never written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
            self.start = 8 + n
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)

    def names(self) -> list[str]:
        """The tensors' names (not the alignment padding, nor the metadata)."""
        return [k for k in self.header if k != "__metadata__" and not k.startswith("__pad")]

    def __call__(self, key: str) -> Tensor:
        meta = self.header.get(key)
        if meta is None:
            raise ModelError(f"{self.path} lacks the tensor {key}: the entry is damaged.")
        begin, end = meta["data_offsets"]
        dtype = ST_DTYPES[meta["dtype"]]
        if end == begin:
            return torch.empty(meta["shape"], dtype=dtype)
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        return torch.frombuffer(self.map, dtype=dtype, count=count,
                                offset=self.start + begin).reshape(meta["shape"])


# --- packed models ----------------------------------------------------------------------------

def _other_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every parameter and buffer (persistent or not) outside the quantized layers, each
    stored once: a tensor held under two names (tied weights) is an alias of the first."""
    from specgen.kernels import quantize

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


def save_packed(model: nn.Module, folder: Path) -> dict:
    """Write a quantized model's tensors and its layer table into `folder`; the table's
    summary (for the manifest) is returned. Config and tokenizer are the caller's."""
    from specgen.kernels import quantize

    packed, table = quantize.packed_state(model)
    others, aliases = _other_tensors(model)
    clash = set(packed) & set(others)
    if clash:
        raise ModelError(f"cannot pack the model: tensor names clash ({sorted(clash)[:3]})")
    write_tensors(folder / PACKED_WEIGHTS, {**others, **packed})
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


def load_packed(folder: Path, dtype: torch.dtype, verifier: bool, trust_remote_code: bool = False,
                lean: str | None = None) -> nn.Module:
    """The packed model in `folder`, its tensors mapped from the file onto a skeleton built on
    the meta device (`verifier`: a target's layers compute each row alone). `lean`: the
    model's quantization scheme where the caller runs it with the lean decoder; the skeleton
    is then specgen's own tree wherever it fits, else transformers'."""
    from specgen.kernels import quantize

    role = "target" if verifier else "draft"
    config = config_values.read(folder) if lean and not trust_remote_code else None
    if config is None or not fits(config, role, dtype, lean, "cpu", trust_remote_code):
        from transformers import AutoConfig  # a plain config only ever builds the tree

        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if lean and fits(config, role, dtype, lean, "cpu", trust_remote_code):
        model = llama.CausalLM(config, dtype)
    else:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                     trust_remote_code=trust_remote_code)
    table = json.loads((folder / LAYERS).read_text())
    read = Reader(folder / PACKED_WEIGHTS)
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
        model.generation_config = generation_config(folder, config)
    return model.eval()


def _is_param(model: nn.Module, name: str) -> bool:
    parent, _, attr = name.rpartition(".")
    return attr in (model.get_submodule(parent) if parent else model)._parameters
