"""int8/int4 quantization of a model's linear layers, for fast CPU decoding.

Decoding one token reads every weight once, so on a CPU its speed is set by the bytes of the
weights: int8 reads half of bf16's, int4 a quarter. Four schemes (choices.CPU_SCHEMES):
- `int8-wo`, `int4-wo`: weight-only, PyTorch's packed matmuls (`_weight_int8pack_mm`,
  `_weight_int4pack_mm_for_cpu`); activations stay in floating point (bf16 inside the kernel).
- `int8-dyn`: int8 weights and 7-bit activations, quantized at run time, multiplied by
  specgen's own kernel (int8.py), which gives the bits of fbgemm's dynamic linear from the
  weights as stored; fbgemm itself where that kernel cannot be built.
- `int4-dyn`: int4 weights (blocks of 32) and int8 activations, specgen's own kernel
  (int4.py): 0.625 bytes a weight, five eighths of int8-dyn's.
The dynamic schemes compute every row of a pass alone (batch-invariant), which is what lets a
target verify exactly (kernels.prepare gives it row-by-row attention as well).

The weight-only kernels process the rows of the input in blocks of 4: a call over more than 4
rows splits the row blocks across threads, each thread reading the whole weight, so they are
called once per block of 4 rows (ROWS_PER_CALL) to keep every thread on every call.

`packed_state` and `attach` give a quantized model's layers as plain tensors and back, for
the on-disk cache of packed models (loading/cache.py): a later load maps them from the file
onto a model skeleton and never builds the unquantized model.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from specgen.choices import CPU_SCHEMES
from specgen.errors import ConfigError, ResourceError
from specgen.kernels import int4, int8

FORMAT_VERSION = 2  # of the packed layers (packed_state)
INT4_GROUP_SIZES = (128, 64, 32)  # preferred first; a layer uses the largest that divides its input
ROWS_PER_CALL = 4  # the kernels' row block: more rows per call re-read the weights per block

# Quantization work done (layers quantized) in this process: tests use it to check that a
# cached load did not quantize again.
quantized_layers = 0


# --- quantization math (pure functions) -------------------------------------------------

def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-row int8: w [N, K] ~= q * scale[:, None]. Returns (q int8 [N, K],
    scale bf16 [N]). The scale is rounded to bf16 first, since the kernel reads it in bf16."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Tensor, scale: Tensor) -> Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Asymmetric int4 per group of `group_size` inputs: w ~= q * scale + min with q in 0..15.
    Returns (q int32 [N, K], scales_and_zeros bf16 [K / group, N, 2]) in the kernel's
    convention, where the kernel dequantizes (q - 8) * scale + zero, so zero = min + 8 * scale."""
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    scale = ((hi - lo) / 15).clamp(min=1e-6).to(torch.bfloat16).float()
    zero = (lo + 8 * scale).to(torch.bfloat16).float()
    # Round against the stored (bf16) scale and zero so that dequantization matches exactly.
    q = torch.round((g - zero[..., None]) / scale[..., None] + 8).clamp(0, 15).to(torch.int32)
    scales_and_zeros = torch.stack([scale, zero], dim=2).transpose(0, 1).contiguous()
    return q.reshape(n, k), scales_and_zeros.to(torch.bfloat16)


