"""A bench run's figures: per prompt (medians over repeats, ratios against the baseline, the
peer, bf16, llama.cpp's plain and llama.cpp's speculative decoding of the same prompt, equality of the tokens), per contestant
(geometric means), the JSON document and the Rich tables."""

from __future__ import annotations

import os
import platform
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from specgen.bench.harness import geomean, median
from specgen.bench.prompts import CATEGORIES, CODE_CATEGORIES
from specgen.bench.runner import BenchPrompt, Measurement
from specgen.decoding import llamacpp


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def per_prompt(measurements: Sequence[Measurement], prompts: Sequence[BenchPrompt],
               names: Sequence[str]) -> list[dict]:
    """One row per (prompt, contestant): medians over repeats, ratios against the baseline,
    the peer, bf16 and llama.cpp of the same prompt, and whether the tokens equal the baseline's."""
    groups: dict[tuple[int, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.prompt, m.contestant), []).append(m)
    rows = []
    for p, prompt in enumerate(prompts):
        base = groups.get((p, "baseline"))
        peer = groups.get((p, "peer"))
        base_tps = median([m.tokens_per_second for m in base]) if base else None
        base_decode = median([m.decode_tokens_per_second for m in base]) if base else None
        peer_tps = median([m.tokens_per_second for m in peer]) if peer else None
        bf16 = groups.get((p, "bf16"))
        bf16_tps = median([m.tokens_per_second for m in bf16]) if bf16 else None
        llama = groups.get((p, "llamacpp"))
        llama_tps = median([m.tokens_per_second for m in llama]) if llama else None
        llama_spec = groups.get((p, "llamacpp-spec"))
        llama_spec_tps = median([m.tokens_per_second for m in llama_spec]) if llama_spec else None
        plain = groups.get((p, "plain"))
        plain_tps = median([m.tokens_per_second for m in plain]) if plain else None
        for name in names:
            ms = groups.get((p, name))
            if not ms:
                continue
            tps = median([m.tokens_per_second for m in ms])
            decode = median([m.decode_tokens_per_second for m in ms])
            rows.append({
                "prompt": p, "category": prompt.category, "contestant": name,
                "repeats": len(ms),
                "new_tokens": ms[0].new_tokens,
                "tokens_per_second": tps,
                "tokens_per_second_all": [m.tokens_per_second for m in ms],
                "seconds": median([m.seconds for m in ms]),
                "speedup": tps / base_tps if base_tps else None,
                "decode_tokens_per_second": decode,
                "decode_speedup": decode / base_decode if decode and base_decode else None,
                "vs_peer": tps / peer_tps if peer_tps else None,
                "vs_bf16": tps / bf16_tps if bf16_tps else None,
                "vs_llamacpp": tps / llama_tps if llama_tps else None,
                "vs_llamacpp_spec": tps / llama_spec_tps if llama_spec_tps else None,
                "vs_plain": tps / plain_tps if plain_tps else None,
                "acceptance_rate": median([m.acceptance_rate for m in ms]),
                "tau": median([m.tau for m in ms]),
                "draft_seconds": median([m.draft_seconds for m in ms]),
                "verify_seconds": median([m.verify_seconds for m in ms]),
                "rest_seconds": median([m.rest_seconds for m in ms]),
                "prefill_seconds": median([m.prefill_seconds for m in ms]),
                "peak_memory_bytes": max(m.peak_memory_bytes for m in ms),
                "equal_to_baseline": (ms[0].token_ids == base[0].token_ids) if base else None,
                "common_prefix_with_baseline": (common_prefix(ms[0].token_ids, base[0].token_ids)
                                                if base else None),
                "mean_k": (statistics.fmean(ms[0].k_per_step) if ms[0].k_per_step else None),
                "per_position_proposed": _sum_lists([m.per_position_proposed for m in ms]),
                "per_position_accepted": _sum_lists([m.per_position_accepted for m in ms]),
            })
    return rows


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    lists = [x for x in lists if x]
    return [sum(col) for col in zip(*lists)] if lists else []


