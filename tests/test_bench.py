"""`specgen bench`: interleaving, ratios, geometric means, JSON shape and staying out of the
run history, on the tiny fp32 pair (no timed assertions: the figures themselves are the benchmark's business)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from specgen.bench import harness
from specgen.bench import report as rep
from specgen.bench.prompts import CATEGORIES
from specgen.choices import CONTESTANTS
from specgen.bench import runner as b
from specgen.cli import app


@pytest.fixture(autouse=True)
def isolated_history(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [{"category": "code-completion", "prompt": "def add(a, b):"},
             {"category": "prose", "prompt": "Once upon a time"},
             {"category": "grounded", "prompt": "abc abc abc abc"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    return path


def invoke(*args):
    return CliRunner().invoke(app, ["bench", *args])


# --- pure logic --------------------------------------------------------------------------------

def test_schedule_interleaves_prompt_by_prompt_and_rotates_each_repeat_and_prompt():
    order = harness.schedule(2, ["a", "b", "c"], repeats=2)
    assert order == [
        (0, 0, "a"), (0, 0, "b"), (0, 0, "c"), (0, 1, "b"), (0, 1, "c"), (0, 1, "a"),
        (1, 0, "b"), (1, 0, "c"), (1, 0, "a"), (1, 1, "c"), (1, 1, "a"), (1, 1, "b"),
    ]
    firsts = [harness.schedule(3, ["a", "b", "c"])[3 * p][2] for p in range(3)]
    assert firsts == ["a", "b", "c"]  # one repeat: still no contestant always first


def test_interleave_warms_up_skips_and_reports_prompt_by_prompt():
    calls, warmed, prompts_done, synced = [], [], [], []
    trials = harness.interleave(
        ["a", "b"], 3, lambda name, p, r: calls.append((p, r, name)) or f"{name}{p}", repeats=2,
        warm_up=warmed.append, runs=lambda name, p: name == "a" or p == 0,
        sync=lambda: synced.append(1),
        on_prompt=lambda p, done: prompts_done.append((p, [t.name for t in done])))
    assert warmed == ["a", "b"]
    assert calls == [(0, 0, "a"), (0, 0, "b"), (0, 1, "b"), (0, 1, "a"),
                     (1, 0, "a"), (1, 1, "a"), (2, 0, "a"), (2, 1, "a")]
    assert [(t.prompt, t.repeat, t.name, t.value) for t in trials] == [
        (p, r, name, f"{name}{p}") for p, r, name in calls]
    assert all(t.seconds >= 0 for t in trials) and len(synced) == 2 * len(calls)
    assert prompts_done == [(0, ["a", "b", "b", "a"]), (1, ["a", "a"]), (2, ["a", "a"])]


def test_medians_over_repeats_and_ratios_over_prompts():
    trials = [harness.Trial(p, r, name, s, None) for p, r, name, s in [
        (0, 0, "a", 1.0), (0, 1, "a", 3.0), (0, 0, "base", 4.0),
        (1, 0, "a", 2.0), (1, 0, "base", 8.0), (2, 0, "base", 1.0)]]
    table = harness.medians(trials, lambda t: t.seconds)
    assert table == {(0, "a"): 2.0, (0, "base"): 4.0, (1, "a"): 2.0, (1, "base"): 8.0,
                     (2, "base"): 1.0}
    assert harness.ratio(table, "base", "a", range(3)) == pytest.approx(math.sqrt(2.0 * 4.0))
    assert harness.ratio(table, "a", "missing", range(3)) is None


def _m(prompt, category, name, tps, tokens=(1, 2, 3), repeat=0):
    return b.Measurement(
        prompt=prompt, category=category, contestant=name, repeat=repeat, new_tokens=len(tokens),
        seconds=len(tokens) / tps, tokens_per_second=tps, target_passes=1, draft_passes=0,
        decode_tokens_per_second=tps, acceptance_rate=None, tau=1.0, draft_seconds=None, verify_seconds=None,
        rest_seconds=None, prefill_seconds=None, peak_memory_bytes=100, token_ids=list(tokens))


def test_ratios_use_medians_and_geometric_means_per_category():
    prompts = [b.BenchPrompt("code-completion", "x"), b.BenchPrompt("code-explanation", "y"),
               b.BenchPrompt("prose", "z")]
    ms = [
        _m(0, "code-completion", "baseline", 5.0), _m(0, "code-completion", "peer", 8.0),
        _m(0, "code-completion", "adaptive", 10.0, repeat=0),
        _m(0, "code-completion", "adaptive", 40.0, repeat=1),
        _m(0, "code-completion", "adaptive", 20.0, repeat=2),  # median 20
        _m(1, "code-explanation", "baseline", 4.0), _m(1, "code-explanation", "peer", 4.0),
        _m(1, "code-explanation", "adaptive", 4.0, tokens=(1, 2, 4)),
        _m(2, "prose", "baseline", 10.0), _m(2, "prose", "peer", 5.0),
        _m(2, "prose", "adaptive", 9.0),
    ]
    names = ["baseline", "peer", "adaptive"]
    rows = rep.per_prompt(ms, prompts, names)
    cell = {(r["prompt"], r["contestant"]): r for r in rows}
    assert cell[0, "adaptive"]["tokens_per_second"] == 20.0
    assert cell[0, "adaptive"]["tokens_per_second_all"] == [10.0, 40.0, 20.0]
    assert cell[0, "adaptive"]["speedup"] == pytest.approx(4.0)
    assert cell[0, "adaptive"]["vs_peer"] == pytest.approx(2.5)
    assert cell[1, "adaptive"]["equal_to_baseline"] is False
    assert cell[1, "adaptive"]["common_prefix_with_baseline"] == 2
    assert cell[0, "baseline"]["speedup"] == pytest.approx(1.0)

    s = rep.summarize(rows, names)["adaptive"]
    assert s["speedup_by_category"] == pytest.approx(
        {"code-completion": 4.0, "code-explanation": 1.0, "prose": 0.9})
    assert s["speedup_code"] == pytest.approx(2.0)  # sqrt(4 * 1)
    assert s["speedup"] == pytest.approx((4.0 * 1.0 * 0.9) ** (1 / 3))
    assert s["vs_peer"] == pytest.approx((2.5 * 1.0 * 1.8) ** (1 / 3))
    assert s["min_speedup"] == pytest.approx(0.9)
    assert s["equal_to_baseline"] == "2/3"


def test_geomean_and_median_ignore_missing_values():
    assert harness.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert harness.geomean([]) is None
    assert math.isclose(harness.geomean([3.0]), 3.0)
    assert harness.median([1.0, None, 3.0]) == 2.0 and harness.median([None]) is None


def test_builtin_prompt_set_covers_every_category():
    prompts = b.builtin_prompts()
    assert len(prompts) >= 16
    assert {p.category for p in prompts} == set(CATEGORIES)


@pytest.mark.parametrize("text, message", [
    ('{"category": "x"}', "each line must be an object"),
    ("not json", "not valid JSON"),
    ("", "holds no prompts"),
])
def test_bad_prompt_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(b.ConfigError, match=message):
        b.read_prompts(path)


# --- end to end on the tiny pair ---------------------------------------------------------------

def test_bench_json_shape_exactness_and_no_recording(tiny_profile, prompts_file, tmp_path):
    from specgen.app.store import load_runs

    out = tmp_path / "bench.json"
    # --method draft-model: the fixed-K and adaptive entries draft with the draft model, so
    # every method runs (the profile's default, hybrid, would leave `hybrid` to `adaptive`).
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "12",
                    "--repeats", "2", "--method", "draft-model", "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    names = ["baseline", "peer", "k2", "k4", "k6", "adaptive", "lookup", "hybrid"]
    assert doc["contestants"] == names
    assert set(doc) == {"config", "machine", "prompts", "contestants", "summary",
                        "per_prompt", "measurements"}  # the team's goals are not the tool's
    assert len(doc["measurements"]) == 3 * 2 * len(names)
    assert len(doc["per_prompt"]) == 3 * len(names)
    # Interleaved: the first prompt's measurements all come before the second's.
    assert [m["prompt"] for m in doc["measurements"]] == sorted(m["prompt"] for m in doc["measurements"])
    for row in doc["per_prompt"]:
        # fp32 tiny models: every contestant's greedy output is the baseline's.
        assert row["equal_to_baseline"] is True, row
        assert row["speedup"] > 0 and row["vs_peer"] > 0
        assert row["repeats"] == 2 and row["peak_memory_bytes"] > 0
        if row["contestant"] in ("baseline", "peer"):
            assert row["draft_seconds"] is None
        else:
            assert row["draft_seconds"] + row["verify_seconds"] + row["rest_seconds"] == \
                pytest.approx(row["seconds"], rel=1e-6)
    base = [r for r in doc["per_prompt"] if r["contestant"] == "baseline"]
    assert all(r["speedup"] == pytest.approx(1.0) and r["tau"] == pytest.approx(1.0) for r in base)
    assert doc["summary"]["k4"]["equal_to_baseline"] == "3/3"
    assert doc["config"]["max_new_tokens"] == 12 and doc["config"]["complete"] is True
    assert doc["machine"]["torch"] and doc["machine"]["cores"] >= 1
    for row in doc["per_prompt"]:
        if row["contestant"] == "peer":
            assert row["decode_tokens_per_second"] is None  # not separable inside generate
        else:
            assert row["decode_tokens_per_second"] > 0 and row["prefill_seconds"] > 0

    assert load_runs(tmp_path / "history.sqlite3") == []  # --out keeps the figures
    assert "tokens/s" in result.stdout and "summary" in result.stdout


def test_a_chosen_subset_runs_only_those(tiny_profile, prompts_file, tmp_path):
    out = tmp_path / "b.json"
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "6",
                    "--contestants", "baseline,lookup", "--method", "prompt-lookup",
                    "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["contestants"] == ["baseline", "lookup"]
    assert {m["contestant"] for m in doc["measurements"]} == {"baseline", "lookup"}
    assert doc["summary"]["lookup"]["vs_peer"] is None  # no peer to compare with


@pytest.mark.parametrize("args, message", [
    (["--contestants", "baseline,turbo"], "Unknown contestant(s) turbo"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--draft-confidence", "1.5"], "--draft-confidence must be in [0, 1)"),
    (["--method", "magic"], "magic"),
    (["--prompts", "/no/such.jsonl"], "Cannot read the prompts file"),
])
def test_bad_options_are_one_clear_error(tiny_profile, args, message):
    result = invoke("-p", str(tiny_profile), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_a_quantized_target_is_measured_beside_bf16(tiny_profile, prompts_file, tmp_path):
    out = tmp_path / "q.json"
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "8",
                    "--target-quantization", "int8-dyn", "--draft-quantization", "int8-dyn",
                    "--contestants", "baseline,adaptive,bf16", "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["config"]["quantization"] == "int8-dyn"
    bf16 = [r for r in doc["per_prompt"] if r["contestant"] == "bf16"]
    assert len(bf16) == 3 and all(r["vs_bf16"] == pytest.approx(1.0) for r in bf16)
    assert all(r["common_prefix_with_baseline"] is not None for r in bf16)
    base = doc["summary"]["baseline"]
    assert base["vs_bf16"] > 0
    # int8-dyn verifies each token as a one-token pass would: speculation stays exact.
    assert doc["summary"]["adaptive"]["equal_to_baseline"] == "3/3"
    assert "vs bf16" in result.stdout


def test_bf16_joins_the_default_contestants_only_for_a_quantized_target(tiny_profile, prompts_file, tmp_path):
    out = tmp_path / "d.json"
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "4",
                    "--target-quantization", "int8-wo", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["contestants"][-1] == "bf16"


# --- llama.cpp as a peer -----------------------------------------------------------------------

class ScriptedLlama:
    """Stands in for llama_cpp.Llama where llama-cpp-python is not installed (CI): yields a
    fixed token script and records how it was called."""

    def __init__(self, script):
        self.script, self.resets, self.calls = list(script), 0, []

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **kwargs):
        self.calls.append((list(tokens), kwargs))
        yield from self.script


def test_llamacpp_generate_is_greedy_fresh_and_stops_at_eos_or_the_limit():
    from specgen.decoding import llamacpp

    llm = ScriptedLlama([5, 6, 7, 2, 9])
    tokens, first, seconds = llamacpp.generate(llm, [1, 2, 3], 10, eos_ids=[2])
    assert tokens == [5, 6, 7, 2] and 0 <= first <= seconds
    prompt, kwargs = llm.calls[0]
    assert prompt == [1, 2, 3] and llm.resets == 1  # no prompt prefix reused from a last call
    assert kwargs["temp"] == 0.0 and kwargs["top_k"] == 1 and kwargs["repeat_penalty"] == 1.0
    assert llamacpp.generate(llm, [1], 2, eos_ids=[2])[0] == [5, 6]


def test_llamacpp_measurements_and_ratios(tiny_pair):
    target, draft = tiny_pair()
    prompts = [b.BenchPrompt("code-completion", "x"), b.BenchPrompt("prose", "y")]
    inputs = [torch.tensor([3, 4, 5]), torch.tensor([6, 7])]
    runner = b.Bench(target, draft, 4, eos_ids=[], llama=ScriptedLlama([8, 9, 10, 11, 12]))
    chosen = [b.contestants()[n] for n in ("baseline", "adaptive", "llamacpp")]
    ms = b.run_bench(runner, prompts, inputs, chosen)
    llama = [m for m in ms if m.contestant == "llamacpp"]
    assert [m.token_ids for m in llama] == [[8, 9, 10, 11]] * 2  # capped at max_new_tokens
    assert all(m.target_passes == 4 and m.decode_tokens_per_second > 0 for m in llama)
    doc = rep.report(ms, prompts, [c.name for c in chosen], {})
    rows = {(r["prompt"], r["contestant"]): r for r in doc["per_prompt"]}
    assert rows[0, "llamacpp"]["vs_llamacpp"] == pytest.approx(1.0)
    ratio = rows[0, "adaptive"]["tokens_per_second"] / rows[0, "llamacpp"]["tokens_per_second"]
    assert doc["summary"]["adaptive"]["vs_llamacpp_code"] == pytest.approx(ratio)  # code prompts only
    console = Console(file=io.StringIO(), width=200)
    console.print(rep.tables(doc)[1])
    assert "vs llama.cpp, code" in console.file.getvalue()


def test_llamacpp_joins_the_defaults_only_when_installed_for_a_gguf_target():
    everyone = b.contestants()
    assert "llamacpp" not in b.default_names(everyone, quantized=True, with_llama=False)
    assert b.default_names(everyone, quantized=False, with_llama=True)[-1] == "llamacpp"


def test_asking_for_llamacpp_without_it_or_without_a_gguf_is_one_clear_error(tiny_profile, monkeypatch):
    from specgen.decoding import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: False)
    result = invoke("-p", str(tiny_profile), "--contestants", "baseline,llamacpp")
    assert result.exit_code == 2 and "pip install llama-cpp-python" in result.stderr
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    result = invoke("-p", str(tiny_profile), "--contestants", "baseline,llamacpp")
    assert result.exit_code == 2 and "is not a GGUF model" in result.stderr
    assert "Traceback" not in result.output


def test_the_llamacpp_contestant_runs_on_the_targets_gguf(tmp_path, prompts_file, monkeypatch, tiny_gguf):
    from specgen.decoding import llamacpp

    gguf = tiny_gguf(tmp_path / "tiny.gguf")
    profile = tmp_path / "g.toml"
    profile.write_text(f'[target]\nmodel = "{gguf}"\ndtype = "float32"\ndevice = "cpu"\n'
                       f'[draft]\nmodel = "{gguf}"\ndtype = "float32"\ndevice = "cpu"\n'
                       '[generation]\nchat_template = false\n')
    loaded = []
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "load", lambda path, threads, n_ctx: (
        loaded.append((path, threads, n_ctx)), ScriptedLlama([5, 6, 7]))[1])
    out = tmp_path / "l.json"
    result = invoke("-p", str(profile), "--prompts", str(prompts_file), "-n", "3",
                    "--contestants", "baseline,adaptive,llamacpp", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert loaded and loaded[0][0] == gguf and loaded[0][2] >= 3
    doc = json.loads(out.read_text())
    assert doc["config"]["llamacpp_gguf"] == str(gguf)
    assert {m["contestant"] for m in doc["measurements"]} == {"baseline", "adaptive", "llamacpp"}
    assert doc["summary"]["adaptive"]["vs_llamacpp_code"] > 0


def test_plain_is_specgens_own_loop_with_nothing_drafted(tiny_profile, prompts_file, tmp_path):
    assert "plain" not in b.default_names(b.contestants(), quantized=True, with_llama=True)
    out = tmp_path / "plain.json"
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "8",
                    "--contestants", "baseline,plain", "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    plain = [m for m in doc["measurements"] if m["contestant"] == "plain"]
    assert len(plain) == 3
    for m in plain:
        assert m["draft_passes"] == 0 and m["target_passes"] == m["new_tokens"]
        assert m["acceptance_rate"] is None  # nothing drafted: not a rate of 0
        assert set(m["k_per_step"]) <= {0}
    assert all(r["equal_to_baseline"] for r in doc["per_prompt"])


def test_the_defaults_run_each_drafting_method_once():
    """`adaptive` drafts with the profile's method: `lookup` or `hybrid` would repeat it."""
    names = b.default_names(b.contestants("hybrid"), quantized=False, with_llama=False)
    assert "adaptive" in names and "hybrid" not in names and "lookup" in names
    names = b.default_names(b.contestants("prompt-lookup"), quantized=False, with_llama=False)
    assert "lookup" not in names and "hybrid" in names
    assert {"adaptive", "lookup", "hybrid"} <= set(b.default_names(b.contestants("draft-model"), False, False))


