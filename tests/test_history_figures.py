"""Figures users can trust (issue 38): `specgen stats` shows what users ran, summed only where
the counts mean the same thing, and `specgen bench` summarises by the categories its prompts
have. The speedup estimate of any group never exceeds its tokens per target pass."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from specgen.app import store
from specgen.app.report import summarize
from specgen.app.store import RunRecord, load_runs, record_run
from specgen.bench import report as rep
from specgen.bench import runner as b
from specgen.bench.prompts import CODE_CATEGORIES
from specgen.cli import app
from specgen.core.stats import Stats

PROFILE = "qwen-coder-demo-llamacpp"
TARGET, DRAFT = "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"


def engine_stats(steps: list[tuple[int, int]], k_max: int = 4, prompt_pass: bool = True,
                 draft_s: float = 0.05, verify_s: float = 0.2) -> Stats:
    """Stats as the engine fills them: the prompt's pass (one token), then steps (k, n)."""
    s = Stats(k_max=k_max, adaptive=True, prompt_tokens=9, prefill_tokens=9)
    s.new_tokens = s.target_passes = int(prompt_pass)
    for k, n in steps:
        s.record_step(k, n)
        s.new_tokens += n + 1
    s.draft_seconds = draft_s * sum(k for k, _ in steps)
    s.verify_seconds = verify_s * len(steps)
    s.total_seconds = s.draft_seconds + s.verify_seconds + 0.1
    s.stop_reason = "max_new_tokens"
    return s


def record(stats: Stats, command: str = "run", method: str = "draft-model",
           draft: str | None = DRAFT, **fields) -> RunRecord:
    return RunRecord(command=command, profile=fields.pop("profile", PROFILE), target=TARGET,
                     draft=draft, method=method, device="cpu", dtype="bfloat16",
                     quantization="none", adaptive=True, k_max=stats.k_max, temperature=0.0,
                     top_p=1.0, top_k=0, ended="completed", stats=stats.to_dict(), **fields)


def bench_records() -> list[RunRecord]:
    """What `specgen bench` recorded before it stopped recording (one prompt): the baseline
    and the bf16 reference (method "none": transformers' generate, one pass per token),
    transformers' assisted generation (96 tokens in 8 passes, no steps), llama.cpp's plain
    decoding, and specgen's own contestants."""
    base = Stats(k_max=0, adaptive=False, new_tokens=96, target_passes=96, total_seconds=18.0)
    peer = Stats(k_max=0, adaptive=False, new_tokens=96, target_passes=8, draft_passes=88,
                 proposed=88, accepted=88, total_seconds=9.0)
    llama = Stats(k_max=0, adaptive=False, new_tokens=96, target_passes=96, total_seconds=4.0)
    own = engine_stats([(4, 2), (4, 0), (4, 4), (4, 1)] * 6)
    return [record(base, "bench", "none", None), record(base, "bench", "none", None),
            record(peer, "bench", "transformers-assisted"), record(llama, "bench", "llama.cpp", None),
            record(own, "bench"), record(engine_stats([(2, 2)] * 20), "bench"),
            record(engine_stats([(0, 0)] * 30), "bench", "none", None)]


def user_records() -> list[RunRecord]:
    return [record(engine_stats([(4, 3), (4, 1), (4, 4)] * 5)),
            record(engine_stats([(4, 0), (3, 3)] * 4), command="chat"),
            record(engine_stats([(4, 4)] * 3), method="prompt-lookup", draft=None),
            record(engine_stats([(2, 1)] * 7), profile="qwen-coder-demo")]


