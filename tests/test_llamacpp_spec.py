"""The bench's `llamacpp-spec` contestant: llama.cpp's own speculative decoding
(llama-speculative-simple, built by `make llamacpp`) run as a subprocess. A fake of the tool
(support.llamacpp_tools, through the fake_llamacpp_tools fixture) prints the real tool's output
format and records its command line: finding the tools, the command line, reading the output,
the skip when the tools are missing, and the report's figures. No real build runs here."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from specgen.bench import report as rep
from specgen.bench import runner as b
from specgen.choices import CONTESTANTS
from specgen.cli import app
from specgen.decoding import llamacpp_tools as lt
from specgen.errors import ConfigError, ModelError


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECGEN_LLAMACPP_BIN", raising=False)


class CharTokenizer:
    """One token a character (ids: the code points), as the fake tool counts."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


# --- finding the tools ----------------------------------------------------------------------------

def test_the_newest_build_in_the_cache_is_found_and_the_variable_overrides_it(
        tmp_path, llamacpp_tools_support, monkeypatch):
    assert lt.bin_dir() is None and lt.tool() is None  # nothing built
    old = llamacpp_tools_support.fake_tools_in_cache("0.3.9")
    new = llamacpp_tools_support.fake_tools_in_cache("0.3.36")  # newer by number, not by name
    (tmp_path / "cache" / "llama.cpp" / "0.4.0" / "bin").mkdir(parents=True)  # no tool in it
    assert lt.bin_dir() == new.bin and lt.tool() == new.tool
    assert lt.lib_dir() == new.bin.parent / "lib"
    monkeypatch.setenv(lt.ENV_BIN, str(old.bin))
    assert lt.tool() == old.tool
    monkeypatch.setenv(lt.ENV_BIN, str(tmp_path / "elsewhere"))
    assert lt.tool() is None and str(tmp_path / "elsewhere") in lt.missing_line()
    old.tool.chmod(0o644)
    monkeypatch.setenv(lt.ENV_BIN, str(old.bin))
    assert lt.tool() is None  # there, but not runnable
    assert "make llamacpp" in lt.missing_line()


def test_the_bindings_are_pointed_at_the_builds_library_only_where_that_fits(
        fake_llamacpp_tools, monkeypatch):
    lib = fake_llamacpp_tools.bin.parent / "lib"
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    assert lt.point_bindings("0.3.20", bundled=True) is None  # another release's own library
    assert "LLAMA_CPP_LIB_PATH" not in os.environ
    assert lt.point_bindings("0.3.36", bundled=True) == lib  # the release the build came from
    assert os.environ["LLAMA_CPP_LIB_PATH"] == str(lib)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/mine")
    assert lt.point_bindings("0.3.20", bundled=False) is None  # the user's own setting stays
    assert os.environ["LLAMA_CPP_LIB_PATH"] == "/mine"
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")
    assert lt.point_bindings("0.3.20", bundled=False) == lib  # bindings without a library
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")
    assert lt.point_bindings(None, bundled=False) is None  # no bindings installed


# --- the command line and the output --------------------------------------------------------------

def test_draft_settings_are_read_from_one_option():
    assert lt.DraftSettings.parse(None) == lt.DraftSettings()
    assert lt.DraftSettings.parse("n_max=16,p_min=0.75") == lt.DraftSettings(16, 0.75)
    assert lt.DraftSettings.parse(" p-min = 0.5 ") == lt.DraftSettings(p_min=0.5)
    assert lt.DraftSettings(16, 0.75).text() == "n_max=16,p_min=0.75"
    for bad in ("n_max", "n_max=x", "k=3", "n_max=0", "p_min=1", "n_max=4,n_max=8"):
        with pytest.raises(ConfigError, match="--llamacpp-draft"):
            lt.DraftSettings.parse(bad)


