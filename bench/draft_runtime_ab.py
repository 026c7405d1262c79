"""The same draft model in two runtimes, side by side: adaptive specgen with the profile's draft
in transformers against the same GGUF draft run by llama.cpp, interleaved prompt by prompt with
plain decoding of the target (the baseline), so that machine drift hits all three alike.

    SPECGEN_CACHE_DIR=... python bench/draft_runtime_ab.py [--profile qwen-coder-demo-int8]
        [--prompts FILE.jsonl] [--k 8] [--max-new-tokens 128] [--out FILE.json]

Needs llama-cpp-python and a profile whose draft is a GGUF file. Prints tokens/s, speedup,
draft seconds per draft pass and whether the tokens equal the baseline's, per prompt and as
geometric means; --out writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specgen import bench as b
from specgen.models import load_llama_draft, locate_gguf
from specgen.profiles import load_profile, with_overrides
from specgen.session import encode_messages, messages_for, open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8")
    ap.add_argument("--prompts", type=Path, help="JSONL of {category, prompt} (default: built-in set)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()

    prof = with_overrides(load_profile(args.profile), draft_runtime="transformers", temperature=0.0)
    session = open_session(prof)
    base = prof.path.parent if prof.path else None
    llama = load_llama_draft(locate_gguf(prof.draft, "draft", None, base))
    n, eos = args.max_new_tokens, session.eos_ids()
    runtimes = {"transformers": b.Bench(session.pair.target, session.pair.draft, n, eos),
                "llama.cpp": b.Bench(session.pair.target, llama, n, eos)}
    everyone = b.contestants("draft-model", args.k)
    prompts = b.read_prompts(args.prompts) if args.prompts else b.builtin_prompts()

    rows = []
    for i, p in enumerate(prompts):
        ids = encode_messages(session.tokenizer, messages_for(p.prompt, None), prof.generation.chat_template)
        base_tokens, base_stats = runtimes["transformers"].measure(everyone["baseline"], ids)
        row = {"prompt": i, "category": p.category, "baseline": base_stats.tokens_per_second}
        for name, runner in runtimes.items():
            tokens, st = runner.measure(everyone["adaptive"], ids)
            row[name] = {"tokens_per_second": st.tokens_per_second,
                         "speedup": st.tokens_per_second / base_stats.tokens_per_second,
                         "draft_ms_per_pass": 1e3 * st.draft_seconds / max(st.draft_passes, 1),
                         "draft_passes": st.draft_passes, "target_passes": st.target_passes,
                         "equal": tokens == base_tokens}
        rows.append(row)
        print(f"{i + 1:2d} {p.category:17s} baseline {row['baseline']:5.2f} tok/s | " + " | ".join(
            f"{name} {row[name]['speedup']:.2f}x ({row[name]['draft_ms_per_pass']:.0f} ms/draft pass"
            f"{', equal' if row[name]['equal'] else ', DIFFERENT'})" for name in runtimes), flush=True)
    means = {name: math.exp(sum(math.log(r[name]["speedup"]) for r in rows) / len(rows))
             for name in runtimes}
    print("geometric mean speedup: " + ", ".join(f"{k} {v:.2f}x" for k, v in means.items())
          + f"; llama.cpp / transformers {means['llama.cpp'] / means['transformers']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"profile": prof.name, "k": args.k, "max_new_tokens": n,
                                        "threads": args.threads, "rows": rows,
                                        "geometric_mean_speedup": means}, indent=1) + "\n")


if __name__ == "__main__":
    main()
