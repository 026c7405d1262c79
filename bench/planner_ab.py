"""The planner of a git revision against this tree's, side by side in one process: plain
decoding, a fixed K, and the adaptive planner before and after, on the same loaded pair,
interleaved prompt by prompt (the order reversed on every other prompt).

    python bench/planner_ab.py --before main --threads 2 -n 64

The revision's core/adaptive.py is loaded as a module of its own and handed to its
generator (the engine looks `Planner` up at each answer); everything else is this tree's.
Each generator first answers two short unrecorded warm-up prompts. Greedy; every answer is
checked equal to plain decoding's. Prints each prompt's seconds and target passes per
contestant and the geometric mean of speed against plain.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.core import engine
from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.profiles import load_profile, with_overrides


def planner_module(rev: str):
    """core/adaptive.py as it was at `rev`, imported under a name of its own."""
    source = subprocess.run(["git", "show", f"{rev}:src/specgen/core/adaptive.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "adaptive_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("adaptive_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["adaptive_before"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo")
    ap.add_argument("--before", default="main", help="the git revision whose planner is 'before'")
    ap.add_argument("--k", type=int, default=4, help="the fixed K, and the planner's K_max")
    ap.add_argument("--method", default="draft-model")
    ap.add_argument("--prompts", type=Path, help="a bench prompt file (default: the built-in set)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    before = planner_module(args.before)
    prof = with_overrides(load_profile(args.profile), method=args.method, temperature=0.0,
                          max_new_tokens=args.max_new_tokens)
    session = open_session(prof)
    pair, eos = session.pair, session.eos_ids()
    vocab = pair.target.config.get_text_config().vocab_size

    def gen(k: int, adaptive: bool) -> SpeculativeGenerator:
        return SpeculativeGenerator(pair.target, make_drafter(args.method, pair.draft, vocab),
                                    k, adaptive, prepare=False)

    gens = {"plain": gen(0, False), f"k{args.k}": gen(args.k, False),
            "before": gen(args.k, True), "after": gen(args.k, True)}
    gens["before"].book = before.Book()
    planners = {"before": before.Planner, "after": engine.Planner}
    names = list(gens)

    def answer(name: str, ids, n: int):
        engine.Planner = planners.get(name, planners["after"])
        gens[name].reset()
        return gens[name].generate(ids, max_new_tokens=n, eos_token_ids=eos)

    prompts = read_prompts(args.prompts) if args.prompts else builtin_prompts()
    ids = [encode_messages(session.tokenizer, messages_for(p.prompt, None), True) for p in prompts]
    warm = encode_messages(session.tokenizer, messages_for("List five uses of a paperclip.", None), True)
    for name in names:
        for _ in range(2):
            answer(name, warm, 16)
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    for i, prompt in enumerate(prompts):
        seconds, passes, tokens = {}, {}, {}
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            out = answer(name, ids[i], args.max_new_tokens)
            seconds[name] = time.perf_counter() - start
            passes[name], tokens[name] = out.stats.target_passes, out.token_ids
        for name in names[1:]:
            ratios[name].append(seconds["plain"] / seconds[name])
        equal = all(t == tokens["plain"] for t in tokens.values())
        cells = "  ".join(f"{n} {seconds[n]:.2f}s/{passes[n]}" for n in names)
        print(f"{i:2d} {prompt.category:18s} {len(ids[i]):4d} tokens  {cells}  "
              f"{'equal' if equal else 'DIFFERENT'}", flush=True)
    for name, rs in ratios.items():
        mean = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{name} against plain: {mean:.3f}x speed (geometric mean over {len(rs)} prompts; "
              f"{min(rs):.3f}x to {max(rs):.3f}x)")


if __name__ == "__main__":
    main()