def dequantize_int4(q: Tensor, scales_and_zeros: Tensor, group_size: int) -> Tensor:
    n, k = q.shape
    sz = scales_and_zeros.float().transpose(0, 1)  # [N, K / group, 2]
    g = q.float().reshape(n, k // group_size, group_size) - 8
    return (g * sz[..., :1] + sz[..., 1:]).reshape(n, k)


def int4_group_size(in_features: int, out_features: int) -> int | None:
    """The largest supported group that divides the input dimension, or None where the CPU
    kernel cannot take the layer (it needs out_features divisible by 16): such a layer is
    quantized to int8 instead."""
    if out_features % 16:
        return None
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


# --- the quantized linear ------------------------------------------------------------------

def check_fbgemm() -> None:
    if "fbgemm" not in supported_engines():
        raise ResourceError("int8-dyn needs specgen's int8 kernel (an x86 CPU with AVX2 and a C "
                            "compiler) or fbgemm, PyTorch's x86 integer kernels, and this machine "
                            "has neither: use int8-wo instead.")


# fbgemm packs a weight of many output rows far slower per row than several weights of fewer
# (an output head's: docs/benchmarks.md, start-up), so larger weights are packed in pieces.
PACK_ROWS = 16384


def prepack_int8(q: Tensor, scale: Tensor) -> tuple:
    """fbgemm's packed form of a per-row int8 weight (q int8 [N, K], scale [N]): a tuple of
    pieces of at most PACK_ROWS rows. fbgemm computes each output from the input's one
    quantization and its own weight row, so pieces called side by side (`linear_int8_dyn`)
    give every output the bits of one call."""
    check_fbgemm()
    return tuple(_prepack_piece(a, b) for a, b in zip(q.split(PACK_ROWS), scale.split(PACK_ROWS)))


def _prepack_piece(q: Tensor, scale: Tensor):
    with warnings.catch_warnings():  # PyTorch marks quantized tensors deprecated; 2.13 has them
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(
            q, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"  # prepacking picks its layout by the engine
    try:
        return torch.ops.quantized.linear_prepack(qw, None)
    finally:
        torch.backends.quantized.engine = engine


def supported_engines() -> list[str]:
    return torch.backends.quantized.supported_engines


def unpack_int8(packed: tuple) -> tuple[Tensor, Tensor]:
    """The (q, scale) that `prepack_int8` packed."""
    parts = [torch.ops.quantized.linear_unpack(piece)[0] for piece in packed]
    return (torch.cat([qw.int_repr() for qw in parts]),
            torch.cat([qw.q_per_channel_scales() for qw in parts]).to(torch.bfloat16))


def linear_int8_dyn(x: Tensor, packed: tuple) -> Tensor:
    """x [M, K] float32 through fbgemm's dynamic int8 linear (7-bit activations: reduce_range),
    one call per piece of the packed weight, the outputs side by side."""
    ys = [torch.ops.quantized.linear_dynamic(x, piece, True) for piece in packed]
    return ys[0] if len(ys) == 1 else torch.cat(ys, -1)


def row_anchor(in_features: int) -> Tensor:
    """One extra input row [1, -1, 0, ...]. fbgemm quantizes the activations with one scale
    for the whole batch, from its min and max; with every real row scaled into [-1, 1] and
    this row present, min and max are always -1 and 1, so each row is quantized the same
    whatever else is in the batch, and a verify pass gives each token bit-identical results
    to a single-token pass (integer accumulation is exact)."""
    anchor = torch.zeros(1, in_features)
    anchor[0, 0], anchor[0, 1] = 1.0, -1.0
    return anchor


class QuantLinear(nn.Module):
    """A quantized replacement for nn.Linear (inference only).

    kind "int8": `weight` int8 [N, K], `scales` bf16 [N].
    kind "int4": `weight` packed uint8 (the CPU kernel's layout), `scales` bf16 [K/g, N, 2].
    Both compute in bf16 (the kernels' vectorised path).
    kind "int8-dyn": `weight` int8 [N, K], `scales` bf16 [N], computed by specgen's int8
    kernel (int8.py); where it cannot be built, packed for fbgemm on the first call
    (`packed`, in pieces: `prepack_int8`; `weight` and `scales` are then None). Activations
    are quantized in fp32: each row alone when `batch_invariant` (a verifier's layers), else
    one scale per call (a draft's: no draft token's result need be independent of the others
    in its pass). Both give fbgemm's bits.
    kind "int4-dyn": `weight` packed int4 uint8 [N, K/32, 16], `scales` float16 [2, N, K/32]
    (int4.quantize), computed by specgen's kernel: batch-invariant by construction up to a
    verify pass's width; a draft's wider passes take the kernel's tiles sooner (int4.path_for).
    Inputs of any float dtype; the output is cast back to the input's dtype."""

    def __init__(self, in_features: int, out_features: int, kind: str, group_size: int,
                 weight: Tensor | None, scales: Tensor | None, bias: Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kind, self.group_size = kind, group_size
        self.batch_invariant = True
        self.joined: Joined | None = None  # int4-dyn layers that share their input (join_int4_dyn)
        if kind == "int8-dyn":
            self.packed = None  # fbgemm's weight, where specgen's kernel cannot be built
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str) -> QuantLinear:
        global quantized_layers
        w = linear.weight.detach()
        n, k = w.shape
        bias = None if linear.bias is None else linear.bias.detach().clone()
        group = int4_group_size(k, n) if scheme == "int4-wo" else None
        quantized_layers += 1
        if scheme == "int8-dyn" or (scheme == "int4-dyn" and k % int4.BLOCK):
            return cls(k, n, "int8-dyn", 0, *quantize_int8(w), bias)
        if scheme == "int4-dyn":
            return cls(k, n, "int4-dyn", int4.BLOCK, *int4.quantize(w), bias)
        if group is None:  # int8, or int4 on an input the kernel's groups cannot divide
            q, scale = quantize_int8(w)
            return cls(k, n, "int8", 0, q, scale, bias)
        q, sz = quantize_int4(w, group)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
        return cls(k, n, "int4", group, packed, sz, bias)

    def stored(self) -> tuple[Tensor, Tensor]:
        """The (weight, scales) pair to save: the buffers, or fbgemm's weight unpacked."""
        if self.joined is not None:
            return self.joined.stored(self)
        if self.kind == "int8-dyn" and self.packed is not None:
            return unpack_int8(self.packed)
        return self.weight, self.scales

    def fbgemm_weight(self) -> tuple:
        """An int8-dyn layer's weight packed for fbgemm (packed on the first call; fbgemm keeps
        its own copy, so ours is dropped)."""
        if self.packed is None:
            self.packed = prepack_int8(self.weight, self.scales)
            self.weight = self.scales = None
        return self.packed

    def dyn(self, x: Tensor) -> Tensor:
        """An int8-dyn layer's output (float32, no bias) for x [M, K] float32."""
        if self.weight is not None and int8.library() is not None:
            return int8.linear(x, self.weight, self.scales, exact=self.batch_invariant)
        if not self.batch_invariant:
            return linear_int8_dyn(x, self.fbgemm_weight())
        amax = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
        rows = torch.cat([x / amax, row_anchor(self.in_features)])
        return linear_int8_dyn(rows, self.fbgemm_weight())[:-1] * amax

    def _mm(self, x: Tensor) -> Tensor:
        if self.kind == "int8":
            return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight, self.group_size, self.scales)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        if self.joined is not None:
            return self.joined.output(self, x)
        if self.kind == "int4-dyn":
            bias = None if self.bias is None else self.bias.float()
            y = int4.linear(x.reshape(-1, self.in_features).float(), self.weight, self.scales, bias,
                            exact=self.batch_invariant)
            return y.to(x.dtype).reshape(*shape[:-1], self.out_features)
        if self.kind == "int8-dyn":
            # reduce_range (7-bit activations) keeps vpmaddubsw's int16 pair sums from saturating
            y = self.dyn(x.reshape(-1, self.in_features).float()).to(x.dtype)
            if self.bias is not None:
                y = y + self.bias.to(x.dtype)
            return y.reshape(*shape[:-1], self.out_features)
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        if x2.shape[0] <= ROWS_PER_CALL:
            y = self._mm(x2)
        else:
            y = torch.cat([self._mm(c) for c in x2.split(ROWS_PER_CALL)])
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.kind == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"kind={self.kind}{group}, bias={self.bias is not None}")