def acceptance_by_position(rows: Sequence[dict]) -> list[float | None]:
    """Of the drafts at each position of a step (1st, 2nd, ...), the share the target kept."""
    proposed = _sum_lists([r.get("per_position_proposed", []) for r in rows])
    accepted = _sum_lists([r.get("per_position_accepted", []) for r in rows])
    return [a / p if p else None for a, p in zip(accepted, proposed)]


def summarize(rows: Sequence[dict], names: Sequence[str],
              code: Sequence[str] = CODE_CATEGORIES) -> dict[str, dict]:
    """Per contestant: geometric means of tokens/s, of the speedup over the baseline (per
    category the prompts have, over the `code` categories and over everything) and of the
    ratio over the peer; the worst single-prompt speedup; how many outputs equal the
    baseline's; tokens per target pass (tau) per category and acceptance per draft position."""
    out = {}
    code = set(code)
    for name in names:
        mine = [r for r in rows if r["contestant"] == name]
        if not mine:
            continue
        categories = sorted({r["category"] for r in mine}, key=_category_order)
        speedups = [r["speedup"] for r in mine if r["speedup"] is not None]
        equal = [r["equal_to_baseline"] for r in mine if r["equal_to_baseline"] is not None]
        out[name] = {
            "tokens_per_second": geomean([r["tokens_per_second"] for r in mine]),
            "speedup": geomean(speedups),
            "speedup_by_category": {
                c: geomean([r["speedup"] for r in mine if r["category"] == c and r["speedup"]])
                for c in categories},
            "speedup_code": geomean([r["speedup"] for r in mine
                                     if r["category"] in code and r["speedup"]]),
            "vs_peer": geomean([r["vs_peer"] for r in mine if r["vs_peer"]]),
            "vs_bf16": geomean([r["vs_bf16"] for r in mine if r["vs_bf16"]]),
            "vs_llamacpp": geomean([r["vs_llamacpp"] for r in mine if r["vs_llamacpp"]]),
            "vs_llamacpp_code": geomean([r["vs_llamacpp"] for r in mine if r["vs_llamacpp"]
                                         and r["category"] in code]),
            # Over llama.cpp's own speculative decoding of the same GGUF pair, where it ran.
            "vs_llamacpp_spec": geomean([r["vs_llamacpp_spec"] for r in mine
                                         if r["vs_llamacpp_spec"]]),
            "vs_llamacpp_spec_code": geomean([r["vs_llamacpp_spec"] for r in mine
                                              if r["vs_llamacpp_spec"] and r["category"] in code]),
            "decode_speedup": geomean([r["decode_speedup"] for r in mine if r["decode_speedup"]]),
            "decode_speedup_code": geomean([r["decode_speedup"] for r in mine if r["decode_speedup"]
                                            and r["category"] in code]),
            "min_speedup": min(speedups) if speedups else None,
            # Over specgen's own plain decoding of the same target (K = 0), where it ran.
            "vs_plain": geomean([r["vs_plain"] for r in mine if r["vs_plain"]]),
            "vs_plain_by_category": {
                c: geomean([r["vs_plain"] for r in mine if r["category"] == c and r["vs_plain"]])
                for c in categories},
            "vs_plain_code": geomean([r["vs_plain"] for r in mine
                                      if r["category"] in CODE_CATEGORIES and r["vs_plain"]]),
            "min_vs_plain": min((r["vs_plain"] for r in mine if r["vs_plain"]), default=None),
            "acceptance_rate": median([r["acceptance_rate"] for r in mine]),
            "tau": median([r["tau"] for r in mine]),
            "tau_by_category": {c: median([r["tau"] for r in mine if r["category"] == c])
                                for c in categories},
            "acceptance_by_position": acceptance_by_position(mine),
            "equal_to_baseline": f"{sum(equal)}/{len(equal)}" if equal else None,
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in mine),
        }
    return out


def _category_order(category: str) -> tuple[int, str]:
    return (CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES), category)


def machine_info() -> dict:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"model name\s*:\s*(.+)", text).group(1).strip()
    except (OSError, AttributeError):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    if version := llamacpp.version():
        info["llama_cpp_python"] = version
    return info


