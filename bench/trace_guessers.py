"""Trace a hybrid's choices: which guesser drafted each step, with what K, and every offered
guesser's acceptance estimate. Diagnosis only (bench/NOTES.md, Round 5).

    python bench/trace_guessers.py --profile qwen-coder-demo-int8 --k 8 --prompt 8
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from specgen import adaptive, engine
from specgen.bench_prompts import PROMPTS
from specgen.profiles import load_profile
from specgen.session import encode_messages, messages_for, open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=8, help="index into the built-in prompt set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    steps = []

    def traced(policies, guessers, limit):
        guesser, k = adaptive.choose_guesser(policies, guessers, limit)
        alphas = {g: round(policies[g].alpha, 2) for g in guessers}
        rate = policies[guesser].rate(k) if guesser else None
        steps.append((guesser, k, rate, alphas))
        return guesser, k

    engine.choose_guesser = traced  # the engine looks it up at each step
    profile = load_profile(args.profile)
    spec = dataclasses.replace(profile.speculation, method="hybrid", num_speculative_tokens=args.k)
    session = open_session(dataclasses.replace(profile, speculation=spec))
    category, text = PROMPTS[args.prompt]
    ids = encode_messages(session.tokenizer, messages_for(text, None), True)
    kwargs = {**session.sampling_kwargs(), "max_new_tokens": args.max_new_tokens}
    stats = session.generator.generate(ids, **kwargs).stats
    print(f"prompt {args.prompt} ({category}): {stats.new_tokens} tokens, "
          f"{stats.tokens_per_second:.2f} tok/s, drafting {stats.draft_seconds:.2f} s, "
          f"verifying {stats.verify_seconds:.2f} s")
    print("step  guesser   K  expected tok/s  acceptance estimates of the offered guessers")
    for i, (guesser, k, rate, alphas) in enumerate(steps):
        shown = "-" if rate is None else "inf" if rate == float("inf") else f"{rate:.1f}"
        print(f"{i:4d}  {guesser or 'plain':8s} {k:2d}  {shown:>14s}  {alphas}")


if __name__ == "__main__":
    main()