def join_int8_dyn(layers: list[QuantLinear]) -> QuantLinear:
    """One int8-dyn layer computing draft `layers` that read the same input, their outputs
    side by side (its bias: `joined_bias`): fewer, larger calls for a draft's q/k/v and
    gate/up projections. A draft layer's input is scaled once per call, the same for every
    layer on that input, so the joined call gives each layer's output as its own call does.
    A single layer is itself; joined ones are a new copy (the layers stay whole for
    transformers' forward)."""
    if len(layers) == 1:
        return layers[0]
    weights, scales = zip(*(layer.stored() for layer in layers))
    joined = QuantLinear(layers[0].in_features, sum(layer.out_features for layer in layers),
                         "int8-dyn", 0, torch.cat(weights), torch.cat(scales), joined_bias(layers))
    joined.batch_invariant = False
    return joined


def joined_bias(layers: list[QuantLinear]) -> Tensor | None:
    """The biases of layers whose outputs are joined side by side (float32; zeros for a layer
    without one), or None when none has a bias."""
    if all(layer.bias is None for layer in layers):
        return None
    return torch.cat([torch.zeros(layer.out_features) if layer.bias is None else layer.bias.float()
                      for layer in layers])


SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # siblings on one input


class Joined:
    """int4-dyn layers that read the same input (a decoder layer's q/k/v projections, its
    gate/up ones), computed by one kernel call: the first layer called computes every
    layer's output, the others take theirs. The kernel computes each output row on its own,
    so each layer's output is bit-identical to its own call; one call quantizes the input
    once and streams the small k/v weights with q's. A layer
    called with another input tensor, or twice, starts a new call. (The input is known by
    identity: inference tensors keep no version counter, and no decoder changes its
    projections' input in place between them.)"""

    def __init__(self, layers: list[QuantLinear], packed: Tensor | None = None,
                 scales: Tensor | None = None, bias: Tensor | None = None) -> None:
        """The layers' weights joined here, or given joined (`packed`, `scales`, `bias`:
        loaded from the cache as `packed_state` stored them)."""
        if packed is None:
            packed = torch.cat([layer.weight for layer in layers])
            scales = torch.cat([layer.scales for layer in layers], dim=1)
            bias = joined_bias(layers)
        self.packed, self.scales, self.bias = packed, scales, bias
        self.index = {id(layer): i for i, layer in enumerate(layers)}
        self.sizes = [layer.out_features for layer in layers]
        self.input: Tensor | None = None
        self.pending: dict[int, Tensor] = {}

    @classmethod
    def from_tensors(cls, layers: list[QuantLinear], packed: Tensor, scales: Tensor,
                     bias: Tensor | None) -> Joined:
        return cls(layers, packed, scales, bias)

    def output(self, layer: QuantLinear, x: Tensor) -> Tensor:
        i = self.index[id(layer)]
        if x is not self.input or i not in self.pending:
            y = int4.linear(x.reshape(-1, layer.in_features).float(), self.packed, self.scales,
                            self.bias, exact=layer.batch_invariant)
            self.pending = dict(enumerate(y.split(self.sizes, dim=-1)))
            self.input = x
        y = self.pending.pop(i)
        if not self.pending:
            self.input = None  # nothing left to hand out: do not hold the input
        return y.to(x.dtype).contiguous().reshape(*x.shape[:-1], layer.out_features)

    def stored(self, layer: QuantLinear) -> tuple[Tensor, Tensor]:
        """The layer's own (weight, scales), cut out of the joined ones."""
        i = self.index[id(layer)]
        start = sum(self.sizes[:i])
        rows = slice(start, start + self.sizes[i])
        return self.packed[rows].clone(), self.scales[:, rows].contiguous()


