"""`specgen stats`: figures are ratios of sums, filters select, JSON and CSV carry the same
numbers, clear asks first, and a 40-column terminal renders."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specgen.app import store
from specgen.cli import app
from specgen.app.report import render_runs, render_summary, summarize
from specgen.cli.stats import parse_since
from specgen.app.store import RunRecord, load_runs, record_run

runner = CliRunner()
NOW = time.time()
DAY = 86400.0


def stats(new_tokens: int, passes: int, proposed: int, accepted: int, k_max: int = 4) -> dict:
    """A Stats.to_dict()-shaped dict whose steps all draft k_max (the last one fewer)."""
    per_pos_p, per_pos_a, hist = [0] * k_max, [0] * k_max, [0] * (k_max + 1)
    left_p, left_a, ks = proposed, accepted, []
    for _ in range(passes):
        k = min(k_max, left_p)
        n = min(k, left_a)
        left_p, left_a = left_p - k, left_a - n
        ks.append(k)
        if k:
            hist[n] += 1
            for i in range(k):
                per_pos_p[i] += 1
                per_pos_a[i] += i < n
    return {
        "k_max": k_max, "prompt_tokens": 7, "prefill_tokens": 6, "new_tokens": new_tokens,
        "target_passes": passes, "draft_passes": proposed, "proposed": proposed,
        "accepted": accepted, "per_position_proposed": per_pos_p,
        "per_position_accepted": per_pos_a, "accepted_length_hist": hist, "k_per_step": ks,
        "prefill_seconds": 0.1, "draft_seconds": 0.2 * proposed / 4, "verify_seconds": 0.5 * passes,
        "total_seconds": 0.1 + 0.2 * proposed / 4 + 0.5 * passes, "stop_reason": "eos",
        "tokens_per_second": new_tokens / (0.1 + 0.2 * proposed / 4 + 0.5 * passes),
    }


def add(db, profile: str, s: dict, age_days: float = 0.0, **fields) -> None:
    record = RunRecord(
        command=fields.pop("command", "run"), profile=profile, target=f"{profile}/target",
        draft=f"{profile}/draft", method=fields.pop("method", "draft-model"), device="cpu",
        dtype="bfloat16",
        quantization="none", adaptive=False, k_max=s["k_max"], temperature=0.0, top_p=1.0,
        top_k=0, ended=fields.pop("ended", "completed"), stats=s,
        created_at=NOW - age_days * DAY, **fields,
    )
    assert record_run(record, db) is None


@pytest.fixture
def db(tmp_path):
    """Two coder runs whose mean acceptance ratio (50%) differs from the ratio of sums (18%),
    one chat run ten days old, and one plain run."""
    path = tmp_path / "history.sqlite3"
    add(path, "coder", stats(new_tokens=12, passes=3, proposed=10, accepted=9), age_days=2)
    add(path, "coder", stats(new_tokens=30, passes=24, proposed=90, accepted=9), age_days=1)
    add(path, "chat", stats(new_tokens=20, passes=5, proposed=20, accepted=16), age_days=10,
        command="chat")
    add(path, "plain", stats(new_tokens=8, passes=8, proposed=0, accepted=0, k_max=0),
        ended="interrupted")
    return path


def invoke(*args: str, env: dict | None = None, input: str | None = None):
    return runner.invoke(app, ["stats", *args], env=env, input=input)


def as_json(db, *args: str) -> dict:
    result = invoke("--stats-db", str(db), "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def group(doc: dict, profile: str) -> dict:
    (found,) = [g for g in doc["groups"] if g["profile"] == profile]
    return found


def test_aggregates_are_ratios_of_sums(db):
    doc = as_json(db)
    coder = group(doc, "coder")
    assert coder["runs"] == 2
    assert coder["new_tokens"] == 42
    assert coder["acceptance_rate"] == pytest.approx(18 / 100)  # not (0.9 + 0.1) / 2
    assert coder["tau"] == pytest.approx(42 / 27)
    wall = sum(r["wall_seconds"] for r in load_runs(db, profile="coder"))
    assert coder["tokens_per_second"] == pytest.approx(42 / wall)
    verify, draft = 0.5 * 27, 0.2 * 100 / 4  # no prompt passes in these records
    assert coder["speedup_estimate"] == pytest.approx(42 * (verify / 27) / (draft + verify))
    rows = load_runs(db, profile="coder")
    assert coder["per_position_proposed"] == [
        a + b for a, b in zip(rows[0]["per_position_proposed"], rows[1]["per_position_proposed"])]
    assert coder["per_position_rate"][0] == pytest.approx(
        coder["per_position_accepted"][0] / coder["per_position_proposed"][0])
    assert sum(coder["accepted_length_hist"]) == sum(coder["k_hist"][1:])
    plain = group(doc, "plain")
    assert plain["acceptance_rate"] is None and plain["tau"] == 1.0
    assert doc["runs"] == 4 and doc["total"]["new_tokens"] == 70
    assert doc["total"]["acceptance_rate"] == pytest.approx((18 + 16) / 120)


def test_default_view_shows_profiles_and_charts(db):
    result = invoke("--stats-db", str(db), env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("coder", "chat", "plain", "18%", "1.56", "Acceptance by draft position",
                 "Drafts accepted per step", "no drafts proposed", "4 runs", "█"):
        assert text in out, text
    coder_line = next(line for line in out.splitlines() if line.strip().startswith("coder "))
    assert coder_line.split()[1:6] == ["draft-model:", "coder/draft", "2", "42", "18%"]


@pytest.mark.parametrize("view", [[], ["--runs"]])
def test_narrow_terminal_renders(db, view):
    result = invoke("--stats-db", str(db), *view, env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) >= 5
    assert max(len(line) for line in lines) <= 40


def test_render_into_a_40_column_console(db):
    console = Console(width=40, file=io.StringIO(), record=True, color_system="truecolor")
    rows = load_runs(db)
    render_summary(console, rows, db)
    render_runs(console, rows)
    text = console.export_text()
    assert "coder" in text and "18%" in text
    assert max(len(line) for line in text.splitlines()) <= 40


def test_profile_filter(db):
    doc = as_json(db, "--profile", "chat")
    assert [g["profile"] for g in doc["groups"]] == ["chat"] and doc["runs"] == 1


def test_since_filter(db):
    assert as_json(db, "--since", "7d")["runs"] == 3
    assert as_json(db, "--since", "36h")["runs"] == 2
    date = time.strftime("%Y-%m-%d", time.localtime(NOW - 5 * DAY))
    assert as_json(db, "--since", date)["runs"] == 3


def test_last_filter(db):
    doc = as_json(db, "--last", "2", "--runs")
    assert [r["profile"] for r in doc["runs"]] == ["coder", "plain"]


def test_bad_since_is_a_clear_error(db):
    result = invoke("--stats-db", str(db), "--since", "last tuesday")
    assert result.exit_code == 2
    assert "error:" in result.output and "7d" in result.output
    assert "Traceback" not in result.output


def test_parse_since():
    assert parse_since("24h", now=1000.0 * DAY) == 999 * DAY
    assert parse_since("2w", now=100 * DAY) == 86 * DAY
    assert parse_since("30m", now=3600.0) == 1800.0


def test_runs_lists_one_run_a_line(db):
    result = invoke("--stats-db", str(db), "--runs", env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 + 4  # header + runs, oldest first
    assert [line.split()[3] for line in lines[1:]] == ["chat", "coder", "coder", "plain"]
    assert "interrupted" in lines[-1]


def test_runs_json_matches_the_store(db):
    doc = as_json(db, "--runs")
    rows = load_runs(db)
    assert len(doc["runs"]) == 4
    for got, row in zip(doc["runs"], rows):
        assert {k: got[k] for k in row} == row
        assert got["acceptance_rate"] == (row["accepted"] / row["proposed"]
                                          if row["proposed"] else None)


def test_empty_history_says_how_to_make_some(tmp_path):
    result = invoke("--stats-db", str(tmp_path / "none.sqlite3"))
    assert result.exit_code == 0
    assert "No runs recorded yet" in result.stdout and 'specgen run "' in result.stdout
    assert not (tmp_path / "none.sqlite3").exists()


def test_no_match_says_so(db):
    result = invoke("--stats-db", str(db), "--profile", "nope")
    assert result.exit_code == 0
    assert "No runs match" in result.stdout and "4 records" in result.stdout


def test_env_var_selects_the_database(db):
    result = runner.invoke(app, ["stats", "--format", "json"], env={"SPECGEN_STATS_DB": str(db)})
    assert result.exit_code == 0 and json.loads(result.stdout)["runs"] == 4


def test_newer_schema_is_a_clear_error(db):
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 5}")
    result = invoke("--stats-db", str(db))
    assert result.exit_code == 2
    assert "newer specgen" in result.output and "Traceback" not in result.output


def test_corrupt_database_is_a_clear_error(tmp_path):
    db = tmp_path / "h.sqlite3"
    db.write_bytes(b"garbage" * 1000)
    result = invoke("--stats-db", str(db))
    assert result.exit_code == 2
    assert "Cannot use the run history" in result.output and "Traceback" not in result.output


def test_export_csv(db, tmp_path):
    out = tmp_path / "runs.csv"
    result = invoke("--stats-db", str(db), "export", "--csv", str(out))
    assert result.exit_code == 0, result.output
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stored = load_runs(db)
    assert len(rows) == 4
    assert [int(r["new_tokens"]) for r in rows] == [r["new_tokens"] for r in stored]
    assert [json.loads(r["per_position_accepted"]) for r in rows] == [
        r["per_position_accepted"] for r in stored]


def test_export_honours_filters_and_stdout(db):
    result = invoke("--stats-db", str(db), "--profile", "coder", "export", "--csv", "-")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["profile"] for r in rows] == ["coder", "coder"]


def test_clear_asks_first(db):
    result = invoke("--stats-db", str(db), "clear", input="n\n")
    assert result.exit_code == 1
    assert "Delete all 4 runs" in result.output
    assert len(load_runs(db)) == 4
    result = invoke("--stats-db", str(db), "clear", input="y\n")
    assert result.exit_code == 0 and load_runs(db) == []


def test_clear_yes_skips_the_question(db):
    result = invoke("clear", "--yes", "--stats-db", str(db))
    assert result.exit_code == 0, result.output
    assert "Delete all" not in result.output and "Deleted 4 runs" in result.output
    assert load_runs(db) == []
    add(db, "coder", stats(new_tokens=5, passes=2, proposed=4, accepted=3))  # still usable
    assert len(load_runs(db)) == 1


def test_clear_refuses_filters(db):
    result = invoke("--stats-db", str(db), "--profile", "coder", "clear", "--yes")
    assert result.exit_code == 2 and "whole history" in result.output
    assert len(load_runs(db)) == 4


def test_the_speedup_estimate_counts_the_prompts_passes_as_plain_steps(tmp_path):
    """Since the prompt's pass gives the first token, a record counts it among its target
    passes but not among its steps: it costs one plain step on both sides. Records made
    before count steps only, and keep their figure."""
    new = stats(new_tokens=11, passes=2, proposed=8, accepted=8)  # 1 + 5 + 5 tokens
    new["target_passes"] = 3
    old = stats(new_tokens=10, passes=2, proposed=8, accepted=8)
    for name, s, prompt_passes in (("new", new, 1), ("old", old, 0)):
        add(tmp_path / f"{name}.sqlite3", name, s)
        [row] = load_runs(tmp_path / f"{name}.sqlite3")
        step = s["verify_seconds"] / 2
        expected = s["new_tokens"] * step / (s["draft_seconds"] + s["verify_seconds"]
                                             + prompt_passes * step)
        assert summarize([row])["speedup_estimate"] == pytest.approx(expected)
        assert expected <= s["new_tokens"] / s["target_passes"]
