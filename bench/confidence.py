"""How sure the target is of its own greedy answer, beside how often the draft agrees with it.

The planner takes an untried draft model's acceptance to be the target's recent top
probability (core/adaptive.py). This script checks that premise on a prompt set: for each
prompt it decodes the target's greedy answer, then reads prompt and answer once with each
model and prints, per prompt, the target's mean top probability over the answer's
positions and the share of positions where the draft's argmax is the target's token (the
acceptance of a greedy draft whose every guess is verified), with the Pearson correlation
over the prompts whose answer runs 16 tokens or more.

    python bench/confidence.py                                    # the built-in set
    python bench/confidence.py --prompts bench/holdout.jsonl --out conf.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specgen.app.session import encode_messages, messages_for, open_session
from specgen.bench.runner import builtin_prompts, read_prompts
from specgen.profiles import load_profile, with_overrides


def answer_positions(target, draft, ids: torch.Tensor, n: int, eos: list[int]) -> dict:
    """The target's greedy answer to `ids` and, over its positions, the target's mean top
    probability and the draft's agreement with it."""
    x = ids[None]
    out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                          max_new_tokens=n, eos_token_id=eos or None,
                          pad_token_id=eos[0] if eos else None)
    answer = out[0, x.shape[1]:]
    full = torch.cat([ids, answer])[None]
    rows = slice(len(ids) - 1, len(ids) - 1 + len(answer))
    t = target(full).logits[0, rows].float()
    d = draft(full).logits[0, rows].float()
    vocab = min(t.shape[-1], d.shape[-1])
    return {"tokens": len(answer),
            "target_top_probability": t[:, :vocab].softmax(-1).max(-1).values.mean().item(),
            "draft_agrees": (d[:, :vocab].argmax(-1) == answer).float().mean().item()}


def pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    cov = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
    return cov / (sum((a - mx) ** 2 for a in xs) * sum((b - my) ** 2 for b in ys)) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8-int4")
    ap.add_argument("--prompts", type=Path, help="a bench prompt file (default: the built-in set)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write the per-prompt figures here as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prof = with_overrides(load_profile(args.profile), method="draft-model", temperature=0.0)
    session = open_session(prof)
    pair, eos = session.pair, session.eos_ids()
    prompts = read_prompts(args.prompts) if args.prompts else builtin_prompts()
    rows = []
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            ids = encode_messages(session.tokenizer, messages_for(p.prompt, None), True)
            row = {"prompt": i, "category": p.category,
                   **answer_positions(pair.target, pair.draft, ids, args.max_new_tokens, eos)}
            rows.append(row)
            print(f"{i:2d} {p.category:18s} {row['tokens']:3d} tokens  target sure "
                  f"{row['target_top_probability']:.3f}  draft agrees {row['draft_agrees']:.3f}",
                  flush=True)
    kept = [r for r in rows if r["tokens"] >= 16]
    xs = [r["target_top_probability"] for r in kept]
    ys = [r["draft_agrees"] for r in kept]
    if len(kept) >= 3:
        gap = statistics.mean(abs(a - b) for a, b in zip(xs, ys))
        print(f"{len(kept)} prompts with 16 tokens or more: correlation {pearson(xs, ys):.3f}, "
              f"mean |target sure - draft agrees| {gap:.3f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
