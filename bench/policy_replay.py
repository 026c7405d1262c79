"""Replay drafting policies on recorded answers: a predicted speedup per policy, in seconds.

A greedy draft proposes, while it is right, exactly the tokens of the target's own greedy
answer. So one teacher-forced pass of the draft over prompt + answer says, for each answer
position, whether its guess is the target's token and how sure it was; any policy can then
be replayed on that trace with a cost model (seconds per draft pass, per verify pass over
k+1 tokens) instead of running the target again. Past a draft's first wrong guess its real
confidences are unknown; the replay uses those of the right path at the same positions.

    SPECGEN_CACHE_DIR=... python bench/policy_replay.py RESULT.json --profile FILE \
        [--trace trace.json] [--k 16] [--draft 0.075 --plain 0.67 --verify 0.68 --per-token 0.071]

RESULT.json is a `specgen bench --out` file: its baseline contestant's token ids are the
answers. The default costs are the demo pair's (fp32 target, int8-dyn draft, 2 threads),
fitted to a bench run's verify and draft seconds (docs/lab-notes/rounds-07-12.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specgen.core.adaptive import AdaptiveK, record_pass
from specgen.bench.report import geomean


def trace(result: dict, profile_name: str) -> list[dict]:
    """Per prompt: the draft's greedy guess right or wrong, and its probability, per position."""
    from specgen.app.session import encode_messages, messages_for
    from specgen.bench.prompts import PROMPTS
    from specgen.decoding import make_decoder
    from specgen.loading.convert import locate
    from specgen.loading.devices import resolve_dtype
    from specgen.loading.load import load_model
    from specgen.loading.sources import load_tokenizer
    from specgen.profiles import load_profile

    profile = load_profile(profile_name)
    base = profile.path.parent if profile.path else None
    spec = profile.draft
    dtype = resolve_dtype(spec.dtype, "cpu")
    draft = load_model(locate(spec, "draft", dtype, None, base), spec, "cpu", dtype, None, "draft")
    target_dtype = resolve_dtype(profile.target.dtype, "cpu")
    tokenizer = load_tokenizer(locate(profile.target, "target", target_dtype, None, base))
    head, rows = draft.get_output_embeddings(), []
    for m in result["measurements"]:
        if m["contestant"] != "baseline" or m.get("repeat", 0):
            continue
        category, text = PROMPTS[m["prompt"]]
        prompt = encode_messages(tokenizer, messages_for(text, None), True)
        answer = torch.tensor(m["token_ids"])
        decoder = make_decoder(draft)
        right, sure = [], []
        with torch.inference_mode():
            decoder.hidden(prompt[:-1])
            for i, token in enumerate(torch.cat([prompt[-1:], answer[:-1]])):
                q = torch.softmax(head(decoder.hidden(token[None]))[0].float(), -1)
                guess = int(q.argmax())
                right.append(guess == int(answer[i]))
                sure.append(float(q[guess]))
        rows.append(dict(prompt=m["prompt"], category=category, right=right, sure=sure))
    return rows


class Calibration:
    """The "calibrated" policy's estimate of how often the target keeps a draft token that the
    draft gave probability p, learnt per tenth of p from the verdicts so far, each tenth
    starting from p itself (worth two observations). Tried in the replay only: it moved
    nothing (bench/NOTES.md, Round 10), so the engine takes the draft at its word."""

    def __init__(self, prior: float = 2.0) -> None:
        self.prior, self.kept, self.seen = prior, [0.0] * 10, [0.0] * 10

    def survival(self, p: float) -> float:
        b = min(int(p * 10), 9)
        return (self.kept[b] + self.prior * p) / (self.seen[b] + self.prior)

    def update(self, sure: list[float], n_accepted: int) -> None:
        """Tokens up to the first rejection were judged; the rest were not."""
        for i, p in enumerate(sure[: n_accepted + 1]):
            b = min(int(p * 10), 9)
            self.seen[b] += 1.0
            self.kept[b] += float(i < n_accepted)


