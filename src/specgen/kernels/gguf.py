"""Linear layers over a GGUF file's tensors, computed from the file's bytes as stored.

`wrap` takes a tensor's raw array as `gguf.GGUFReader` gives it (a read-only memmap: uint8
[N, row bytes] for the block formats) without copying it; `linear` multiplies by it with
`gguf.c`, which reads ggml's blocks in place (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) and
quantizes the activations to int8 per token inside the kernel. Each token of a pass of up to
FP32_ROWS rows gets exactly the bits of a one-token pass, on every path (AVX2, AVX512-VNNI,
and AMX tiles for the wide passes), which is what keeps speculative decoding exact
(docs/cpu-kernels.md, the bit contract).
F32 and BF16 tensors take `linear.py`'s row-alone kernels; F16 ones are converted once to
float32 when wrapped (rare in GGUF files).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from specgen.errors import ConfigError
from specgen.kernels import build
from specgen.kernels.build import C, I, I64, P
from specgen.kernels import linear as dense, rows as c_rows

STEM = "gguf"


@dataclass(frozen=True)
class Format:
    block_weights: int  # weights per block (1 for the float types)
    block_bytes: int  # bytes per block


# Every type this module takes: ggml's blocks (ggml-common.h), and the float types.
FORMATS: dict[str, Format] = {
    "F32": Format(1, 4), "F16": Format(1, 2), "BF16": Format(1, 2),
    "Q4_0": Format(32, 18), "Q5_0": Format(32, 22), "Q8_0": Format(32, 34),
    "Q4_K": Format(256, 144), "Q5_K": Format(256, 176), "Q6_K": Format(256, 210),
}
FLOATS = ("F32", "F16", "BF16")
_IDS = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # gguf.c's (ggml's)

AVX2, VNNI, AMX = 0, 1, 2  # the kernel's paths (gguf.c); AMX: the wide passes


FUNCTIONS = {
    "gguf_linear": C((I, P, P, I64, P, P, I, I, I, I, I)),
    "gguf_linear_many": C((I, P, P, P, P, P, P, I, I, P, I, I)),
    "gguf_dequantize": C((I, P, I64, P, I, I, P, I)),
    "gguf_row_bytes": C((I, I), I64),
    "gguf_amx_rows": C((), I),
    "gguf_pass_path": C((I, I, I), I),
    "gguf_path": C((), I),
    "gguf_vbmi": C((I,), I),
    "gguf_swiglu": C((P, P, P, I, I, I)),
    "gguf_layer": C((P, P, P, I, P, P, P, P, I64, I, I, I, P, I, I)),
    "gguf_layer_work": C((P, I, I, I), I64),
}


def library() -> ctypes.CDLL:
    """The compiled kernel, loaded once per process; there is no PyTorch fallback, so a CPU
    without AVX2 or a missing compiler is a ResourceError that names the alternative."""
    return build.load(STEM, "the GGUF kernel", FUNCTIONS,
                      instead="the model's safetensors weights (Hugging Face)")


def compiled() -> bool:
    """Whether `library()` loads without compiling (up to a minute on a small CPU)."""
    return build.compiled(STEM)


@functools.cache
def best_path() -> int:
    return AVX2 if build.avx2_only() else library().gguf_path()


def amx_rows() -> int:
    """The narrowest pass the AMX path computes on its tiles (narrower: VNNI)."""
    return library().gguf_amx_rows()


def pass_path(kind: str, m: int, path: int) -> int:
    """The path a pass of `m` tokens of block format `kind` runs on when `path` is asked."""
    return library().gguf_pass_path(_IDS[kind], m, path)


def paths() -> tuple[int, ...]:
    """Every path this CPU runs (tests and benches compare them): each up to the best."""
    return tuple(range(best_path() + 1))


def unpack_by_vbmi(use: bool | None = None) -> bool:
    """Sets whether VNNI passes unpack Q4_0 and Q5_0 blocks by AVX512-VBMI's byte permutes
    (the same bytes, so the same bits) and returns whether they now do. `use`: True (taken
    only where the CPU has VBMI), False, or None for the default (VBMI where the CPU has it).
    For tests and benchmarks that compare both ways."""
    return bool(library().gguf_vbmi(-1 if use is None else int(use)))


def _format(kind: str) -> Format:
    if kind not in FORMATS:
        raise ConfigError(f"GGUF tensor type {kind!r} is not supported; specgen computes "
                          f"{', '.join(FORMATS)}.")
    return FORMATS[kind]


@dataclass(frozen=True)
class GGUFWeight:
    """A GGUF tensor as a linear layer's weight [n, k]: `data` is uint8 [n, row bytes] over
    the file's bytes for the block formats, float32 [n, k] for F32 and F16, bfloat16 for
    BF16."""
    data: Tensor
    kind: str
    n: int  # out features
    k: int  # in features


def _view(array: np.ndarray) -> Tensor:
    """A tensor over `array`'s memory, no copy; a read-only memmap stays read-only (the
    kernels never write their weights), so PyTorch's warning about it is not for us."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                                category=UserWarning)
        return torch.from_numpy(array)