def stats_json(db, *args: str) -> dict:
    result = CliRunner().invoke(app, ["stats", "--stats-db", str(db), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    doc.pop("db")
    return doc


def test_bench_records_in_the_history_change_no_figure(tmp_path):
    mixed, runs_only = tmp_path / "mixed.db", tmp_path / "runs.db"
    users = user_records()
    for rec in [*bench_records()[:3], users[0], *bench_records()[3:], *users[1:]]:
        assert record_run(rec, mixed) is None
    for rec in users:
        assert record_run(rec, runs_only) is None
    assert stats_json(mixed) == stats_json(runs_only)
    listed = [[{k: v for k, v in r.items() if k != "id"} for r in stats_json(db, "--runs")["runs"]]
              for db in (mixed, runs_only)]
    assert listed[0] == listed[1]
    assert stats_json(mixed, "--last", "2") == stats_json(runs_only, "--last", "2")
    assert stats_json(mixed, "--command", "bench")["runs"] == len(bench_records())
    assert stats_json(mixed, "--command", "all")["runs"] == len(bench_records()) + len(users)
    assert stats_json(mixed, "--command", "chat")["runs"] == 1


def test_runs_are_summed_only_with_comparable_runs(tmp_path):
    db = tmp_path / "h.db"
    for rec in [*user_records(), *bench_records()]:
        assert record_run(rec, db) is None
    groups = stats_json(db)["groups"]
    keys = [(g["profile"], g["method"], g["draft"]) for g in groups]
    assert len(keys) == len(set(keys)) == 3
    coder = next(g for g in groups if g["profile"] == PROFILE and g["method"] == "draft-model")
    assert coder["runs"] == 2  # the run and the chat turn with that draft, not prompt lookup
    bench = {g["method"]: g for g in stats_json(db, "--command", "bench")["groups"]}
    assert set(bench) == {"none", "transformers-assisted", "llama.cpp", "draft-model"}
    for method in ("none", "transformers-assisted", "llama.cpp"):  # counts that are no steps
        assert bench[method]["speedup_estimate"] is None
    assert bench["draft-model"]["speedup_estimate"] <= bench["draft-model"]["tau"]


def test_headings_name_who_drafted(tmp_path):
    db = tmp_path / "h.db"
    for rec in [*user_records(), *bench_records()]:
        assert record_run(rec, db) is None
    out = CliRunner().invoke(app, ["stats", "--stats-db", str(db)], env={"COLUMNS": "200"}).stdout
    assert f"{PROFILE}  draft-model: {DRAFT} -> {TARGET}" in out
    assert f"{PROFILE}  prompt-lookup -> {TARGET}" in out
    assert "no draft ->" not in out
    out = CliRunner().invoke(app, ["stats", "--stats-db", str(db), "--command", "bench"],
                             env={"COLUMNS": "200"}).stdout
    assert f"{PROFILE}  no drafting -> {TARGET}" in out
    assert f"{PROFILE}  transformers-assisted: {DRAFT} -> {TARGET}" in out
    assert f"{PROFILE}  llama.cpp -> {TARGET}" in out


# --- the property: a speedup estimate never exceeds tau ----------------------------------------

steps = st.lists(st.integers(0, 6).flatmap(lambda k: st.tuples(st.just(k), st.integers(0, k))),
                 max_size=30)
engine_records = st.builds(
    lambda s, method, prompt_pass, draft_s, verify_s: record(
        engine_stats(s, 6, prompt_pass, draft_s, verify_s), method=method),
    steps, st.sampled_from(["draft-model", "prompt-lookup", "hybrid"]), st.booleans(),
    st.floats(0, 1), st.floats(1e-4, 1))
other_records = st.builds(
    lambda passes, extra, seconds, method: record(
        Stats(k_max=0, adaptive=False, new_tokens=passes + extra, target_passes=passes,
              proposed=extra, accepted=extra, total_seconds=seconds), "bench", method),
    st.integers(1, 200), st.integers(0, 400), st.floats(0.01, 100),
    st.sampled_from(["none", "transformers-assisted", "llama.cpp"]))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.one_of(engine_records, other_records), min_size=1, max_size=8))
def test_a_groups_speedup_never_exceeds_its_tokens_per_target_pass(records):
    from specgen.app.report import by_group

    rows = []
    for rec in records:
        row = store._row(rec)
        for name in store.JSON_COLUMNS:
            row[name] = json.loads(row[name])
        rows.append(row)
    for s in [*by_group(rows), summarize(rows)]:
        if s["speedup_estimate"] is not None:
            assert s["tau"] is not None
            assert s["speedup_estimate"] <= s["tau"] * (1 + 1e-9), s


def test_the_engines_own_estimate_never_exceeds_tau(tiny_pair):
    import torch

    from specgen import SpeculativeGenerator

    target, draft = tiny_pair()
    gen = SpeculativeGenerator(target, draft, 4)
    for p in ([1, 2, 3], [5, 5, 5, 5, 5, 5]):
        s = gen.generate(torch.tensor(p), max_new_tokens=30).stats
        assert 0 < s.speedup_estimate <= s.tau


# --- bench categories ---------------------------------------------------------------------------

def test_which_categories_count_as_code():
    from specgen.bench.prompts import code_categories

    assert code_categories(["code-completion", "prose", "grounded", "code-explanation"],
                           builtin=True) == ["code-completion", "code-explanation"]
    assert code_categories(["code", "prose", "Python-Code", "code"], builtin=False) == [
        "code", "Python-Code"]
    assert code_categories(["prose", "json"], builtin=False) == []


