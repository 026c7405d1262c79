"""Triton's interpreter (CPU runs of specgen's GPU kernels) with a dot product that sums each
row of its result in one fixed order, whatever the shape of the operands.

The interpreter computes `tl.dot` by numpy's matmul, and so by the BLAS numpy was built with,
whose order of summation may depend on how many rows the operands have: on a Zen 5 VM,
OpenBLAS's own choice of kernel (and its Haswell and Zen kernels, forced) gave a row other bits
in a tile of another height; its SkylakeX kernels did not. The GPU tests ask whether
specgen's kernels keep each row's sums apart from the other rows' (row tiles, K parts, chunks);
a BLAS that does not would fail them for reasons of its own."""

from __future__ import annotations

import numpy as np


def install() -> None:
    """Float dots in float64, each output's products summed along k by numpy's reduction (the
    same way for every row, whatever the number of rows), then rounded to the accumulator's
    type; integer and fp8 dots as the interpreter has them."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "row_exact", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = d.data.dtype
        eight_bit_float = any(x.dtype.primitive_bitwidth == 8 and x.dtype.is_floating() for x in (a, b))
        if eight_bit_float or not np.issubdtype(out, np.floating):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        products = a.data.astype(np.float64)[..., :, :, None] * b.data.astype(np.float64)[..., None, :, :]
        total = np.add.reduce(products, axis=-2).astype(out)  # over k, per output
        return interpreter.TensorHandle(total + d.data, d.dtype.scalar)

    create_dot.row_exact = True
    builder.create_dot = create_dot
