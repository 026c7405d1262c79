"""A busy spell of the machine in the middle of a session: does the draft model draft again?

One generator (default method: hybrid) answers a sequence of prompts, as a chat or a server
does, keeping its `Book` of measured costs across answers. During the answers named by
`--busy`, `--hogs` processes spin on the CPU beside it (another job on the cores). For each
answer it prints the seconds, the target passes, the token at which the draft model first
drafted ("-": never), the draft's readings measured in it (tokens, microseconds a token) and
what the Book then holds. After the spell the draft should start again as it did before it.

    python bench/busy_spell.py                       # built-in prompts 0,1,2,3,10,14 twice, busy on the 4th and 5th
    python bench/busy_spell.py --sequence 0,3,0,3 --busy 1 --hogs 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.core.adaptive import Book, Planner
from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.profiles import load_profile, with_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--method", default="hybrid")
    ap.add_argument("--prompts", help="a bench prompt file (default: the built-in set)")
    ap.add_argument("--sequence", default="0,1,2,3,10,14,0,1,2,3,10,14,0,3",
                    help="prompt indices, answered in this order")
    ap.add_argument("--busy", default="3,4", help="positions in the sequence run beside the hogs")
    ap.add_argument("--hogs", type=int, default=2, help="spinning processes during the spell")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prof = with_overrides(load_profile(args.profile), method="draft-model", temperature=0.0)
    session = open_session(prof)
    pair, eos = session.pair, session.eos_ids()
    vocab = pair.target.config.get_text_config().vocab_size
    gen = SpeculativeGenerator(pair.target, make_drafter(args.method, pair.draft, vocab), 4, True,
                               prepare=False)
    prompts = read_prompts(args.prompts) if args.prompts else builtin_prompts()
    sequence = [int(i) for i in args.sequence.split(",")]
    busy = {int(i) for i in args.busy.split(",") if i}

    reads: list[tuple[int, float]] = []
    first: list[int] = []
    book_read, planner_observe = Book.read, Planner.observe

    def read(book, guesser, tokens, seconds, plain_pass):
        reads.append((tokens, seconds))
        book_read(book, guesser, tokens, seconds, plain_pass)

    def observe(planner, step):
        if step.plan.guesser == "model" and not first:
            first.append(sum(t for t, _ in planner.steps) + 1)
        planner_observe(planner, step)

    Book.read, Planner.observe = read, observe
    warm = encode_messages(session.tokenizer, messages_for("List five uses of a paperclip.", None), True)
    for _ in range(2):
        gen.reset()
        gen.generate(warm, max_new_tokens=16, eos_token_ids=eos)
    hogs: list[subprocess.Popen] = []
    try:
        for position, i in enumerate(sequence):
            if position in busy and not hogs:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(args.hogs)]
            elif position not in busy:
                for hog in hogs:
                    hog.kill()
                hogs = []
            ids = encode_messages(session.tokenizer, messages_for(prompts[i].prompt, None), True)
            reads.clear()
            first.clear()
            gen.reset()
            start = time.perf_counter()
            out = gen.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
            seconds = time.perf_counter() - start
            book = gen.book
            print(f"{'busy' if hogs else '    '} {i:2d} {prompts[i].category:18s} {len(ids):4d} tokens "
                  f"{seconds:6.2f}s passes {out.stats.target_passes:2d} draft from "
                  f"{first[0] if first else '-':>3}  reads {[(n, round(1e6 * s / n)) for n, s in reads]}"
                  f"  book: read {book.read_share.get('model', 0.0):.4f} and draft pass "
                  f"{book.draft_share.get('model', 0.0):.3f} of a plain pass", flush=True)
    finally:
        for hog in hogs:
            hog.kill()


if __name__ == "__main__":
    main()