def wrap(kind: str, data: np.ndarray, n: int, k: int) -> GGUFWeight:
    """The weight [n, k] (out, in features) of GGUF type `kind` whose raw array is `data`
    (GGUFReader's tensor.data), viewed in place; F16 alone is converted (to float32)."""
    fmt = _format(kind)
    if k % fmt.block_weights:
        raise ConfigError(f"A {kind} tensor's rows are whole blocks of {fmt.block_weights} "
                          f"weights; {k} inputs are not.")
    row_bytes = k // fmt.block_weights * fmt.block_bytes
    if data.nbytes != n * row_bytes:
        raise ConfigError(f"A {kind} tensor [{n}, {k}] is {n * row_bytes} bytes; this one is "
                          f"{data.nbytes}.")
    if not data.flags["C_CONTIGUOUS"]:
        raise ConfigError(f"A {kind} tensor's array must be contiguous (a GGUFReader's is).")
    if kind in FLOATS:
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[kind]
        t = _view(data.reshape(-1).view(np.uint8).view(dtype).reshape(n, k))
        if kind == "F16":
            t = t.float()
        elif kind == "BF16":
            t = t.view(torch.bfloat16)
        return GGUFWeight(t, kind, n, k)
    return GGUFWeight(_view(data.reshape(-1).view(np.uint8).reshape(n, row_bytes)), kind, n, k)


def linear(x: Tensor, w: GGUFWeight, bias: Tensor | None = None, path: int | None = None
           ) -> Tensor:
    """x [M, K] float32 @ W.T (+ bias float32 [N]) -> [M, N] float32, on `best_path()` unless
    `path` names another this CPU has. Each row's result is that of a one-row pass (passes of
    up to FP32_ROWS rows for F32 and BF16; any width for the block formats)."""
    if w.kind in FLOATS:
        if w.kind == "BF16":
            return dense.linear(x.to(torch.bfloat16), w.data,
                                None if bias is None else bias.to(torch.bfloat16)).float()
        if x.shape[0] > dense.FP32_ROWS or dense.library() is None:
            y = torch.mm(x, w.data.t())
            return y if bias is None else y + bias
        return dense.linear(x.contiguous(), w.data, bias)
    build.check_path(path, paths(), "GGUF kernel")
    if x.shape[1] != w.k:
        raise ValueError(f"input has {x.shape[1]} features, the weight {w.k}")
    return _blocks(x.float().contiguous(), w, None if bias is None else bias.float().contiguous(),
                   best_path() if path is None else path)


def _blocks(x: Tensor, w: GGUFWeight, bias: Tensor | None, path: int) -> Tensor:
    """`linear` of a block format, its arguments checked: x [M, K] float32 contiguous, bias
    float32 contiguous or None."""
    y = torch.empty(x.shape[0], w.n)
    library().gguf_linear(_IDS[w.kind], x.data_ptr(), w.data.data_ptr(), w.data.shape[1],
                          None if bias is None else bias.data_ptr(), y.data_ptr(), x.shape[0],
                          w.k, w.n, path, torch.get_num_threads())
    return y


