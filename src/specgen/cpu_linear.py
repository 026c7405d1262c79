"""fp32 and bf16 linear layers on a CPU, computed so that verifying K drafts stays cheap.

PyTorch's `F.linear(x, W)` over a few rows (the pending token plus K drafts) runs a GEMM that
is far dearer than the one-row matvec: on an AVX2 CPU (torch 2.13, 2 threads) a 1536->8960
layer over 17 rows cost 3.5x one row in fp32 and 13x in bf16, whose products PyTorch emulates
there. `cpu_linear.c` reads each weight row once for all rows of a pass and sums each output
by the same instructions whatever the number of rows, so a pass over a few tokens costs about
one over a single token (bench/NOTES.md, Round 14), and a token's logits never depend on the
drafts verified with it. bf16 runs the fastest path this CPU has (`bf16_path`): AMX tiles,
AVX512-BF16 or AVX2. On the AVX2 CPU it beat PyTorch at every width measured from 2 rows to
256 (at one row they were about even); on the AMX test machine a 17-token pass of the demo
target cost 1.31 one-token passes, and the AMX path beat PyTorch at every width up to 17 rows
and took 0.6-1.3x its time at 33-256 (long prompts; Round 15). So it takes every bf16 pass. In fp32,
passes wider than FP32_ROWS (a long prompt) go to `W @ x.T`, which streams the weight once
for all rows too. Where the library cannot be built (no C compiler, no AVX2) the layers keep
those products.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specgen import cbuild
from specgen.row_attention import use_row_attention

SOURCE = Path(__file__).with_name("cpu_linear.c")
# fp32 passes up to this many rows go to the C kernel, wider ones (a prompt) to W @ x.T, which
# adds a row's products in another order: wider than any verify pass (profiles.MAX_K + 1).
FP32_ROWS = 48


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be built."""
    lib = cbuild.build_if_possible(SOURCE, "specgen's linear kernel")
    if lib is not None:
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.dense_linear.argtypes = [p, p, p, p, i, i, i, i, i, i]
    return lib


AVX2, DOT, AMX = 0, 1, 2  # the kernel's bf16 paths (cpu_linear.c)


@functools.cache
def bf16_path() -> int:
    """The fastest bf16 path this CPU runs: AMX tiles, AVX512-BF16 `vdpbf16ps`, or AVX2."""
    lib = library()
    return AVX2 if lib is None else lib.bf16_path()


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


def use_decode_linears(model: nn.Module, verifier: bool = False) -> int:
    """Switch the model's plain fp32 and bf16 CPU nn.Linear layers to DecodeLinear in place
    (no copy: the class changes, the parameters stay). Quantized and other subclassed layers
    are left as they are. A verifier's attention then goes row by row (row_attention.py)
    where the kernel builds: with every linear computing each row alone, a verify pass gives
    each token the logits of a one-token pass, so greedy speculation reproduces the target's
    own greedy output in bf16 as in fp32. Returns how many layers were switched."""
    switched = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (type(module) is nn.Linear and w.device.type == "cpu"
                and w.dtype in (torch.float32, torch.bfloat16)):
            module.__class__ = DecodeLinear
            switched += 1
    if switched and verifier and library() is not None and hasattr(model, "set_attn_implementation"):
        use_row_attention(model)
    return switched
