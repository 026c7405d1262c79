"""The Python API on plain transformers models: `SpeculativeGenerator(target, draft)` with the
models left as transformers loaded them (`prepare=False`, the API's behaviour before 0.3) and
prepared for their roles (`prepare=True`, the default now), against each model's own greedy
`generate`, on the built-in prompts. Two copies of the pair, contestants interleaved prompt by
prompt: for each, whether the tokens equal `target.generate` of the same model object, and
tokens/s of both.

    python bench/api_prepare.py --target <bf16 model folder> --draft <bf16 model folder> \
        [--max-new-tokens 64] [--k 4] [--out results.json]

The demo pair's converted copies (SPECGEN_CACHE_DIR/converted/<sha>-bfloat16) are such
folders.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specgen import SpeculativeGenerator
from specgen.app.session import encode_messages, messages_for
from specgen.bench.prompts import PROMPTS
from specgen.bench.report import geomean


def load(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()


def plain(model, ids: torch.Tensor, n: int, eos: list[int]) -> tuple[list[int], float]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids[None], do_sample=False, max_new_tokens=n, eos_token_id=eos,
                             pad_token_id=eos[0], attention_mask=torch.ones_like(ids[None]))
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def spec(gen: SpeculativeGenerator, ids: torch.Tensor, n: int, eos: list[int]):
    gen.reset()
    start = time.perf_counter()
    result = gen.generate(ids, max_new_tokens=n, eos_token_ids=eos)
    return result.token_ids, time.perf_counter() - start, result.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(args.target)
    pairs = {"before": (load(args.target), load(args.draft)),
             "after": (load(args.target), load(args.draft))}
    gens = {"before": SpeculativeGenerator(*pairs["before"], args.k, prepare=False),
            "after": SpeculativeGenerator(*pairs["after"], args.k)}  # prepare=True: the default
    cfg = pairs["before"][0].generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *([cfg] if isinstance(cfg, int) else cfg or [])} - {None})
    inputs = [encode_messages(tok, messages_for(p, None), True) for _, p in PROMPTS]
    for name, gen in gens.items():  # warm-up: first-call allocations, kernel loading
        spec(gen, inputs[0], 8, eos)
        plain(pairs[name][0], inputs[0], 8, eos)

    rows = []
    for i, ((category, _), ids) in enumerate(zip(PROMPTS, inputs)):
        row = {"prompt": i, "category": category}
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for name in order:
            target = pairs[name][0]
            ref, ref_s = plain(target, ids, args.max_new_tokens, eos)
            out, out_s, stats = spec(gens[name], ids, args.max_new_tokens, eos)
            row[name] = {"equal": out == ref, "plain_tokens": ref, "spec_tokens": out,
                         "plain_tps": len(ref) / ref_s, "spec_tps": len(out) / out_s,
                         "speedup": (len(out) / out_s) / (len(ref) / ref_s),
                         "tau": stats.tau, "acceptance": stats.acceptance_rate}
        row["after_equal_to_unprepared_plain"] = row["after"]["spec_tokens"] == row["before"]["plain_tokens"]
        rows.append(row)
        print(f"{i + 1:2d} {category:17s} " + "  ".join(
            f"{n}: {'=' if row[n]['equal'] else '≠'} {row[n]['plain_tps']:.2f} -> "
            f"{row[n]['spec_tps']:.2f} tok/s ({row[n]['speedup']:.2f}x)" for n in ("before", "after")),
            flush=True)

    code = [r for r in rows if r["category"].startswith("code")]
    summary = {name: {
        "equal_to_generate": f"{sum(r[name]['equal'] for r in rows)}/{len(rows)}",
        "speedup": geomean([r[name]["speedup"] for r in rows]),
        "speedup_code": geomean([r[name]["speedup"] for r in code]),
        "plain_tps": geomean([r[name]["plain_tps"] for r in rows]),
        "spec_tps": geomean([r[name]["spec_tps"] for r in rows]),
    } for name in ("before", "after")}
    summary["after"]["equal_to_unprepared_generate"] = (
        f"{sum(r['after_equal_to_unprepared_plain'] for r in rows)}/{len(rows)}")
    print(json.dumps(summary, indent=1))
    if args.out:
        doc = {"config": {**vars(args), "out": str(args.out), "threads": torch.get_num_threads(),
                          "torch": torch.__version__, "machine": platform.processor()},
               "summary": summary, "rows": rows}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