class Costs:
    def __init__(self, draft: float, plain: float, verify: float, per_token: float,
                 peer_draft: float | None = None) -> None:
        self.draft, self.plain, self.verify, self.per_token = draft, plain, verify, per_token
        self.peer_draft = draft if peer_draft is None else peer_draft

    def pass_seconds(self, k: int) -> float:
        """A target pass over k+1 tokens (k = 0: a plain step)."""
        return self.plain if k == 0 else self.verify + self.per_token * k


def drafted(sure: list[float], i: int, k: int, stop_below: float, confidence: float,
            survival=lambda p: p) -> int:
    """How many tokens a draft of up to k from position i proposes before it stops itself."""
    n, whole = 0, 1.0
    for p in sure[i : i + k]:
        n, whole = n + 1, whole * survival(p)
        if p < confidence or whole < stop_below:
            break
    return n


def replay(row: dict, costs: Costs, policy: str, k_max: int, n_new: int) -> float:
    """Seconds to decode the answer's first n_new tokens (prefill not counted)."""
    right, sure = row["right"], row["sure"]
    n_new = min(n_new, len(right))
    verify_cost: dict[int, float] = {}
    adaptive = AdaptiveK(k_max, verify_cost=verify_cost, self_stopping=policy != "one-k")
    calibration = Calibration() if policy == "calibrated" else None
    done = seconds = 0
    while done < n_new:
        limit = n_new - done - 1
        if policy == "peer":  # transformers' assisted generation: 20 drafts, cut at 0.4
            k = drafted(sure, done, min(20, limit), 0.0, 0.4)
        else:
            k = adaptive.choose(limit)
            k = drafted(sure, done, k, adaptive.stop_below(k), 0.0,
                        calibration.survival if calibration else lambda p: p)
        accepted = next((j for j in range(k) if not right[done + j]), k)
        if calibration:
            calibration.update(sure[done : done + k], accepted)
        draft = costs.peer_draft if policy == "peer" else costs.draft
        seconds += k * draft + costs.pass_seconds(k)
        record_pass(verify_cost, k, costs.pass_seconds(k))
        if k and policy != "peer":
            adaptive.update(k, accepted, k * draft)
        done += accepted + 1
    return seconds * n_new / done  # a last step may overshoot n_new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--trace", type=Path, help="cache of the draft's trace (made if missing)")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", type=float, default=0.075, help="seconds per draft pass")
    ap.add_argument("--plain", type=float, default=0.67, help="seconds per plain target step")
    ap.add_argument("--verify", type=float, default=0.68, help="seconds of a verify pass, fixed part")
    ap.add_argument("--per-token", type=float, default=0.071, help="seconds per verified draft")
    ap.add_argument("--peer-draft", type=float, help="seconds per peer draft pass (default --draft)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = json.loads(args.result.read_text())
    if args.trace and args.trace.exists():
        rows = json.loads(args.trace.read_text())
    else:
        rows = trace(result, args.profile)
        if args.trace:
            args.trace.write_text(json.dumps(rows))
    costs = Costs(args.draft, args.plain, args.verify, args.per_token, args.peer_draft)
    # adaptive K before and since Round 7, and with the draft's confidence calibrated
    policies = ("peer", "one-k", "self-ending", "calibrated")
    print(f"{'prompt':>6} {'category':16s} " + " ".join(f"{p:>12s}" for p in policies))
    speedups = {p: [] for p in policies}
    for row in rows:
        plain = costs.plain * min(args.max_new_tokens, len(row["right"]))
        for p in policies:
            speedups[p].append(plain / replay(row, costs, p, args.k, args.max_new_tokens))
        print(f"{row['prompt']:>6} {row['category']:16s} "
              + " ".join(f"{speedups[p][-1]:11.2f}x" for p in policies))
    for name, pick in (("code", lambda c: c.startswith("code")), ("all", lambda c: True)):
        chosen = [i for i, row in enumerate(rows) if pick(row["category"])]
        print(f"geometric mean, {name}: " + ", ".join(
            f"{p} {geomean([speedups[p][i] for i in chosen]):.2f}x" for p in policies))
    peer = geomean(speedups["peer"])
    print("vs peer, all: " + ", ".join(f"{p} {geomean(speedups[p]) / peer:.2f}x" for p in policies))


if __name__ == "__main__":
    main()