def test_the_command_line_names_the_pair_the_prompt_and_the_settings(tmp_path):
    args = lt.command(tmp_path / "tool", tmp_path / "t.gguf", tmp_path / "d.gguf",
                      "<|im_start|>user\nx\\n<|im_end|>\n", 96, 2, 700, lt.DraftSettings(16, 0.75))

    def value(flag):
        return args[args.index(flag) + 1]

    assert args[0] == str(tmp_path / "tool")
    assert value("-m") == str(tmp_path / "t.gguf") and value("-md") == str(tmp_path / "d.gguf")
    assert value("-p") == "<|im_start|>user\nx\\n<|im_end|>\n"  # as rendered, one argument
    assert "--no-escape" in args  # its backslash stays a backslash
    assert value("-n") == "95"  # the tool makes one more
    assert value("-c") == "700" and value("--temp") == "0" and value("--top-k") == "1"
    assert all(value(f) == "2" for f in ("-t", "-tb", "-td", "-tbd"))
    assert value("--spec-draft-n-max") == "16" and value("--spec-draft-p-min") == "0.75"
    assert value("--spec-type") == "draft-simple"


def test_a_real_runs_output_is_read(llamacpp_tools_support):
    got = lt.parse(llamacpp_tools_support.REAL_STDOUT, llamacpp_tools_support.REAL_STDERR,
                   llamacpp_tools_support.REAL_PROMPT)
    expected = llamacpp_tools_support.REAL_PARSED
    assert {name: getattr(got, name) for name in expected} == expected
    assert got.target_passes == 21 - 15 and got.seconds == pytest.approx(8.87 + 44.225)


def test_output_without_timings_or_without_the_prompt_is_one_clear_error():
    with pytest.raises(ModelError, match="printed no timings: oops"):
        lt.parse("\n\nabc\n\n", "oops\n", "abc")
    log = ("encoded   3 tokens in    0.100 seconds, speed:   30.0 t/s\n"
           "decoded   2 tokens in    0.100 seconds, speed:   20.0 t/s\n"
           "n_drafted = 2\nn_accept  = 1\n")
    with pytest.raises(ModelError, match="did not echo the prompt"):
        lt.parse("\n\nxyz\n\n", log, "abc")
    assert lt.parse("\n\nabcde\n\n\n\n\n", log, "abc").text == "de\n"  # its own newline stays


def test_a_generation_through_the_tool(fake_llamacpp_tools):
    runner = lt.SpecRunner(fake_llamacpp_tools.tool, "t.gguf", "d.gguf", CharTokenizer(), 3, 200,
                           lt.DraftSettings(4, 0.5))
    fake_llamacpp_tools.configure(encoded_seconds=0.5, decoded_seconds=1.5, drafted=10, accepted=6)
    tokens, run = runner.generate(ids("xyz"), 8, eos_ids=[0])
    assert tokens == ids("abcdefgh") and run.text == "abcdefgh"  # -n 7: eight tokens
    assert (run.prompt_tokens, run.new_tokens, run.seconds) == (3, 8, 2.0)
    assert (run.drafted, run.accepted, run.target_passes) == (10, 6, 2)
    assert run.peak_memory_bytes > 0  # the child's own
    call = fake_llamacpp_tools.calls()[-1]
    assert call[call.index("-p") + 1] == "xyz" and call[call.index("-t") + 1] == "3"
    fake_llamacpp_tools.configure(answer="ab")  # an end token after two
    tokens, run = runner.generate(ids("xyz"), 8, eos_ids=[0, 9])
    assert tokens == [*ids("ab"), 0] and run.new_tokens == 3
    fake_llamacpp_tools.configure(prompt_tokens=4)  # a BOS added: not the same prompt
    with pytest.raises(ModelError, match="read the prompt as 4 tokens, specgen as 3"):
        runner.generate(ids("xyz"), 8, eos_ids=[0])
    fake_llamacpp_tools.configure(fail="unknown model architecture")
    with pytest.raises(ModelError, match="failed .exit 1.: .*unknown model architecture"):
        runner.generate(ids("xyz"), 8, eos_ids=[0])


# --- in the bench ------------------------------------------------------------------------------

def test_its_measurements_time_the_tools_own_clock(fake_llamacpp_tools, tiny_pair):
    target, draft = tiny_pair()
    fake_llamacpp_tools.configure(encoded_seconds=0.25, decoded_seconds=0.75, drafted=8, accepted=4)
    spec = lt.SpecRunner(fake_llamacpp_tools.tool, "t.gguf", "d.gguf", CharTokenizer(), 1, 64,
                         lt.DraftSettings(4, 0.0))
    bench = b.Bench(target, draft, 6, eos_ids=[], llama_spec=spec)
    m = bench.run_one(b.contestants()["llamacpp-spec"], 0, "prose", 0, torch.tensor(ids("xyz")))
    assert m.token_ids == ids("abcdef") and m.new_tokens == 6
    assert m.seconds == 1.0 and m.tokens_per_second == 6.0  # the prompt's pass included
    assert m.prefill_seconds == 0.25 and m.decode_tokens_per_second == pytest.approx(5 / 0.75)
    assert m.acceptance_rate == 0.5 and m.target_passes == 2 and m.tau == 3.0
    assert m.peak_memory_bytes == bench.child_peak > 0


