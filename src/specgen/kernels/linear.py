"""fp32 and bf16 linear layers on a CPU, computed so that verifying K drafts stays cheap and
exact.

PyTorch's `F.linear(x, W)` over a few rows (the pending token plus K drafts) runs a GEMM that
costs far more than the one-row matvec, and adds a row's products in an order that depends on
the number of rows. `linear.c` reads each weight row once for all rows of a pass and sums each
output by the same instructions whatever the number of rows, so a pass over a few tokens costs
about one over a single token, and a token's logits never depend on the drafts verified with
it. bf16 runs the fastest path this CPU has (`bf16_path`): AMX tiles, AVX512-BF16 or AVX2.
The AVX2 path (fp32, and bf16 where nothing faster runs) holds more sums at once where
AVX512VL gives it 32 vector registers, with the same bits (`avx2_registers`).
In fp32, passes wider than FP32_ROWS (a long prompt) go to `W @ x.T`, which streams the
weight once for all rows too. Where the library cannot be built (no C compiler, no AVX2) the
layers keep PyTorch's products.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specgen.kernels import build
from specgen.kernels.build import C, I, P

STEM = "linear"
# fp32 passes up to this many rows go to the C kernel, wider ones (a prompt) to W @ x.T, which
# adds a row's products in another order: wider than any verify pass (choices.MAX_K + 1).
FP32_ROWS = 48


FUNCTIONS = {
    "dense_linear": C((P, P, P, P, I, I, I, I, I, I)),
    "avx2_registers": C((I,), I),
    "bf16_path": C((), I),
}


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be built."""
    return build.load(STEM, "specgen's linear kernel", FUNCTIONS)


AVX2, DOT, AMX = 0, 1, 2  # the kernel's bf16 paths (linear.c)


@functools.cache
def bf16_path() -> int:
    """The fastest bf16 path this CPU runs: AMX tiles, AVX512-BF16 `vdpbf16ps`, or AVX2."""
    lib = library()
    return AVX2 if lib is None or build.avx2_only() else lib.bf16_path()


@contextlib.contextmanager
def avx2_registers(n: int) -> Iterator[int]:
    """Within: the AVX2 path's tiles use n vector registers, 16 or 32 (where the CPU has
    AVX512VL; the most it has otherwise). Both give the same bits; tests and benches compare
    them. Yields the number in use."""
    lib = library()
    was = lib.avx2_registers(n)
    try:
        yield lib.avx2_registers(0)
    finally:
        lib.avx2_registers(was)


def linear(rows: Tensor, weight: Tensor, bias: Tensor | None, path: int | None = None) -> Tensor:
    """rows [M, K] @ weight [N, K].T (+ bias [N]) by the C kernel; all fp32 or all bf16. bf16
    takes `bf16_path()` unless `path` names a slower one (tests and benches compare them)."""
    rows = rows.contiguous()
    best = bf16_path()  # also where Linux is asked, once, to let this process use AMX tiles
    if path is not None and path > best:
        raise ValueError(f"this CPU has no bf16 path {path} (its fastest is {best})")
    path = best if path is None else path
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=rows.dtype)
    library().dense_linear(rows.data_ptr(), weight.data_ptr(),
                           None if bias is None else bias.data_ptr(), y.data_ptr(),
                           rows.shape[0], rows.shape[1], weight.shape[0],
                           int(rows.dtype == torch.bfloat16), path, torch.get_num_threads())
    return y


class DecodeLinear(nn.Linear):
    """nn.Linear on a CPU in fp32 or bf16, its product taken by `linear` (same parameters)."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        wide = x.dtype == torch.float32 and rows.shape[0] > FP32_ROWS
        grad = torch.is_grad_enabled() and self.weight.requires_grad  # the kernel has no backward
        if not wide and not grad and x.dtype == self.weight.dtype and library() is not None:
            y = linear(rows, self.weight, self.bias)
        elif x.dtype == torch.float32:  # W @ x.T streams the weight once for all rows
            y = rows.t()
            y = (torch.mm(self.weight, y) if self.bias is None
                 else torch.addmm(self.bias[:, None], self.weight, y)).t()
        else:
            y = F.linear(rows, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


def use_decode_linears(model: nn.Module) -> int:
    """Switch the model's plain fp32 and bf16 CPU nn.Linear layers to DecodeLinear in place
    (no copy: the class changes, the parameters stay) where the library builds. Quantized
    and other subclassed layers are left as they are. Returns how many layers were switched."""
    if library() is None:
        return 0
    switched = 0
    for module in model.modules():
        if (type(module) is nn.Linear and module.weight.device.type == "cpu"
                and module.weight.dtype in (torch.float32, torch.bfloat16)):
            module.__class__ = DecodeLinear
            switched += 1
    return switched
