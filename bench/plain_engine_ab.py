"""Plain greedy decoding two ways, side by side: transformers' `generate` (the bench's baseline)
against specgen's own loop with speculation off (K = 0), interleaved prompt by prompt with the
order alternating, so that machine drift hits both alike. With an int8-dyn or int4-dyn target
specgen's loop runs the lean target forward (`decoder.py`); the tokens must be the same.

    SPECGEN_CACHE_DIR=... python bench/plain_engine_ab.py
        [--profile qwen-coder-demo-int8] [--target-quantization int4-dyn]
        [--prompts FILE.jsonl] [--max-new-tokens 128] [--out FILE.json]

Prints tokens/s per prompt and their geometric means, and whether the tokens are equal.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specgen import bench as b
from specgen.profiles import load_profile, with_overrides
from specgen.session import encode_messages, messages_for, open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8")
    ap.add_argument("--target-quantization")
    ap.add_argument("--prompts", type=Path, help="JSONL of {category, prompt} (default: built-in set)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()

    prof = with_overrides(load_profile(args.profile), target_quantization=args.target_quantization,
                          temperature=0.0)
    session = open_session(prof)
    runner = b.Bench(session.pair.target, session.pair.draft, args.max_new_tokens, session.eos_ids())
    ways = {"generate": b.contestants()["baseline"], "specgen K=0": b.Contestant("k0", "specgen")}
    prompts = b.read_prompts(args.prompts) if args.prompts else b.builtin_prompts()

    rows = []
    for i, p in enumerate(prompts):
        ids = encode_messages(session.tokenizer, messages_for(p.prompt, None), prof.generation.chat_template)
        order = list(ways) if i % 2 == 0 else list(reversed(ways))
        runs = {name: runner.measure(ways[name], ids) for name in order}
        row = {"prompt": i, "category": p.category, "new_tokens": len(runs["generate"][0]),
               "equal": runs["generate"][0] == runs["specgen K=0"][0],
               **{name: st.tokens_per_second for name, (_, st) in runs.items()}}
        rows.append(row)
        print(f"{i + 1:2d} {p.category:17s} generate {row['generate']:5.2f} tok/s | specgen K=0 "
              f"{row['specgen K=0']:5.2f} tok/s ({row['specgen K=0'] / row['generate']:.2f}x)"
              f"{'' if row['equal'] else ' DIFFERENT TOKENS'}", flush=True)
    means = {name: math.exp(sum(math.log(r[name]) for r in rows) / len(rows)) for name in ways}
    print(f"geometric means: generate {means['generate']:.2f} tok/s, specgen K=0 "
          f"{means['specgen K=0']:.2f} tok/s ({means['specgen K=0'] / means['generate']:.3f}x); "
          f"equal tokens {sum(r['equal'] for r in rows)}/{len(rows)}")
    if args.out:
        args.out.write_text(json.dumps({"profile": prof.name, "target_quantization": args.target_quantization,
                                        "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                                        "rows": rows, "geometric_means": means}, indent=1) + "\n")


if __name__ == "__main__":
    main()