def measurements(names_tps: dict[str, float], categories=("code-completion", "prose")):
    ms = []
    for p, category in enumerate(categories):
        for name, tps in names_tps.items():
            tps = tps * (2 if p else 1) if name == "adaptive" else tps
            ms.append(b.Measurement(
                prompt=p, category=category, contestant=name, repeat=0, new_tokens=4,
                seconds=4 / tps, tokens_per_second=tps, decode_tokens_per_second=tps,
                target_passes=2, draft_passes=0, acceptance_rate=None, tau=2.0,
                draft_seconds=None, verify_seconds=None, rest_seconds=None,
                prefill_seconds=None, peak_memory_bytes=1, token_ids=[1, 2, 3, 4]))
    return [b.BenchPrompt(c, "x") for c in categories], ms


def test_the_report_sets_every_contestant_beside_llama_cpps_speculation():
    prompts, ms = measurements({"baseline": 5.0, "adaptive": 10.0, "llamacpp": 8.0,
                                "llamacpp-spec": 4.0})
    names = ["baseline", "adaptive", "llamacpp", "llamacpp-spec"]
    doc = rep.report(ms, prompts, names, {})
    rows = {(r["prompt"], r["contestant"]): r for r in doc["per_prompt"]}
    assert rows[0, "adaptive"]["vs_llamacpp_spec"] == pytest.approx(2.5)
    assert rows[1, "adaptive"]["vs_llamacpp_spec"] == pytest.approx(5.0)
    assert rows[0, "llamacpp"]["vs_llamacpp_spec"] == pytest.approx(2.0)
    adaptive = doc["summary"]["adaptive"]
    assert adaptive["vs_llamacpp_spec"] == pytest.approx((2.5 * 5.0) ** 0.5)
    assert adaptive["vs_llamacpp_spec_code"] == pytest.approx(2.5)  # the code prompt only
    assert adaptive["vs_llamacpp"] == pytest.approx((10 / 8 * 20 / 8) ** 0.5)
    assert doc["summary"]["llamacpp-spec"]["vs_llamacpp_spec"] == pytest.approx(1.0)
    console = Console(file=io.StringIO(), width=200)
    console.print(rep.tables(doc)[1])
    lines = console.file.getvalue().splitlines()
    spec_line = next(line for line in lines if "vs llama.cpp spec, code" in line)
    assert "2.50x" in spec_line
    alone = rep.report([m for m in ms if m.contestant != "llamacpp-spec"], prompts, names[:3], {})
    # where it did not run: no such figures, and no such rows in the table
    assert alone["summary"]["adaptive"]["vs_llamacpp_spec"] is None
    console = Console(file=io.StringIO(), width=200)
    console.print(rep.tables(alone)[1])
    assert "llama.cpp spec" not in console.file.getvalue()


def test_it_is_declared_once_and_joins_the_defaults_only_where_it_can_run():
    assert CONTESTANTS.count("llamacpp-spec") == 1 and "llamacpp-spec" in b.contestants()
    everyone = b.contestants()
    assert "llamacpp-spec" not in b.default_names(everyone, False, True)
    assert "llamacpp-spec" in b.default_names(everyone, False, True, with_llama_spec=True)
    assert not everyone["llamacpp-spec"].needs_draft_model  # the tool loads the draft itself


def gguf_profile(tiny_gguf, tmp_path, draft: str | None = None):
    target = tiny_gguf(tmp_path / "target.gguf")
    draft = draft or str(tiny_gguf(tmp_path / "draft.gguf", seed=1))
    profile = tmp_path / "g.toml"
    profile.write_text(f'[target]\nmodel = "{target}"\ndtype = "float32"\ndevice = "cpu"\n'
                       f'[draft]\nmodel = "{draft}"\ndtype = "float32"\ndevice = "cpu"\n'
                       '[generation]\nchat_template = false\n')
    return target, profile


