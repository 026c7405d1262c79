"""What bitsandbytes 4/8-bit costs on CPU: plain greedy decode tokens/s of one model in
bf16 vs nf4 vs int8 (LLM.int8), same prompt, same number of tokens.

    python bench/bnb_cpu.py MODEL_DIR [--tokens 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig


def decode_rate(model, ids: torch.Tensor, tokens: int) -> tuple[float, list[int]]:
    model.generate(ids, do_sample=False, max_new_tokens=2)  # warm-up
    start = time.perf_counter()
    out = model.generate(ids, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens)
    return tokens / (time.perf_counter() - start), out[0, ids.shape[1]:].tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = tok("def quicksort(xs):\n", return_tensors="pt")["input_ids"]
    configs = {
        "bf16": None,
        "nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=torch.bfloat16),
        "int8": BitsAndBytesConfig(load_in_8bit=True),
    }
    base = None
    for name, config in configs.items():
        kwargs = {"quantization_config": config} if config else {}
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, **kwargs).eval()
        rate, toks = decode_rate(model, ids, args.tokens)
        base = base or (rate, toks)
        same = sum(a == b for a, b in zip(toks, base[1]))
        print(f"{name:5s} {rate:6.2f} tok/s  {rate / base[0]:5.2f}x bf16  "
              f"{same}/{args.tokens} tokens equal to bf16", flush=True)
        del model


if __name__ == "__main__":
    main()
