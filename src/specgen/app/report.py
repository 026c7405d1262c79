"""Summaries of the run history: aggregates over runs (pure functions of the stored rows) and
their Rich rendering (tables, per-position acceptance bars). Shared by `specgen stats` and
chat's /stats. No torch.

Aggregates are ratios of sums (sum accepted / sum proposed, sum tokens / sum target passes),
never means of per-run ratios, so a long run weighs what it generated. Runs are summed only
with runs whose figures are comparable: the same profile, drafting method and draft model
(`by_group`). The speedup estimate needs specgen's own counts (steps, draft and verify
time), so it is given only for runs of specgen's drafting methods; older histories also hold
bench measurements of transformers' and llama.cpp's decoding (methods
"transformers-assisted", "llama.cpp", "none"), whose counts mean something else.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specgen.choices import METHODS
from specgen.core.stats import step_speedup

NARROW = 64  # below this width, one two-column table per profile instead of one wide table
MAX_BAR = 40


def _sum_lists(lists: list[list[int]]) -> list[int]:
    out = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            out[i] += v
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def run_figures(row: dict) -> dict:
    """One run's ratios not stored as columns (None where undefined, e.g. no drafts)."""
    return {
        "acceptance_rate": _ratio(row["accepted"], row["proposed"]),
        "tau": _ratio(row["new_tokens"], row["target_passes"]),
    }


def summarize(runs: list[dict]) -> dict:
    """Totals and ratios of sums over `runs` (any mix of K_max: lists are summed by index)."""
    total = {k: sum(r[k] for r in runs) for k in (
        "new_tokens", "prompt_tokens", "target_passes", "draft_passes", "proposed", "accepted",
        "draft_seconds", "verify_seconds", "wall_seconds")}
    pos_proposed = _sum_lists([r["per_position_proposed"] for r in runs])
    pos_accepted = _sum_lists([r["per_position_accepted"] for r in runs])
    k_hist = _sum_lists([r["k_hist"] for r in runs])
    speedup = step_speedup(total["new_tokens"], total["target_passes"], sum(k_hist),
                           total["draft_seconds"], total["verify_seconds"])
    if not all(r.get("method") in METHODS for r in runs):
        speedup = 0.0  # some counts are not specgen's steps: no estimate
    latest = runs[-1] if runs else {}
    return {
        "runs": len(runs),
        "target": latest.get("target"),
        "draft": latest.get("draft"),
        "method": latest.get("method"),
        **total,
        "acceptance_rate": _ratio(total["accepted"], total["proposed"]),
        "tau": _ratio(total["new_tokens"], total["target_passes"]),
        "tokens_per_second": _ratio(total["new_tokens"], total["wall_seconds"]),
        "speedup_estimate": speedup or None,
        "per_position_proposed": pos_proposed,
        "per_position_accepted": pos_accepted,
        "per_position_rate": [_ratio(a, p) for a, p in zip(pos_accepted, pos_proposed)],
        "accepted_length_hist": _sum_lists([r["accepted_length_hist"] for r in runs]),
        "k_hist": k_hist,
    }