@pytest.fixture
def letters(tmp_path):
    """Prompts of distinct letters: the tiny GGUF's tokenizer reads them one token a letter,
    as the fake tool does."""
    path = tmp_path / "letters.jsonl"
    path.write_text('{"category": "code-completion", "prompt": "abc"}\n'
                    '{"category": "prose", "prompt": "xyz"}\n')
    return path


def invoke(*args):
    return CliRunner().invoke(app, ["bench", *args])


def test_the_bench_runs_llama_cpps_speculation_on_the_gguf_pair(tmp_path, tiny_gguf, letters,
                                                                fake_llamacpp_tools):
    target, profile = gguf_profile(tiny_gguf, tmp_path)
    fake_llamacpp_tools.configure(encoded_seconds=0.1, decoded_seconds=0.4)
    out = tmp_path / "spec.json"
    result = invoke("-p", str(profile), "--prompts", str(letters), "-n", "5", "--threads", "1",
                    "--contestants", "baseline,llamacpp-spec", "--out", str(out),
                    "--llamacpp-draft", "n_max=16,p_min=0.75")
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    spec = doc["config"]["llamacpp_spec"]
    assert (spec["n_max"], spec["p_min"], spec["spec_type"]) == (16, 0.75, "draft-simple")
    assert spec["tool"] == str(fake_llamacpp_tools.tool) and spec["version"] == "version: 1 (fake)"
    assert spec["target_gguf"] == str(target) and spec["draft_gguf"] == str(tmp_path / "draft.gguf")
    runs = [m for m in doc["measurements"] if m["contestant"] == "llamacpp-spec"]
    assert len(runs) == 2 and all(m["tokens_per_second"] == pytest.approx(5 / 0.5) for m in runs)
    assert all(m["token_ids"] == [3, 4, 5, 6, 7] for m in runs)  # "abcde" read again
    assert doc["summary"]["baseline"]["vs_llamacpp_spec"] > 0
    calls = [c for c in fake_llamacpp_tools.calls() if c != ["--version"]]
    assert len(calls) == 3  # the warm-up, then one a prompt
    for call in calls:
        assert call[call.index("-m") + 1] == str(target)
        assert call[call.index("-md") + 1] == str(tmp_path / "draft.gguf")
        assert call[call.index("-t") + 1] == "1" and call[call.index("-n") + 1] in ("4", "7")
        assert call[call.index("--spec-draft-n-max") + 1] == "16"
    assert [c[c.index("-p") + 1] for c in calls[1:]] == ["abc", "xyz"]


def test_without_the_tools_it_is_skipped_with_one_line(tmp_path, tiny_gguf, letters):
    _, profile = gguf_profile(tiny_gguf, tmp_path)
    out = tmp_path / "skip.json"
    result = invoke("-p", str(profile), "--prompts", str(letters), "-n", "3",
                    "--contestants", "baseline,llamacpp-spec", "--out", str(out))
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "llamacpp-spec" in line]
    assert len(said) == 1 and "make llamacpp" in said[0] and "Traceback" not in result.output
    assert json.loads(out.read_text())["contestants"] == ["baseline"]
    result = invoke("-p", str(profile), "--prompts", str(letters), "-c", "llamacpp-spec")
    assert result.exit_code == 2 and "make llamacpp" in result.stderr
    assert "Traceback" not in result.output


def test_it_runs_by_default_only_with_the_tools_and_a_gguf_pair(tmp_path, tiny_gguf, tiny_profile,
                                                               fake_llamacpp_tools, monkeypatch):
    from specgen.commands.bench import BenchRequest, pick
    from specgen.profiles import load_profile

    def default(profile) -> list[str]:
        return [c.name for c in pick(BenchRequest(profile=str(profile)), load_profile(str(profile)))[2]]

    _, profile = gguf_profile(tiny_gguf, tmp_path)
    assert "llamacpp-spec" in default(profile)
    assert "llamacpp-spec" not in default(tiny_profile)  # transformers models, not GGUF files
    monkeypatch.setenv(lt.ENV_BIN, str(tmp_path / "nothing"))
    assert "llamacpp-spec" not in default(profile)


def test_a_bad_llamacpp_draft_option_is_one_clear_error(tmp_path, tiny_gguf):
    _, profile = gguf_profile(tiny_gguf, tmp_path)
    result = invoke("-p", str(profile), "--llamacpp-draft", "n_max=many")
    assert result.exit_code == 2 and "give n_max=N,p_min=P" in result.stderr
