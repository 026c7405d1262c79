"""The ops around a quantized target's matmuls three ways, side by side on one model:
PyTorch's (RMSNorm, rotary embedding, one attention call per row), cpu_rows.c's RMSNorm and
attention, and cpu_rows.c with the lean decoder's rotary, cache write and attention in one
call (what specgen runs). Passes of the lean target decoder over M new tokens after 64 of
context, the three interleaved; first checks that the lean forward's logits equal
transformers' forward's, bit for bit.

    SPECGEN_CACHE_DIR=... python bench/cpu_rows_ab.py --model <fp32 model folder>
        [--scheme int4-dyn] [--rounds 10]

Prints the minimum and median ms per pass of each variant.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from specgen import cpu_rows, decoder, quantize
from specgen.models import cache_dir

PROMPT = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n" * 8
VARIANTS = ("pytorch", "C", "C, rotary joined")
STOCK_NORMS = {"llama": LlamaRMSNorm, "qwen2": Qwen2RMSNorm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a float32 Llama/Qwen2 model folder")
    ap.add_argument("--scheme", default="int4-dyn", choices=quantize.DYNAMIC)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    quantize.apply(model, args.scheme, cache_dir() / "quantized", f"bench:{args.model}")
    norms = [m for m in model.modules() if isinstance(m, cpu_rows.RowRMSNorm)]
    ids = torch.tensor(AutoTokenizer.from_pretrained(args.model)(PROMPT)["input_ids"][:80])
    lib, real = cpu_rows.library(), decoder.cpu_rows
    assert lib is not None and norms, "cpu_rows.c did not build here"
    stock_norm = STOCK_NORMS[model.config.model_type]  # quantize.apply switched them to C
    not_joined = types.SimpleNamespace(usable=lambda x, d: False)

    def use(variant: str) -> None:
        pytorch = variant == "pytorch"
        cpu_rows._lib, cpu_rows._unavailable = (None, True) if pytorch else (lib, False)
        for norm in norms:
            norm.__class__ = stock_norm if pytorch else cpu_rows.RowRMSNorm
        decoder.cpu_rows = real if variant == "C, rotary joined" else not_joined

    lean, hf = decoder.make_decoder(model, exact=True), decoder.HFDecoder(model)
    times = {(v, m): [] for v in VARIANTS for m in (1, 5)}
    with torch.inference_mode():
        use("C, rotary joined")
        same = [torch.equal(lean.logits(ids[a:b], n), hf.logits(ids[a:b], n))
                for a, b, n in ((0, 64, 1), (64, 65, 1), (65, 70, 5), (70, 71, 1))]
        print(f"lean forward == transformers' forward, bit for bit: {same}")
        lean.crop(64)
        for _ in range(args.rounds):
            for variant in VARIANTS:
                use(variant)
                for m in (1, 5):
                    for _ in range(3):
                        start = time.perf_counter()
                        lean.logits(ids[64:64 + m], m)
                        times[variant, m].append(time.perf_counter() - start)
                        lean.crop(64)
    use("C, rotary joined")
    for (variant, m), ts in times.items():
        print(f"{args.scheme} M={m} {variant}: min {1e3 * min(ts):.1f} ms, "
              f"median {1e3 * statistics.median(ts):.1f} ms")


if __name__ == "__main__":
    main()