def measurements(categories: list[str]) -> tuple[list, list]:
    prompts = [b.BenchPrompt(c, f"p{i}") for i, c in enumerate(categories)]
    ms = []
    for i, c in enumerate(categories):
        for name, tps in (("baseline", 5.0), ("adaptive", 10.0 if "code" in c else 4.0),
                          ("llamacpp", 8.0)):
            ms.append(b.Measurement(
                prompt=i, category=c, contestant=name, repeat=0, new_tokens=3, seconds=3 / tps,
                tokens_per_second=tps, decode_tokens_per_second=tps, target_passes=2,
                draft_passes=0, acceptance_rate=None, tau=1.5, draft_seconds=None,
                verify_seconds=None, rest_seconds=None, prefill_seconds=None,
                peak_memory_bytes=1, token_ids=[1, 2, 3]))
    return prompts, ms


def summary_text(doc: dict) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(rep.tables(doc)[1])
    return console.file.getvalue()


def test_a_custom_prompt_file_gets_a_code_summary():
    from specgen.bench.prompts import code_categories

    categories = ["code", "prose", "code"]
    prompts, ms = measurements(categories)
    names = ["baseline", "adaptive", "llamacpp"]
    doc = rep.report(ms, prompts, names, {"code_categories": code_categories(categories, False)})
    adaptive = doc["summary"]["adaptive"]
    assert adaptive["speedup_code"] == pytest.approx(2.0)
    assert adaptive["vs_llamacpp_code"] == pytest.approx(10 / 8)
    assert adaptive["speedup_by_category"] == pytest.approx({"code": 2.0, "prose": 0.8})
    text = summary_text(doc)
    labels = [line.split("│")[1].strip() if "│" in line else line.split()[0]
              for line in text.splitlines() if line.strip()]
    assert labels.count("code") == 1  # once, not as a sum and again as its category
    code_line = next(line for line in text.splitlines() if line.strip("│ ").startswith("code "))
    assert "2.00x" in code_line and "–" not in code_line.split("│")[3]
    llama_line = next(line for line in text.splitlines() if "vs llama.cpp, code" in line)
    assert "1.25x" in llama_line


def test_the_builtin_set_sums_its_code_categories():
    from specgen.bench.prompts import code_categories

    categories = [c for c, _ in __import__("specgen.bench.prompts", fromlist=["PROMPTS"]).PROMPTS]
    prompts, ms = measurements(categories)
    doc = rep.report(ms, prompts, ["baseline", "adaptive"],
                     {"code_categories": code_categories(categories, True)})
    assert doc["summary"]["adaptive"]["speedup_code"] == pytest.approx(2.0)
    text = summary_text(doc)
    assert "all code" in text and all(c in text for c in CODE_CATEGORIES)


def test_bench_on_a_custom_file_prints_a_code_summary(tiny_profile, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "h.db"))
    prompts = tmp_path / "my.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": c, "prompt": p}) for c, p in (
        ("code", "def add(a, b):"), ("prose", "Once upon a time"))))
    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench", "-p", str(tiny_profile), "--prompts", str(prompts),
                                      "-n", "4", "--contestants", "baseline,k2", "--out", str(out)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["config"]["code_categories"] == ["code"]
    assert doc["summary"]["k2"]["speedup_code"] is not None
    code_line = next(line for line in result.stdout.splitlines()
                     if line.strip("│ ").startswith("code "))
    assert "x" in code_line.split("│")[-2]  # a figure, not "–"
    assert not store.history_db().exists() or load_runs() == []


def test_bench_help_says_which_categories_count_as_code():
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert 'contains "code"' in result.stdout and "code-completion" in result.stdout


def test_help_paragraphs_flow_to_the_terminal_and_keep_their_bracketed_words():
    """A help paragraph wrapped in the source must not break where the source did, and
    words in brackets (profile sections) are text, not Rich markup that would vanish."""
    wide = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "250"})
    assert "interleaved prompt by prompt, greedy:" in wide.stdout
    assert "  specgen bench --prompts my_prompts.jsonl" in wide.stdout  # examples as written
    tune = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "250"})
    assert "[speculation] skip_layers" in tune.stdout
    train = CliRunner().invoke(app, ["heads", "train", "--help"], env={"COLUMNS": "250"})
    assert "[draft] head" in train.stdout
