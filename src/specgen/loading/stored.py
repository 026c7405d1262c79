"""A GGUF file run as it is stored (quantization "gguf"): its tensors mapped from the file
onto specgen's own tree (models/llama.py), each linear layer computed from its blocks in place
by kernels/gguf.py. Nothing is converted and no weight is written to the cache: the first run
maps the file as a later one does.

Only what the file stores is read here: the model's shape from its metadata, its tensors by
name. The token embedding stays in its blocks too (a pass dequantizes the rows of its tokens);
a file without an output tensor ties the head to the embedding's blocks. Llama files store q
and k with their rows permuted for llama.cpp's rotary; those two small tensors are put back
in transformers' order (a copy of their rows), so the rotation is the one the tree computes."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from specgen.choices import STORED_SCHEME
from specgen.errors import ModelError
from specgen.kernels import gguf as kernels, prepare
from specgen.models import config as config_values, llama

ARCHITECTURES = ("llama", "qwen2")  # the tree's families, as GGUF names them

# The tree's parameter names -> the file's tensor names (per layer: "{i}").
LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
LAYER_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


class StoredEmbedding(nn.Module):
    """The token embedding in the file's blocks: a pass dequantizes its tokens' rows only."""

    def __init__(self, weight) -> None:
        super().__init__()
        self.stored = weight
        self.num_embeddings, self.embedding_dim = weight.n, weight.k

    @property
    def weight(self) -> Tensor:
        """The blocks themselves (for the device they sit on; never a float matrix)."""
        return self.stored.data

    def forward(self, ids: Tensor) -> Tensor:
        rows = kernels.dequantize(self.stored, ids.reshape(-1))
        return rows.reshape(*ids.shape, self.embedding_dim)


class File:
    """A GGUF file opened once: its metadata as plain values and its tensors by name, each a
    view of the file mapped read-only. Read by `gguf`'s own layout (GGUF v2/v3) but not by
    its GGUFReader, which turns every string of the tokenizer's arrays into an array of its
    own (seconds for a 150k vocabulary): arrays are skipped here, their bytes never read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.map = np.memmap(path, dtype=np.uint8, mode="r")
            self.fields, self.tensors = _parse(self.map)
        except (OSError, ValueError, KeyError, IndexError) as e:
            raise ModelError(f"Cannot read the GGUF file {path}: {e}".splitlines()[0]) from None

    def value(self, key: str, default=None):
        return self.fields.get(key, default)

    def weight(self, name: str):
        """The tensor as the kernels read it (kernels.gguf.GGUFWeight): no copy."""
        t = self.tensors[name]
        if t.kind not in kernels.FORMATS:
            raise ModelError(f"{self.path.name}: {name} is stored as {t.kind}, which specgen's "
                             f"kernels do not read ({', '.join(kernels.FORMATS)}). Run this "
                             "file with quantization = \"none\" (converted to float).")
        return kernels.wrap(t.kind, t.data, t.n, t.k)

    def floats(self, name: str) -> Tensor:
        """A small float tensor (a norm, a bias) copied out as float32."""
        t = self.tensors[name]
        if t.kind == "F32":
            return torch.from_numpy(t.data.view(np.float32).reshape(-1).copy())
        return kernels.dequantize(self.weight(name)).reshape(-1)


@dataclass(frozen=True)
class StoredTensor:
    kind: str  # its GGML type's name (Q4_K, F32, ...)
    n: int  # rows (a linear layer's outputs)
    k: int  # elements per row (its inputs): GGUF lists this dimension first
    data: np.ndarray  # uint8 [n, bytes per row], a view of the mapped file


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's byte count, before its bytes

# ggml's type ids (ggml.h) of the types the kernels read, so that a file of those names its
# tensors without the `gguf` package (whose import reads YAML and more); a file with another
# type asks the package for the name (then refused by File.weight, which lists FORMATS).
_KINDS = {0: "F32", 1: "F16", 2: "Q4_0", 6: "Q5_0", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K",
          14: "Q6_K", 30: "BF16"}


