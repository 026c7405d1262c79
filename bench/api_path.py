"""The Python API as a user calls it, on models transformers loaded, against the target's own
greedy `generate` and transformers' assisted generation, and against the drafting methods
one by one: which of preparation and method makes the API path's speed.

    python -P bench/api_path.py --target <bf16 model folder> --draft <bf16 model folder> \
        --prompts bench/api-dev.jsonl [--contestants generate,api,peer,...] \
        [--max-new-tokens 64] [--repeats 3] [--threads 2] [--out results.json]

Contestants (interleaved prompt by prompt, the order rotated each repeat):
  generate        the target's own greedy `generate`, on the target as the API left it
                  (prepared in place by the API's first generator)
  generate-stock  the same on an unprepared copy of the target (loaded only if asked for)
  peer            `generate(assistant_model=draft)` on the same (prepared) models
  peer-stock      the same on unprepared copies of both (loaded only if asked for)
  api             specgen.SpeculativeGenerator(target, draft): the API's defaults
  api-first       the same, a new generator for every answer: each one a first answer,
                  before anything of the draft is measured
  api-first-unsized
                  api-first with the planner not told the models' sizes: the draft's
                  reading priced as the target's own prompt pass until measured
  draft-model, hybrid, lookup
                  SpeculativeGenerator(target, make_drafter(method, draft, ...)), adaptive K
                  up to 4: one drafting method each
The demo pair's converted copies (SPECGEN_CACHE_DIR/converted/<sha>-bfloat16) are such
folders. Figures: the median over repeats per prompt; summaries are geometric means of
per-prompt ratios to `generate` (and to `peer`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specgen
from specgen.app.session import encode_messages, messages_for
from specgen.bench.report import geomean
from specgen.bench.runner import read_prompts
from specgen.core.drafters import make_drafter

METHODS = {"draft-model": "draft-model", "hybrid": "hybrid", "lookup": "prompt-lookup"}


def load(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)


def hf_generate(model, ids, n, eos, assistant=None):
    kwargs = {"assistant_model": assistant} if assistant is not None else {}
    with torch.inference_mode():
        out = model.generate(ids[None], do_sample=False, max_new_tokens=n, eos_token_id=eos,
                             pad_token_id=eos[0], attention_mask=torch.ones_like(ids[None]),
                             **kwargs)
    return out[0, len(ids):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--contestants", default="generate,api,hybrid,draft-model,peer")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.contestants.split(",")

    tok = AutoTokenizer.from_pretrained(args.target)
    target, draft = load(args.target), load(args.draft)
    stock = {}
    if "generate-stock" in names or "peer-stock" in names:
        stock["target"] = load(args.target)
    if "peer-stock" in names:
        stock["draft"] = load(args.draft)
    api = specgen.SpeculativeGenerator(target, draft)  # prepares both in place, as a user's would
    vocab = target.config.get_text_config().vocab_size
    gens = {m: specgen.SpeculativeGenerator(target, make_drafter(METHODS[m], draft, vocab))
            for m in METHODS if m in names}
    cfg = target.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *([cfg] if isinstance(cfg, int) else cfg or [])} - {None})
    prompts = read_prompts(args.prompts)
    inputs = [encode_messages(tok, messages_for(p.prompt, None), True) for p in prompts]
    n = args.max_new_tokens

    def run(name: str, i: int, new: int) -> tuple[list[int], dict]:
        ids = inputs[i]
        if name in ("generate", "generate-stock"):
            return hf_generate(target if name == "generate" else stock["target"], ids, new, eos), {}
        if name == "peer":
            return hf_generate(target, ids, new, eos, draft), {}
        if name == "peer-stock":
            return hf_generate(stock["target"], ids, new, eos, stock["draft"]), {}
        if name.startswith("api-first"):
            gen = specgen.SpeculativeGenerator(target, draft)
            if name == "api-first-unsized":
                gen.book.target_size = None
        else:
            gen = api if name == "api" else gens[name]
        gen.reset()
        result = gen.generate(ids, max_new_tokens=new, eos_token_ids=eos)
        return result.token_ids, {"tau": result.stats.tau}

    for name in names:  # warm-up: first-call allocations, kernel loading
        run(name, 0, 8)
    seconds: dict[tuple[int, str], list[float]] = {}
    rows = []
    for i, p in enumerate(prompts):
        row = {"prompt": i, "category": p.category, "tokens": {}, "tau": {}}
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                start = time.perf_counter()
                tokens, extra = run(name, i, n)
                seconds.setdefault((i, name), []).append(time.perf_counter() - start)
                row["tokens"][name] = tokens
                if "tau" in extra:
                    row["tau"][name] = extra["tau"]
        row["seconds"] = {name: seconds[(i, name)] for name in names}
        row["tok_s"] = {name: len(row["tokens"][name]) / statistics.median(seconds[(i, name)])
                        for name in names}
        ref = row["tokens"].get("generate")
        row["equal"] = {name: row["tokens"][name] == ref for name in names} if ref else {}
        line = "  ".join(f"{name} {row['tok_s'][name]:.2f}" for name in names)
        print(f"prompt {i} ({p.category}): tok/s {line}; tau "
              + " ".join(f"{k} {v:.2f}" for k, v in row["tau"].items())
              + (f"; equal to generate: {row['equal']}" if ref else ""), flush=True)
        rows.append(row)
        write(args, names, rows, {})  # what is measured so far, should the run be stopped
    write(args, names, rows, summarize(names, rows))


def summarize(names: list[str], rows: list[dict]) -> dict:
    summary = {}
    for base in ("generate", "peer"):
        if base not in names:
            continue
        for name in names:
            ratios = [r["tok_s"][name] / r["tok_s"][base] for r in rows]
            code = [x for x, r in zip(ratios, rows) if "code" in r["category"].lower()]
            summary[f"{name}/{base}"] = {"all": geomean(ratios), "code": geomean(code) if code else None,
                                         "worst": min(ratios)}
            print(f"{name} / {base}: all {geomean(ratios):.2f}x, code "
                  f"{geomean(code) if code else float('nan'):.2f}x, worst {min(ratios):.2f}x")
    return summary


def write(args, names: list[str], rows: list[dict], summary: dict) -> None:
    if args.out:
        args.out.write_text(json.dumps({
            "machine": platform.processor() or platform.machine(), "threads": args.threads,
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "prompts": str(args.prompts), "contestants": names, "rows": rows,
            "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
