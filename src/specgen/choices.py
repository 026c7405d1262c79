"""The named choices of a profile and the command line, declared once: profiles validate
against these, the CLI's help lists them, and the loaders and kernels dispatch on them.
No imports beyond the standard library, so any layer may use it."""

from __future__ import annotations

# Floating-point types a model may run in ("auto": bf16 where it is fast, else fp16 / fp32).
DTYPES = ("auto", "bfloat16", "float16", "float32")

# Quantization schemes. bitsandbytes' run on CUDA (and, more slowly, on a CPU); specgen's own
# CPU schemes (kernels/quantize.py) are weight-only (`-wo`: float activations) or dynamic
# (`-dyn`: int8 activations quantized per token, every row computed alone).
BNB_SCHEMES = ("nf4", "fp4", "int8")
CPU_SCHEMES = ("int8-wo", "int4-wo", "int8-dyn", "int4-dyn")
DYNAMIC_SCHEMES = ("int8-dyn", "int4-dyn")
# A GGUF file's own quantization, its blocks computed as stored by specgen's CPU kernels
# (kernels/gguf.py, loading/stored.py): no conversion, every row computed alone.
STORED_SCHEME = "gguf"
# CUDA only: 4-bit weight-only through PyTorch's tinygemm kernel (kernels/cuda_int4.py), whose
# cost stays flat up to 16 tokens a pass.
GPU_SCHEMES = ("int4-gpu",)
QUANTIZATIONS = ("none", STORED_SCHEME, *BNB_SCHEMES, *CPU_SCHEMES, *GPU_SCHEMES)
# Bytes a weight of a quantized linear layer takes (4-bit counts its block scales).
QUANT_BYTES = {"nf4": 0.53, "fp4": 0.53, "int8": 1.0, "int8-wo": 1.0, "int4-wo": 0.53,
               "int8-dyn": 1.0, "int4-dyn": 0.63, "int4-gpu": 0.53,
               STORED_SCHEME: 0.63}  # a Q4_K_M file's mix; the loader counts the file itself

# Heads that draft from the target's own hidden states (heads/): EAGLE-1/2, EAGLE-3, Medusa-1.
HEAD_KINDS = ("eagle", "eagle3", "medusa")
# Heads `specgen heads train` fits to a target.
TRAINABLE_HEADS = ("eagle", "medusa")

# Who drafts: a second model, the prompt itself (n-gram lookup), lookup first and a model
# otherwise (the draft model; without one, the target itself), the target itself with some of
# its sub-layers skipped (self-speculative drafting), or a head of the profile's [draft] (its
# kind names the method).
METHODS = ("draft-model", "prompt-lookup", "hybrid", "self", *HEAD_KINDS)
# Methods that run a [draft] model: draft-model needs one; hybrid without one runs self.
MODEL_METHODS = ("draft-model", "hybrid")
# What a profile drafts with unless it says: the hybrid where it has a draft model (each step
# goes to prompt lookup or the draft by measured yield, the draft joining once its reading of
# the prompt pays), else prompt lookup. The output is exactly the target's whatever the method.
DEFAULT_METHOD, DEFAULT_METHOD_WITHOUT_DRAFT = "hybrid", "prompt-lookup"

# `specgen bench`'s contestants by name (bench/runner.py says what each runs).
CONTESTANTS = ("baseline", "plain", "peer", "k2", "k4", "k6", "adaptive", "lookup", "hybrid",
               "chain", "self", "self-default", "hybrid-self", *HEAD_KINDS, "bf16", "llamacpp",
               "llamacpp-spec", "api")

# llama.cpp's own speculative decoding in `specgen bench` (contestant llamacpp-spec): at most
# n_max draft tokens a step, a draft ending where the draft's probability falls below p_min.
# The best of a sweep on the demo pair (docs/benchmarks.md); --llamacpp-draft sets others.
LLAMACPP_DRAFT_N_MAX, LLAMACPP_DRAFT_P_MIN = 16, 0.75

# What runs a model: transformers, or (a GGUF draft only) llama.cpp on its own weights.
RUNTIMES = ("transformers", "llama.cpp")

# Draft tokens a step may verify: 0 turns speculation off. A verify pass of MAX_K + 1 rows
# stays narrower than the passes the CPU kernels compute by another method (kernels.linear
# FP32_ROWS, kernels.int4 tile paths), so every token's logits are those of a one-token pass.
MIN_K, MAX_K = 0, 32

# Rows a token tree's verify pass may have, its root (the pending token) included: the chain
# and its branches (core/tree.py). Within MAX_K + 1, and the width of a GPU decoder's static
# tree tables (decoding/cuda.py).
MAX_TREE_ROWS = 16

# A draft forward reading fewer unread context tokens than this costs about one pass (passes
# are flat at such widths): only a longer reading is a catch-up, timed, charged and measured
# as one (core/adaptive.py).
CATCH_UP_TOKENS = 8

# The fewest context tokens a draft model may be limited to reading (speculation.draft_window;
# 0 reads the whole context): fewer leaves it too little text to guess from.
MIN_DRAFT_WINDOW = 16


def listing(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """'a, b or c': a choice list for help texts and error messages."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
