"""One method with one setting varied, side by side in one process: seconds per answer, per
prompt. The settings: `k` (K_max) and `draft-tile-rows` (kernels.int4.DRAFT_TILE_ROWS: from
how many tokens an int4-dyn draft's passes take the tiles; 49 is row by row up to 48 tokens,
as a target's).

    python bench/side_by_side.py --profile qwen-coder-demo-int8-int4 --vary k=4,8 \
        --prompts all.jsonl --repeats 2

One generator per value, on the same loaded pair; prompt by prompt, each value once per
repeat, the order reversed on every other repeat. Each generator first answers two short
unrecorded warm-up prompts (its first reading of a prompt includes warm-up). Greedy; every
answer is checked equal to the first value's. Prints each prompt's median seconds and target
passes per value, and the geometric mean of speed against the first value. One prompt's
ratio is noisy even where both values take the same steps (docs/benchmarks.md says how
much): read the geometric mean.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.kernels import int4
from specgen.profiles import load_profile, with_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--vary", default="k=4,8",
                    help="SETTING=V1,V2,...: k or draft-tile-rows, the first value the reference")
    ap.add_argument("--k", type=int, default=4, help="K_max where --vary is not k")
    ap.add_argument("--method", default="hybrid")
    ap.add_argument("--prompts", type=Path, help="a bench prompt file (default: the built-in set)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    setting, _, values = args.vary.partition("=")
    if setting not in ("k", "draft-tile-rows") or not values:
        ap.error("--vary takes k=V1,V2,... or draft-tile-rows=V1,V2,...")
    ks = [int(v) for v in values.split(",")]
    tag = "K" if setting == "k" else "tiles@"

    def use(v: int) -> None:  # the kernel reads DRAFT_TILE_ROWS at every call
        if setting == "draft-tile-rows":
            int4.DRAFT_TILE_ROWS = v
    prof = with_overrides(load_profile(args.profile), method="draft-model", temperature=0.0,
                          max_new_tokens=args.max_new_tokens)
    session = open_session(prof)
    pair, eos = session.pair, session.eos_ids()
    vocab = pair.target.config.get_text_config().vocab_size
    gens = {v: SpeculativeGenerator(pair.target, make_drafter(args.method, pair.draft, vocab),
                                    v if setting == "k" else args.k, True, prepare=False)
            for v in ks}
    prompts = read_prompts(args.prompts) if args.prompts else builtin_prompts()
    ids = [encode_messages(session.tokenizer, messages_for(p.prompt, None), True) for p in prompts]
    warm = encode_messages(session.tokenizer, messages_for("List five uses of a paperclip.", None), True)
    for v, gen in gens.items():
        use(v)
        for _ in range(2):
            gen.reset()
            gen.generate(warm, max_new_tokens=16, eos_token_ids=eos)
    ratios = {k: [] for k in ks[1:]}
    for i, prompt in enumerate(prompts):
        runs: dict[int, list[tuple[float, list[int], int]]] = {k: [] for k in ks}
        for r in range(args.repeats):
            for k in ks if r % 2 == 0 else ks[::-1]:
                use(k)
                gens[k].reset()
                start = time.perf_counter()
                out = gens[k].generate(ids[i], max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
                runs[k].append((time.perf_counter() - start, out.token_ids, out.stats.target_passes))
        seconds = {k: statistics.median(s for s, _, _ in runs[k]) for k in ks}
        equal = all(t == runs[ks[0]][0][1] for k in ks for _, t, _ in runs[k])
        for k in ks[1:]:
            ratios[k].append(seconds[ks[0]] / seconds[k])
        cells = "  ".join(f"{tag}{k} {seconds[k]:.2f}s passes {[p for _, _, p in runs[k]]}" for k in ks)
        print(f"{i:2d} {prompt.category:18s} {len(ids[i]):4d} tokens  {cells}  "
              f"{'equal' if equal else 'DIFFERENT'}", flush=True)
    for k, rs in ratios.items():
        mean = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{tag}{k} against {tag}{ks[0]}: {mean:.3f}x speed (geometric mean over {len(rs)} prompts; "
              f"{min(rs):.3f}x to {max(rs):.3f}x)")


if __name__ == "__main__":
    main()