def join_int4_dyn(model: nn.Module) -> None:
    """Join each group of SHARED_INPUT siblings that are all int4-dyn layers on one input size.
    The joined weights replace the layers' own (no second copy)."""
    for parent in model.modules():
        for names in SHARED_INPUT:
            layers = [getattr(parent, name, None) for name in names]
            if not all(isinstance(layer, QuantLinear) and layer.kind == "int4-dyn"
                       and layer.joined is None for layer in layers):
                continue
            if len({layer.in_features for layer in layers}) > 1:
                continue
            joined = Joined(layers)
            for layer in layers:
                layer.joined, layer.weight, layer.scales = joined, None, None


# --- applying to a model; its packed form for an on-disk cache ------------------------------

def apply(model: nn.Module, scheme: str, verifier: bool = True) -> nn.Module:
    """Replace every nn.Linear of `model` (lm_head included) in place with a QuantLinear for
    `scheme` (one of choices.CPU_SCHEMES), and return the model. A verifier's (a target's)
    dynamic layers compute each row alone; a draft's need no such care. A model whose layers
    are already quantized (loaded packed, `attach`) only gets its role set. The rest of what
    a model needs for its role is kernels.prepare's. CPU only: the packed kernels have no
    CUDA path here."""
    if scheme not in CPU_SCHEMES:
        raise ConfigError(f"Unknown quantization scheme {scheme!r}: choose one of "
                          f"{', '.join(CPU_SCHEMES)}.")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    devices = {p.device.type for m in linears.values() for p in m.parameters()}
    if devices - {"cpu"}:
        raise ResourceError(
            f"{scheme} uses CPU kernels, but the model is on {', '.join(sorted(devices - {'cpu'}))}. "
            "Load it on the CPU, or on CUDA use int4-gpu or the bitsandbytes schemes (nf4, fp4, int8).")
    if scheme == "int4-dyn":
        int4.library()  # no AVX2 or no compiler: say so before quantizing, not at first use
    if scheme == "int8-dyn" and int8.library() is None:
        check_fbgemm()
    names = list(linears)
    del linears  # each float layer is freed as soon as it is replaced: the peak stays one model
    for name in names:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, QuantLinear.from_linear(getattr(owner, attr), scheme))
    for layer in model.modules():
        if isinstance(layer, QuantLinear):
            layer.batch_invariant = verifier  # only a verifier's rows are quantized each alone
    if scheme == "int4-dyn":
        join_int4_dyn(model)
    return model