def test_the_api_contestant_runs_the_python_api_as_a_user_calls_it(tiny_profile, prompts_file,
                                                                   tmp_path):
    assert "api" in b.contestants() and "api" not in b.default_names(b.contestants(), True, True)
    assert set(b.contestants()) == set(CONTESTANTS)  # each name declared once, in choices.py
    out = tmp_path / "api.json"
    result = invoke("-p", str(tiny_profile), "--prompts", str(prompts_file), "-n", "8",
                    "--contestants", "baseline,hybrid,api", "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    api = [m for m in doc["measurements"] if m["contestant"] == "api"]
    assert len(api) == 3 and all(m["target_passes"] > 0 for m in api)
    assert all(r["equal_to_baseline"] for r in doc["per_prompt"])


def test_the_api_contestant_takes_the_apis_defaults_not_the_profiles(tiny_pair):
    target, draft = tiny_pair.__wrapped__()  # our own copies: the API prepares them in place
    bench = b.Bench(target, draft, 8, [0], max_ngram=2, min_ngram=2)
    gen = bench.api_generator()
    assert (gen.k_max, gen.adaptive, type(gen.drafter).__name__) == (4, True, "HybridDrafter")
    assert gen.drafter.lookup_drafter.max_ngram == 3  # the API's, not the bench's options
