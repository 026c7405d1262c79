"""Models on specgen's own tree (models/llama.py): a checkpoint's safetensors memory-mapped
onto the tree built on the meta device, with no transformers model code imported and no
weight copied where the stored dtype is the one asked for.

The tree serves a model only where the lean decoder will run it (`fits`); any other model,
or a checkpoint that does not map cleanly (another layout, .bin weights), loads through
transformers as before (the caller's fallback on None)."""

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
