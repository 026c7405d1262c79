"""fp32 linear layers on a CPU, computed as W @ x.T so that verifying K drafts stays cheap.

`F.linear(x, W)` over a few rows (the pending token plus K drafts) runs a GEMM that is far
dearer than the one-row matvec: measured on an AVX2 CPU (torch 2.13, 2 threads), a 1536->8960
fp32 layer took 5.9 ms for one row and 22.6 ms for five. The same product taken the other way
round, `W @ x.T`, streams the weight once for all rows: 5.7 ms for one row, 6.5 ms for five,
and it was no slower at any row count measured (1 to 1024). On the demo target a whole forward
over five tokens fell from 3.3–3.9 to 1.6–1.7 single-token forwards. bf16 is left alone: there the
swapped product was slower. Numbers and method: bench/NOTES.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class WeightMajorLinear(nn.Linear):
    """nn.Linear with the product taken as W @ x.T; same parameters, same result."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).t()
        if self.bias is None:
            y = torch.mm(self.weight, rows)
        else:
            y = torch.addmm(self.bias[:, None], self.weight, rows)
        return y.t().reshape(*x.shape[:-1], self.out_features)


def use_weight_major_linears(model: nn.Module) -> int:
    """Switch the model's plain fp32 CPU nn.Linear layers to WeightMajorLinear in place (no
    copy: the class changes, the parameters stay). Quantized and other subclassed layers are
    left as they are. Returns how many layers were switched."""
    switched = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if type(module) is nn.Linear and w.device.type == "cpu" and w.dtype == torch.float32:
            module.__class__ = WeightMajorLinear
            switched += 1
    return switched
