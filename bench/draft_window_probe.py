"""What a draft window costs in acceptance and saves in reading, on long prompts.

    python bench/draft_window_probe.py --profile qwen-coder-demo-int8-int4 \
        --windows 0,256:0,256,512 --out window.json

A window is N (its head the drafter's default: a quarter) or N:H (H tokens from the start).

For each prompt of the chosen categories (the built-in set's summarization and rag, and
--prompts' own), the target's greedy answer (specgen with speculation off), then for each
window the draft model reads the prompt (timed: its catch-up), and is teacher-forced along
the target's answer: the share of positions where its greedy guess is the target's token
(`agreement`), and the mean length of the runs of right guesses (what a long draft could
keep). The target's prompt pass is timed too, for scale. Greedy; one process; the draft is
the profile's (transformers or llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.core.drafters import ModelDrafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.sampling import SamplingParams
from specgen.profiles import load_profile, with_overrides


def runs(hits: list[bool]) -> float:
    """Mean length of the maximal runs of right guesses, counting a wrong guess as a run of
    0 (what a step drafting from there keeps)."""
    lengths, n = [], 0
    for hit in hits:
        if hit:
            n += 1
        else:
            lengths.append(n)
            n = 0
    lengths.append(n)
    return statistics.fmean(lengths)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--prompts", default=None, help="a JSONL prompt file (default: built-in set)")
    ap.add_argument("--categories", default="summarization,rag")
    ap.add_argument("--windows", default="0,256:0,256,512")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    windows = [tuple(int(x) for x in w.split(":")) if ":" in w else (int(w), None)
               for w in args.windows.split(",")]
    wanted = set(args.categories.split(","))
    prompts = read_prompts(Path(args.prompts)) if args.prompts else builtin_prompts()
    prompts = [p for p in prompts if p.category in wanted]

    prof = with_overrides(load_profile(args.profile), method="draft-model")
    session = open_session(prof)
    target, draft = session.pair.target, session.pair.draft
    vocab = target.config.get_text_config().vocab_size
    plain = SpeculativeGenerator(target, ModelDrafter(draft, vocab), 0, adaptive=False)
    greedy = SamplingParams()
    rows = []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ids = encode_messages(session.tokenizer, messages_for(prompt.prompt, None),
                                  prof.generation.chat_template)
            plain.reset()
            result = plain.generate(ids, max_new_tokens=args.max_new_tokens,
                                    eos_token_ids=session.eos_ids())
            answer = result.token_ids
            for window, head in windows:
                drafter = ModelDrafter(draft, vocab, window=window, first=head)
                head = drafter.first
                drafter.reset()
                hits = []
                start = time.perf_counter()
                first = None
                for j, token in enumerate(answer):
                    context = torch.cat([ids, torch.tensor(answer[:j], dtype=torch.long)])
                    guess, _ = drafter.propose(context, 1, greedy, None)
                    if first is None:
                        first = time.perf_counter() - start
                    hits.append(int(guess[0]) == token)
                row = {"prompt": i, "category": prompt.category, "prompt_tokens": len(ids),
                       "answer_tokens": len(answer), "window": window, "head": head,
                       "read_tokens": min(len(ids), window) if window else len(ids),
                       "read_seconds": first,
                       "target_prefill_seconds": result.stats.prefill_seconds,
                       "agreement": sum(hits) / len(hits), "mean_run": runs(hits)}
                rows.append(row)
                print(f"prompt {i} ({prompt.category}, {len(ids)} tokens) window "
                      f"{f'{window}:{head}' if window else 'all':>7}: "
                      f"read {row['read_tokens']} tokens in {first:.3f} s (target's prompt pass "
                      f"{row['target_prefill_seconds']:.3f} s), agreement {row['agreement']:.2f}, "
                      f"mean run {row['mean_run']:.2f}", flush=True)
    summary = {}
    for key in dict.fromkeys((r["window"], r["head"]) for r in rows):
        mine = [r for r in rows if (r["window"], r["head"]) == key]
        name = f"{key[0]}:{key[1]}" if key[0] else "all"
        summary[name] = {
            "agreement": statistics.fmean(r["agreement"] for r in mine),
            "mean_run": statistics.fmean(r["mean_run"] for r in mine),
            "read_seconds": statistics.fmean(r["read_seconds"] for r in mine)}
        print(f"window {name:>7}: agreement {summary[name]['agreement']:.3f}, "
              f"mean run {summary[name]['mean_run']:.2f}, "
              f"read {summary[name]['read_seconds']:.3f} s (means over prompts)")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"profile": prof.name, "threads": args.threads, "command": vars(args),
                       "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