def flavour(scheme: str) -> str:
    """What the packed bytes of `scheme` depend on besides the weights: int4-wo's packing
    differs between CPU kernel builds (AVX512 packs 64 columns, AVX2 32) and torch releases;
    the other schemes' bytes are specgen's own and the same everywhere."""
    if scheme != "int4-wo":
        return ""
    return f"{torch.backends.cpu.get_cpu_capability()}-torch{torch.__version__.split('+')[0]}"


def packed_state(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    """The tensors of a quantized model's QuantLinears, by name, and the table (plain JSON
    data) that `attach` rebuilds them from. Joined int4-dyn layers are stored joined, so a
    load maps them as they run, with no copy."""
    tensors: dict[str, Tensor] = {}
    layers: dict[str, dict] = {}
    groups: list[dict] = []
    joined_seen: dict[int, int] = {}

    def put(key: str, t: Tensor | None) -> str | None:
        if t is None:
            return None
        tensors[key] = t.contiguous()
        return key

    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear):
            continue
        row = {"kind": m.kind, "in": m.in_features, "out": m.out_features, "group": m.group_size,
               "bias": put(f"{name}.bias", m.bias), "weight": None, "scales": None, "joined": None}
        if m.joined is not None:
            j = m.joined
            if id(j) not in joined_seen:
                joined_seen[id(j)] = len(groups)
                groups.append({"layers": [], "packed": put(f"{name}.joined.packed", j.packed),
                               "scales": put(f"{name}.joined.scales", j.scales),
                               "bias": put(f"{name}.joined.bias", j.bias)})
            row["joined"] = joined_seen[id(j)]
            groups[row["joined"]]["layers"].append(name)
        else:
            weight, scales = m.stored()
            row["weight"], row["scales"] = put(f"{name}.weight", weight), put(f"{name}.scales", scales)
        layers[name] = row
    return tensors, {"format": FORMAT_VERSION, "layers": layers, "joined": groups}


def attach(model: nn.Module, table: dict, tensor: Callable[[str], Tensor],
           verifier: bool = True) -> nn.Module:
    """Put the QuantLinears described by `table` (from `packed_state`) into `model` in place
    of its linear layers, which may be on the meta device: nothing unquantized is allocated.
    `tensor(key)` gives a stored tensor, which the layer computes from as it is."""
    if table.get("format") != FORMAT_VERSION:
        raise ConfigError(f"packed layers of format {table.get('format')}, expected {FORMAT_VERSION}")
    get = lambda key: None if key is None else tensor(key)  # noqa: E731
    for name, row in table["layers"].items():
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        layer = QuantLinear(row["in"], row["out"], row["kind"], row["group"], get(row["weight"]),
                            get(row["scales"]), get(row["bias"]))
        layer.batch_invariant = verifier
        setattr(owner, attr, layer)
    for group in table["joined"]:
        layers = [model.get_submodule(name) for name in group["layers"]]
        joined = Joined.from_tensors(layers, get(group["packed"]), get(group["scales"]),
                                     get(group["bias"]))
        for layer in layers:
            layer.joined = joined
    return model
