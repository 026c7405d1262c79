"""How a model runs over its KV cache. Every decoder answers the same small interface:

    hidden(ids, n)  the last n positions' final hidden states (after the last norm), [n, H]
    logits(ids, n)  their logits, [n, V]
    crop(length)    forget cached positions beyond `length` (rollback is a length)
    reset()         forget everything
    length          positions cached

Each kind's optional abilities are declared on the `Decoder` base (base.py), with their
defaults: the lean and CUDA decoders verify a token tree in one pass (`verifies_trees`:
`tree_logits(ids, parents)`, then `keep_branch(nodes)`: core/tree.py), and the engine builds
trees only where a decoder does; a static cache is made ready by `reserve`.

A target's decoder also keeps, when a drafting head asks (`capture_layers` not None), each
pass's hidden states in `captured` (capture.py).

`HFDecoder` is transformers' own forward (any architecture); `LeanDecoder` calls a
Llama-family model's layers directly (hf.py, lean.py); `CudaDecoder` does so on a GPU over a
static cache, replaying each small width from a CUDA graph (cuda.py); `FusedDecoder` is
CudaDecoder with specgen's own Triton kernels for those widths (fused.py). llama.cpp's draft
runtime answers the same interface (llamacpp.py).

A decoder whose `skips` is true (lean and cuda) also takes `skip` (a `Skip`: attention and MLP
sub-layers to leave out) in `hidden` and `logits`: self-speculative drafting runs the target's
own layers that way, over the target's own cache (core/drafters.py, SelfDrafter).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from torch import Tensor

from specgen.decoding.base import Decoder  # noqa: F401 (the interface, for core/)
from specgen.decoding.cuda import CudaDecoder, on_one_gpu
from specgen.decoding.fused import FusedDecoder, fused_supported
from specgen.decoding.lean import LeanDecoder, attends_by_rows, lean_supported
from specgen.errors import ModelError
from specgen.kernels.gpu import available

if TYPE_CHECKING:  # transformers' model code is imported only where a model needs it
    from transformers import PreTrainedModel

    from specgen.decoding.hf import HFDecoder  # noqa: F401 (a lazy attribute, below)


def make_decoder(model: PreTrainedModel, exact: bool = False
                 ) -> HFDecoder | LeanDecoder | CudaDecoder:
    """The fastest decoder that serves the model. `exact`: on a CPU, it must compute what
    transformers' forward computes, bit for bit (a target's). On one GPU a Llama-family model
    gets the CUDA decoder in either role, with specgen's own kernels (FusedDecoder: a verify
    pass gives each row the bits of a one-token pass) where Triton runs and its layers are
    plain linears, else with PyTorch's (no verify pass row for row: docs/exactness.md).
    SPECGEN_FUSED_KERNELS=0 keeps PyTorch's ops; SPECGEN_CUDA_DECODER=0 keeps transformers'
    forward on a GPU."""
    if on_one_gpu(model) and lean_supported(model) and os.environ.get("SPECGEN_CUDA_DECODER") != "0":
        if (os.environ.get("SPECGEN_FUSED_KERNELS") != "0" and fused_supported(model)
                and available(model.device)):
            return FusedDecoder(model)
        return CudaDecoder(model)
    lean = lean_supported(model) and (attends_by_rows(model) or not exact)
    if lean:
        return LeanDecoder(model)
    if getattr(model, "lean_only", False):  # specgen's own tree has no transformers forward
        raise ModelError("this model was loaded for the lean decoder, which cannot serve it as "
                         "an exact target here (its layers do not compute each row alone)")
    from specgen.decoding.hf import HFDecoder

    return HFDecoder(model)


def __getattr__(name: str):
    """`HFDecoder` on first use: its module imports transformers' cache code, which a model
    run by the lean decoder never needs."""
    if name == "HFDecoder":
        from specgen.decoding.hf import HFDecoder

        return HFDecoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