def report(measurements: Sequence[Measurement], prompts: Sequence[BenchPrompt],
           names: Sequence[str], config: dict) -> dict:
    """The full JSON document of a bench run."""
    rows = per_prompt(measurements, prompts, names)
    summary = summarize(rows, names, config.get("code_categories", CODE_CATEGORIES))
    return {
        "config": config,
        "machine": machine_info(),
        "prompts": [asdict(p) for p in prompts],
        "contestants": list(names),
        "summary": summary,
        "per_prompt": rows,
        "measurements": [asdict(m) for m in measurements],
    }


def fmt_ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def tables(doc: dict):
    """Two Rich tables: tokens/s and speedup per prompt, then the summary per contestant."""
    from rich.table import Table

    names = doc["contestants"]
    per = Table(title="tokens/s (speedup over baseline), median per prompt", title_justify="left")
    per.add_column("#", justify="right")
    per.add_column("category")
    for name in names:
        per.add_column(name, justify="right")
    cells = {(r["prompt"], r["contestant"]): r for r in doc["per_prompt"]}
    for p, prompt in enumerate(doc["prompts"]):
        row = [str(p + 1), prompt["category"]]
        for name in names:
            r = cells.get((p, name))
            if r is None:
                row.append("")
                continue
            mark = "" if r["equal_to_baseline"] in (None, True) else "≠"
            extra = "" if name == "baseline" else f" ({fmt_ratio(r['speedup'])})"
            row.append(f"{r['tokens_per_second']:.2f}{extra}{mark}")
        per.add_row(*row)

    # One column per contestant, one row per figure: narrow enough for a terminal.
    summary = doc["summary"]
    cats = sorted({c for s in summary.values() for c in s["speedup_by_category"]},
                  key=_category_order)
    code = [c for c in doc["config"].get("code_categories", CODE_CATEGORIES) if c in cats]
    # The code categories together; one category alone is its own row already.
    code_row = [("  all code", lambda s: fmt_ratio(s["speedup_code"]))] if len(code) > 1 else []
    total = Table(title="summary (geometric means over prompts)", title_justify="left")
    total.add_column("")
    for name in summary:
        total.add_column(name, justify="right")
    figures = [
        ("tokens/s", lambda s: _f(s["tokens_per_second"])),
        ("speedup", lambda s: fmt_ratio(s["speedup"])),
        *code_row,
        *[(f"  {c}", lambda s, c=c: fmt_ratio(s["speedup_by_category"].get(c))) for c in cats],
        ("  worst prompt", lambda s: fmt_ratio(s["min_speedup"])),
        ("decode speedup", lambda s: fmt_ratio(s["decode_speedup"])),
        ("vs peer", lambda s: fmt_ratio(s["vs_peer"])),
        *([("vs plain", lambda s: fmt_ratio(s["vs_plain"])),
           ("  code", lambda s: fmt_ratio(s["vs_plain_code"])),
           ("  worst prompt", lambda s: fmt_ratio(s["min_vs_plain"]))] if "plain" in summary else []),
        *([("vs bf16", lambda s: fmt_ratio(s["vs_bf16"]))] if "bf16" in summary else []),
        *([("vs llama.cpp", lambda s: fmt_ratio(s["vs_llamacpp"])),
           ("vs llama.cpp, code", lambda s: fmt_ratio(s["vs_llamacpp_code"]))]
          if "llamacpp" in summary else []),
        *([("vs llama.cpp spec", lambda s: fmt_ratio(s["vs_llamacpp_spec"])),
           ("vs llama.cpp spec, code", lambda s: fmt_ratio(s["vs_llamacpp_spec_code"]))]
          if "llamacpp-spec" in summary else []),
        ("acceptance", lambda s: _f(s["acceptance_rate"])),
        ("tau", lambda s: _f(s["tau"])),
        ("= baseline", lambda s: s["equal_to_baseline"] or "–"),
        ("peak GB", lambda s: f"{s['peak_memory_bytes'] / 1e9:.1f}"),
    ]
    for label, cell in figures:
        total.add_row(label, *[cell(s) for s in summary.values()])
    return [per, total]