def by_group(runs: list[dict]) -> list[dict]:
    """One summary per (profile, method, draft): what makes runs' figures comparable. Each
    carries its `profile`, `method` and `draft`; ordered by profile, then by most runs."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["profile"], r["method"], r["draft"]), []).append(r)
    out = [{**summarize(rows), "profile": p, "method": m, "draft": d}
           for (p, m, d), rows in groups.items()]
    return sorted(out, key=lambda s: (s["profile"], -s["runs"], s["method"], s["draft"] or ""))


def drafting(method: str | None, draft: str | None) -> str:
    """Who drafted, in a few words: the method and its draft model ("draft-model: X",
    "prompt-lookup", "no drafting" for plain decoding)."""
    if method in (None, "none"):
        return "no drafting"
    return f"{method}: {draft}" if draft else method


def group_label(s: dict) -> str:
    return f"{s['profile']} · {drafting(s['method'], s['draft'])}"


def fmt_value(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def pct(value: float | None) -> str:
    return fmt_value(None if value is None else 100 * value, ".0f", "%")


HEADLINE = (  # (column, key, format)
    ("runs", "runs", lambda v: f"{v:,}"),
    ("tokens", "new_tokens", lambda v: f"{v:,}"),
    ("accept", "acceptance_rate", pct),
    ("tau", "tau", lambda v: fmt_value(v, ".2f")),
    ("tok/s", "tokens_per_second", lambda v: fmt_value(v, ".1f")),
    ("speedup", "speedup_estimate", lambda v: fmt_value(v, ".2f", "x")),
)


def summary_tables(groups: list[dict], width: int) -> list[Table]:
    """One row per group (profile and drafting) when it fits, else one two-column table per
    group."""
    if width >= NARROW:
        table = Table(box=box.SIMPLE_HEAD, title="Runs by profile and drafting",
                      title_justify="left", show_edge=False)
        table.add_column("profile", overflow="fold")
        table.add_column("drafting", overflow="fold")
        for name, _, _ in HEADLINE:
            table.add_column(name, justify="right", no_wrap=True)
        for s in groups:
            table.add_row(s["profile"], drafting(s["method"], s["draft"]),
                          *(fmt(s[key]) for _, key, fmt in HEADLINE))
        return [table]
    tables = []
    for s in groups:
        table = Table(box=box.SIMPLE_HEAD, title=group_label(s), title_justify="left",
                      show_header=False, show_edge=False)
        table.add_column("figure")
        table.add_column("value", justify="right")
        for name, key, fmt in HEADLINE:
            table.add_row(name, fmt(s[key]))
        tables.append(table)
    return tables


EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of `width` cells filled to `fraction`, in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (EIGHTHS[part] if part else "")


def bar_lines(rows: list[tuple[str, float, str]], width: int, style: str) -> list[Text]:
    """Label, bar on a dim track, and note per row, fitted to `width` columns."""
    label_w = max((len(label) for label, _, _ in rows), default=0)
    note_w = max((len(note) for _, _, note in rows), default=0)
    bar_w = min(MAX_BAR, max(4, width - label_w - note_w - 4))
    lines = []
    for label, fraction, note in rows:
        filled = bar(fraction, bar_w)
        line = Text(f"  {label:>{label_w}} ")
        line.append(filled, style=style)
        line.append("░" * (bar_w - len(filled)), style="dim")
        line.append(f" {note:>{note_w}}")
        lines.append(line)
    return lines


def profile_charts(profile: str, s: dict, width: int) -> list[Text | str]:
    """Acceptance by draft position and the accepted-length histogram for one group of runs,
    under a heading naming its profile, who drafted and the target."""
    out: list[Text | str] = []
    pair = f"{drafting(s.get('method'), s['draft'])} -> {s['target']}"
    out.append(Text.assemble((profile, "bold"), "  ", (pair, "dim")))
    positions = [(str(i + 1), rate or 0.0, f"{pct(rate):>4} of {n:,}")
                 for i, (rate, n) in enumerate(zip(s["per_position_rate"],
                                                   s["per_position_proposed"])) if n]
    if positions:
        out.append("Acceptance by draft position")
        out += bar_lines(positions, width, "green")
    hist = s["accepted_length_hist"]
    steps = sum(hist)
    if steps:
        top = max(hist)
        out.append("Drafts accepted per step")
        out += bar_lines([(str(n), c / top, f"{pct(c / steps):>4} {c:,}")
                          for n, c in enumerate(hist)], width, "cyan")
    if not positions:
        out.append(Text("  no drafts proposed (plain decoding)", style="dim"))
    return out


def render_summary(console: Console, runs: list[dict], db_path: Path) -> None:
    groups = by_group(runs)
    for table in summary_tables(groups, console.width):
        console.print(table)
    for s in groups:
        console.print()
        for line in profile_charts(s["profile"], s, console.width):
            console.print(line, no_wrap=True, overflow="ellipsis")
    console.print()
    console.print(Text(f"{len(runs):,} runs · history: {db_path}", style="dim"), overflow="fold")


def render_runs(console: Console, runs: list[dict]) -> None:
    """One line per run; a narrow terminal gets the essential columns only."""
    wide = console.width >= NARROW
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["when", "command", "profile", "tokens", "accept", "tau", "tok/s", "ended"]
    if console.width >= 2 * NARROW:
        columns.insert(3, "method")
    if not wide:
        columns = ["when", "profile", "accept", "tau"]
    for name in columns:
        right = name in ("tokens", "accept", "tau", "tok/s")
        table.add_column(name, justify="right" if right else "left", no_wrap=True,
                         overflow="ellipsis", min_width=len(name))
    for r in runs:
        f = run_figures(r)
        cells = {
            "when": datetime.fromtimestamp(r["created_at"]).strftime("%m-%d %H:%M"),
            "command": r["command"], "profile": r["profile"], "method": r["method"],
            "tokens": f"{r['new_tokens']:,}",
            "accept": pct(f["acceptance_rate"]), "tau": fmt_value(f["tau"], ".2f"),
            "tok/s": fmt_value(r["tokens_per_second"], ".1f"), "ended": r["ended"],
        }
        table.add_row(*(cells[name] for name in columns))
    console.print(table)