class Joined:
    """Block-format layers that read one input (a decoder layer's q/k/v, its gate/up),
    computed by one kernel call: the input quantized once for all K-quants (once per format
    of the 32-blocks), one thread region over every layer's rows. Each row is computed as its
    own layer's call computes it, so each output has that call's bits. The call's fixed
    arguments are built once here."""

    def __init__(self, layers: list[GGUFLinear]) -> None:
        count = len(layers)
        self.layers = layers  # keeps the weights and biases the pointers below point into
        self.k = layers[0].in_features
        self.sizes = [layer.out_features for layer in layers]
        self.arrays = (
            (ctypes.c_int * count)(*(_IDS[layer.weight.kind] for layer in layers)),
            (ctypes.c_void_p * count)(*(layer.weight.data.data_ptr() for layer in layers)),
            (ctypes.c_int64 * count)(*(layer.weight.data.shape[1] for layer in layers)),
            (ctypes.c_void_p * count)(*(None if layer.bias is None else layer.bias.data_ptr()
                                        for layer in layers)),
            (ctypes.c_int * count)(*self.sizes))
        self.fmts, self.ws, self.row_bytes, self.biases, self.ns = (
            ctypes.addressof(a) for a in self.arrays)

    @staticmethod
    def of(layers: list[nn.Module]) -> Joined | None:
        """The layers as one call, or None where they are not all block-format GGUF layers
        of one input width."""
        if not layers or not all(
                isinstance(layer, GGUFLinear) and layer.weight.kind not in FLOATS for layer in layers):
            return None
        return Joined(layers) if len({layer.in_features for layer in layers}) == 1 else None

    def __call__(self, x: Tensor) -> list[Tensor]:
        """Each layer's output [m, out] for x [m, in] (the lean decoder's rows)."""
        if x.dtype != torch.float32:  # as each layer's own call, which converts
            return [layer(x) for layer in self.layers]
        x = x.contiguous()
        m = x.shape[0]
        y = torch.empty(m * sum(self.sizes))
        library().gguf_linear_many(len(self.sizes), self.fmts, x.data_ptr(), self.ws,
                                   self.row_bytes, self.biases, y.data_ptr(), m, self.k, self.ns,
                                   best_path(), torch.get_num_threads())
        if len(self.sizes) == 1:  # a layer alone (o, down): no split to pay for
            return [y.view(m, self.sizes[0])]
        return [part.view(m, n) for part, n in zip(y.split([m * n for n in self.sizes]), self.sizes)]


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, float32 [m, n] each, one row at a time: the activation of a GGUF
    model's MLP, in `Layer`'s call and outside it alike (gguf_swiglu), so both give a row
    the same bits."""
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    library().gguf_swiglu(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.shape[0],
                          gate.shape[1], torch.get_num_threads())
    return out


class _Joint(ctypes.Structure):  # gguf.c's Joint: a Joined call's arguments
    _fields_ = [("count", ctypes.c_int), ("fmts", ctypes.c_void_p), ("ws", ctypes.c_void_p),
                ("row_bytes", ctypes.c_void_p), ("biases", ctypes.c_void_p),
                ("ns", ctypes.c_void_p)]

    @classmethod
    def of(cls, joined: Joined) -> _Joint:
        return cls(len(joined.sizes), joined.fmts, joined.ws, joined.row_bytes, joined.biases,
                   joined.ns)


class _Layer(ctypes.Structure):  # gguf.c's Layer
    _fields_ = [("qkv", _Joint), ("o", _Joint), ("gate_up", _Joint), ("down", _Joint),
                ("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p),
                ("eps1", ctypes.c_float), ("eps2", ctypes.c_float), ("hidden", ctypes.c_int),
                ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int), ("d", ctypes.c_int),
                ("ff", ctypes.c_int), ("scaling", ctypes.c_float),
                ("rms_norm", ctypes.c_void_p), ("rope_attend", ctypes.c_void_p)]


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float


class Layer:
    """A Llama-family decoder layer whose linears are all block layers (q/k/v, o, gate/up
    and down, each a Joined), computed by one call (gguf_layer): per block, rows.c's RMSNorm,
    the linears, rows.c's rotary and attention over the cache, `swiglu`, and the residual
    adds, with no Python between them. Each step is the one the lean decoder's own loop
    takes, so a row has the same bits either way. `norms`: the layer's two RowRMSNorms."""

    def __init__(self, qkv: Joined, o: Joined, gate_up: Joined, down: Joined,
                 norms: tuple[nn.Module, nn.Module], shape: AttentionShape) -> None:
        self.parts = (qkv, o, gate_up, down, *norms)  # what the struct's pointers point into
        self.struct = _Layer(
            _Joint.of(qkv), _Joint.of(o), _Joint.of(gate_up), _Joint.of(down),
            norms[0].weight.data_ptr(), norms[1].weight.data_ptr(),
            norms[0].variance_epsilon, norms[1].variance_epsilon, qkv.k, shape.heads,
            shape.kv_heads, shape.head_dim, gate_up.sizes[0], shape.scaling,
            c_rows.address("rms_norm"), c_rows.address("rope_attend"))
        self.pointer = ctypes.addressof(self.struct)

    def work(self, m: int, start: int) -> Tensor:
        """Scratch for a call of m rows at position `start` (one serves every layer)."""
        return torch.empty(library().gguf_layer_work(self.pointer, m, start,
                                                     torch.get_num_threads()))

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, start: int,
                 work: Tensor, attend: bool = True, mlp: bool = True) -> Tensor:
        """The layer's output [m, hidden] for x [m, hidden] float32 contiguous at positions
        start.., cos and sin [m, head_dim] contiguous; keys and values go into `cache` [2, 1,
        kv_heads, capacity, head_dim]. A block left out (attend, mlp False) adds nothing."""
        m = x.shape[0]
        y = torch.empty_like(x)
        library().gguf_layer(self.pointer, x.data_ptr(), y.data_ptr(), m, cos.data_ptr(),
                             sin.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(),
                             cache.shape[3] * cache.shape[4], start, int(attend), int(mlp),
                             work.data_ptr(), best_path(), torch.get_num_threads())
        return y


