"""Trace a planner's choices: which guesser drafted each step, with what K, and every offered
guesser's score and catch-up (seconds of reading it would do first). Diagnosis only.

    python bench/trace_guessers.py --profile qwen-coder-demo-int8-int4 --method hybrid \
        --category rag --max-new-tokens 64

Prompts come from the built-in set (--prompt N, or every prompt of --category), or from a
JSONL file (--prompts). One generation per prompt, greedy, after one unrecorded warm-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.core import adaptive
from specgen.profiles import load_profile, with_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--method", default="hybrid")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--draft-window", type=int, default=None)
    ap.add_argument("--prompts", default=None, help="a JSONL prompt file (default: built-in set)")
    ap.add_argument("--prompt", type=int, default=None, help="index into the prompt set")
    ap.add_argument("--category", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()

    steps = []
    real = adaptive.choose_guesser

    def traced(policies, guessers, limit, catch_up=None, saved=None):
        guesser, k = real(policies, guessers, limit, catch_up, saved)
        offered = {}
        for g in guessers:
            policy = policies[g]
            score = policy.score(max(1, k if g == guesser else 1))
            seconds = (catch_up or {}).get(g, 0.0)
            saves = saved(score) if saved is not None and seconds else None
            offered[g] = (score, seconds, saves)
        steps.append((guesser, k, offered))
        return guesser, k

    adaptive.choose_guesser = traced  # the planner looks it up at each step
    prof = with_overrides(load_profile(args.profile), method=args.method,
                          num_speculative_tokens=args.k, draft_window=args.draft_window)
    session = open_session(prof)
    prompts = read_prompts(Path(args.prompts)) if args.prompts else builtin_prompts()
    chosen = [(i, p) for i, p in enumerate(prompts)
              if (args.prompt is None or i == args.prompt)
              and (args.category is None or p.category == args.category)]
    kwargs = {**session.sampling_kwargs(), "max_new_tokens": args.max_new_tokens}
    gen = session.generator
    warm = encode_messages(session.tokenizer, messages_for(prompts[0].prompt, None), True)
    gen.generate(warm, **{**kwargs, "max_new_tokens": 8})
    for i, prompt in chosen:
        steps.clear()
        gen.reset()
        ids = encode_messages(session.tokenizer, messages_for(prompt.prompt, None), True)
        stats = gen.generate(ids, **kwargs).stats
        print(f"prompt {i} ({prompt.category}, {len(ids)} tokens): {stats.new_tokens} tokens, "
              f"{stats.tokens_per_second:.2f} tok/s, prefill {stats.prefill_seconds:.2f} s, "
              f"drafting {stats.draft_seconds:.2f} s, verifying {stats.verify_seconds:.2f} s, "
              f"{stats.target_passes} target passes, {stats.draft_passes} draft passes")
        print(f"  book: {gen.book}")
        print("  step  guesser     K  offered: score tok/s, catch-up s, saving s")
        for n, (guesser, k, offered) in enumerate(steps):
            shown = "  ".join(
                f"{g} {s:.1f}" + (f" c{c:.2f} s{v:.2f}" if c else "")
                for g, (s, c, v) in offered.items())
            print(f"  {n:4d}  {guesser or 'plain':10s} {k:2d}  {shown}")


if __name__ == "__main__":
    main()