def _parse(buf: np.ndarray) -> tuple[dict, dict[str, StoredTensor]]:
    """The metadata's scalars and strings, and every tensor's place, of a GGUF file."""
    raw = memoryview(buf)
    at = 0

    def read(fmt: str):
        nonlocal at
        (value,) = struct.unpack_from(fmt, raw, at)
        at += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal at
        n = read("<Q")
        at += n
        return bytes(raw[at - n:at]).decode("utf-8", "replace")

    def skip_value(vtype: int) -> None:
        nonlocal at
        if vtype == _STRING:
            at += _LENGTH.size + _LENGTH.unpack_from(raw, at)[0]
        elif vtype == _ARRAY:
            etype, count = read("<I"), read("<Q")
            if etype in _SCALARS:
                at += struct.calcsize(_SCALARS[etype]) * count
            elif etype == _STRING:  # a vocabulary's tokens and merges: the loop that counts
                length, size = _LENGTH.unpack_from, _LENGTH.size
                for _ in range(count):
                    at += size + length(raw, at)[0]
            else:
                for _ in range(count):
                    skip_value(etype)
        else:
            at += struct.calcsize(_SCALARS[vtype])

    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    at = 4
    version = read("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (specgen reads 2 and 3)")
    n_tensors, n_fields = read("<Q"), read("<Q")
    fields: dict = {}
    for _ in range(n_fields):
        key, vtype = string(), read("<I")
        if vtype == _STRING:
            fields[key] = string()
        elif vtype in _SCALARS:
            fields[key] = read(_SCALARS[vtype])
        else:
            skip_value(vtype)  # arrays (the tokenizer's): the tokenizer loader reads them
    infos = []
    for _ in range(n_tensors):
        name, dims = string(), read("<I")
        shape = [read("<Q") for _ in range(dims)]
        infos.append((name, shape, read("<I"), read("<Q")))
    align = int(fields.get("general.alignment", 32))
    start = -(-at // align) * align
    tensors = {}
    for name, shape, type_id, offset in infos:
        kind, block, size = _block_of(type_id)
        k = shape[0]
        n = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        row = k // block * size
        data = buf[start + offset:start + offset + n * row].reshape(n, row)
        tensors[name] = StoredTensor(kind, n, k, data)
    return fields, tensors


def _block_of(type_id: int) -> tuple[str, int, int]:
    """A ggml type's name, weights per block and bytes per block."""
    if type_id in _KINDS:
        fmt = kernels.FORMATS[_KINDS[type_id]]
        return _KINDS[type_id], fmt.block_weights, fmt.block_bytes
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    kind = GGMLQuantizationType(type_id)
    return (kind.name, *GGML_QUANT_SIZES[kind])


def read_config(file: File) -> config_values.Config:
    """The model's shape from the file's metadata, as the plain values a config.json states."""
    arch = file.value("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelError(f"{file.path.name} is a {arch!r} model; specgen runs a GGUF as stored "
                         f"for {', '.join(ARCHITECTURES)} only. Use quantization = \"none\".")

    def need(key: str):
        value = file.value(f"{arch}.{key}")
        if value is None:
            raise ModelError(f"{file.path.name} lacks the metadata {arch}.{key}: not a complete "
                             "model file.")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = file.tensors["token_embd.weight"].n
    eos = file.value("tokenizer.ggml.eos_token_id")
    values = {
        "model_type": arch, "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(file.value(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(file.value(f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(file.value(f"{arch}.rope.freq_base", 10000.0))},
        "bos_token_id": file.value("tokenizer.ggml.bos_token_id"),
        "eos_token_id": None if eos is None else int(eos),
        "pad_token_id": file.value("tokenizer.ggml.padding_token_id"),
        "use_sliding_window": False,
    }
    if file.value(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelError(f"{file.path.name} scales its rotary angles "
                         f"({file.value(f'{arch}.rope.scaling.type')}); run it with "
                         "quantization = \"none\".")
    return config_values.Config(values)


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's rotary halves in a llama file's q and k
    rows; transformers' order puts them back (its GGUF loader's reverse_permute), row by row."""
    n = rows.shape[0]
    order = np.arange(n).reshape(heads, n // heads // 2, 2).swapaxes(1, 2).reshape(n)
    return np.ascontiguousarray(rows[order])


def load(path: Path) -> llama.CausalLM:
    """The GGUF file at `path` on the tree, float32 around the stored linears."""
    file = File(path)
    config = read_config(file)
    model = llama.CausalLM(config, torch.float32)
    body = model.model
    body.embed_tokens = StoredEmbedding(file.weight("token_embd.weight"))
    body.norm.weight = _parameter(file.floats("output_norm.weight"))
    head = "token_embd.weight" if config.tie_word_embeddings else "output.weight"
    model.lm_head = kernels.GGUFLinear(file.weight(head))
    for i, layer in enumerate(body.layers):
        for attr, name in LAYER_TENSORS.items():
            stored = f"blk.{i}.{name}.weight"
            weight = file.weight(stored)
            if config.model_type == "llama" and name in ("attn_q", "attn_k"):
                heads = config.num_attention_heads if name == "attn_q" else config.num_key_value_heads
                weight = kernels.wrap(weight.kind, _unpermute(file.tensors[stored].data, heads),
                                      weight.n, weight.k)
            bias_name = f"blk.{i}.{name}.bias"
            bias = file.floats(bias_name) if bias_name in file.tensors else None
            owner, _, child = attr.rpartition(".")
            setattr(layer.get_submodule(owner), child, kernels.GGUFLinear(weight, bias))
        for attr, name in LAYER_NORMS.items():
            getattr(layer, attr).weight = _parameter(file.floats(f"blk.{i}.{name}.weight"))
    model.file = file  # keeps the mapping open as long as the model lives
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelError(f"{path.name} lacks tensors the model needs ({', '.join(missing[:3])}).")
    return model.eval()


def load_gguf(path: str | Path, role: str = "target") -> llama.CausalLM:
    """The GGUF file at `path` as stored, prepared for `role` ("target" or "draft"): what
    `SpeculativeGenerator(load_gguf(t), load_gguf(d, "draft"))` runs, on the same kernels as
    the command line. Its tokenizer: transformers' `AutoTokenizer.from_pretrained(folder,
    gguf_file=name)`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"GGUF file {path} does not exist.")
    model = load(path)
    model.generation_config = config_values.GenerationSettings.implied_by(model.config)
    return prepare(model, role, STORED_SCHEME).eval()


def _parameter(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)