def dequantize(w: GGUFWeight, rows: Tensor | None = None) -> Tensor:
    """W's rows `rows` (all where None) as float32 [len(rows), K]: gguf.quants.dequantize's
    values. For an embedding lookup, a few rows of a large table are read and nothing else."""
    if w.kind in FLOATS:
        return (w.data if rows is None else w.data[rows]).float()
    idx = None
    count = w.n
    if rows is not None:
        idx = rows.reshape(-1).to(torch.int64).contiguous()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= w.n):
            raise IndexError(f"rows out of range for a weight of {w.n} rows")
        count = idx.numel()
    out = torch.empty(count, w.k)
    library().gguf_dequantize(_IDS[w.kind], w.data.data_ptr(), w.data.shape[1],
                              None if idx is None else idx.data_ptr(), count, w.k,
                              out.data_ptr(), torch.get_num_threads())
    return out


class GGUFLinear(nn.Module):
    """A linear layer whose weight is a GGUF tensor computed as stored. The weight is no
    nn.Parameter (nor buffer), so the model's state dict never copies the file."""

    def __init__(self, weight: GGUFWeight, bias: Tensor | None = None):
        super().__init__()
        if weight.kind not in FLOATS:
            # Built with the layer (once, some seconds), never inside a pass: a pass that
            # compiled it would stand in the planner's costs as what the model's passes cost.
            library()
        self.in_features, self.out_features = weight.k, weight.n
        self.weight = weight
        self.bias = None if bias is None else bias.float().contiguous()

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:  # the kernel would read past x's end
            raise ValueError(f"input has {x.shape[-1]} features, the layer {self.in_features}")
        flat = x.dim() == 2 and x.dtype == torch.float32  # the lean decoder's [m, hidden]
        rows = x.contiguous() if flat else x.reshape(-1, self.in_features).float().contiguous()
        if self.weight.kind in FLOATS:
            y = linear(rows, self.weight, self.bias)
        else:  # every layer of every pass: its checks were made once, when it was built
            y = _blocks(rows, self.weight, self.bias, best_path())
        return y if flat else y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"kind={self.weight.kind}, bias={self.bias is not None}")
