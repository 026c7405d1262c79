"""llama.cpp's own speculative decoding (`llama-speculative-simple`, built by `make llamacpp`)
over a grid of its draft settings, beside llama.cpp's plain decoding of the same target: what
chose `specgen bench --llamacpp-draft`'s default (the `llamacpp-spec` contestant).

    PYTHONPATH=src python -P bench/llamacpp_sweep.py --profile PROFILE \
        [--n-max 4,8,16] [--p-min 0,0.75] [--max-new-tokens 96] [--threads 2] \
        [--per-category 1] [--out results.json]

Each built-in prompt (or the first --per-category of each category) is rendered with the
target's chat template as `specgen bench` renders it; per prompt, plain llama.cpp (the bench's
`llamacpp` contestant: llama-cpp-python on the same native build) and every setting run once,
interleaved by specgen's bench harness, the order rotated prompt by prompt, after one short
warm-up each. tokens/s counts the prompt's pass for all (for the tool, its own clock: encoded
+ decoded, model loading left out). `equal_to_plain`: the first max-new-tokens tokens equal plain llama.cpp's greedy output.
Summaries are geometric means over prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import product
from pathlib import Path

from specgen.app.session import encode_messages, messages_for
from specgen.bench.prompts import PROMPTS
from specgen.bench.harness import geomean, interleave
from specgen.bench.report import machine_info
from specgen.decoding import llamacpp, llamacpp_tools as lt
from specgen.loading.sources import find, gguf_file
from specgen.loading.tokenizer_cache import load_tokenizer
from specgen.profiles import load_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--n-max", default="4,8,16")
    ap.add_argument("--p-min", default="0,0.75")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--per-category", type=int, default=0, help="0: every prompt")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    prof = load_profile(a.profile)
    base = prof.path.parent if prof.path else None
    target, draft = gguf_file(prof.target, "target", base), gguf_file(prof.draft, "draft", base)
    tool = lt.tool()
    if tool is None:
        sys.exit(lt.missing_line())
    tokenizer = load_tokenizer(find(prof.target, "target", None, base))
    eos = sorted({tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>"])} - {None})
    prompts, seen = [], {}
    for category, text in PROMPTS:
        seen[category] = seen.get(category, 0) + 1
        if not a.per_category or seen[category] <= a.per_category:
            prompts.append((category, text))
    inputs = [encode_messages(tokenizer, messages_for(p, prof.generation.system_prompt),
                              prof.generation.chat_template).tolist() for _, p in prompts]
    room = max(map(len, inputs)) + a.max_new_tokens + 64
    settings = [lt.DraftSettings(int(n), float(p))
                for n, p in product(a.n_max.split(","), a.p_min.split(","))]
    runners = {s.text(): lt.SpecRunner(tool, target, draft, tokenizer, a.threads, room, s)
               for s in settings}
    llm = llamacpp.load(target, a.threads, room)

    def plain(ids, n):
        tokens, _, seconds = llamacpp.generate(llm, ids, n, eos)
        return {"tokens": tokens, "new_tokens": len(tokens), "seconds": seconds,
                "tokens_per_second": len(tokens) / seconds}

    def spec(name, ids, n):
        tokens, run = runners[name].generate(ids, n, eos)
        return {"tokens": tokens, "new_tokens": run.new_tokens, "seconds": run.seconds,
                "prompt_seconds": run.prompt_seconds, "tokens_per_second": run.new_tokens / run.seconds,
                "drafted": run.drafted, "accepted": run.accepted, "prompt_tokens": run.prompt_tokens,
                "target_passes": run.target_passes}

    names = ["llamacpp", *runners]
    rows = []
    started = time.time()

    def call(n: str, i: int, _repeat: int, new: int = a.max_new_tokens) -> dict:
        return plain(inputs[i], new) if n == "llamacpp" else spec(n, inputs[i], new)

    def warm_up(n: str) -> None:
        call(n, 0, 0, new=8)

    def row(i: int, trials: list) -> None:
        got = {t.name: t.value for t in trials}
        for n in names:
            got[n]["equal_to_plain"] = got[n]["tokens"] == got["llamacpp"]["tokens"]
            got[n]["vs_llamacpp"] = got[n]["tokens_per_second"] / got["llamacpp"]["tokens_per_second"]
        category = prompts[i][0]
        rows.append({"prompt": i, "category": category, "prompt_tokens": len(inputs[i]), "runs": got})
        print(f"[{i + 1}/{len(prompts)}] {category}: " + ", ".join(
            f"{n} {got[n]['tokens_per_second']:.2f}" for n in names), file=sys.stderr, flush=True)

    interleave(names, len(prompts), call, warm_up=warm_up, on_prompt=row)
    summary = {n: {"tokens_per_second": geomean([r["runs"][n]["tokens_per_second"] for r in rows]),
                   "vs_llamacpp": geomean([r["runs"][n]["vs_llamacpp"] for r in rows]),
                   "equal_to_plain": f"{sum(r['runs'][n]['equal_to_plain'] for r in rows)}/{len(rows)}",
                   **({"acceptance": sum(r["runs"][n]["accepted"] for r in rows)
                       / max(1, sum(r["runs"][n]["drafted"] for r in rows))} if n != "llamacpp" else {})}
               for n in names}
    doc = {"command": "python -P bench/llamacpp_sweep.py " + " ".join(sys.argv[1:]),
           "tool": str(tool), "version": lt.version_line(tool), "target": str(target),
           "draft": str(draft), "threads": a.threads, "max_new_tokens": a.max_new_tokens,
           "minutes": (time.time() - started) / 60, "machine": machine_info(),
           "prompts": [{"category": c, "prompt": p} for c, p in prompts],
           "summary": summary, "per_prompt": rows}
    for n in names:
        s = summary[n]
        print(f"{n:22s} {s['tokens_per_second']:6.2f} tok/s  {s['vs_llamacpp']:.2f}x plain  "
              f"equal {s['equal_to_plain']}" + (f"  acceptance {s['acceptance']:.2f}" if "acceptance" in s else ""))
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
