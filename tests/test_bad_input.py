"""Bad input a new user or a careful reviewer gives (issue 33): every case one clear line
(exit 2, or 0 with a one-line warning where the work goes on), no traceback, nothing lost,
nothing of anyone else's touched. Nothing here loads a real model."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.app import store
from specgen.app.store import RunRecord, load_runs, record_run
from specgen.cli import app
from specgen.errors import ConfigError, SpecgenError
from specgen.profiles import load_profile, with_overrides

TARGET = '[target]\nmodel = "org/big"\n'


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(tmp_path / "user-profiles"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_models(monkeypatch):
    """Fail the test if a command gets as far as loading models."""
    def load_session(prof, **options):
        raise AssertionError("the models were about to load")

    for module in ("run", "chat"):
        monkeypatch.setattr(f"specgen.cli.{module}.load_session", load_session)
    monkeypatch.setattr("specgen.cli.bench.load_session", load_session)


def cli(*args: str, input: str | bytes | None = None):
    return CliRunner().invoke(app, list(args), input=input)


def one_error_line(result, *needles: str, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def record(**fields) -> RunRecord:
    base = dict(command="run", profile="p", target="t", draft="d", method="draft-model",
                device="cpu", dtype="bfloat16", quantization="none", adaptive=True, k_max=4,
                temperature=0.0, top_p=1.0, top_k=0, ended="completed",
                stats={"new_tokens": 5, "target_passes": 3, "k_per_step": [4, 4]})
    return RunRecord(**{**base, **fields})


# --- 2. a profile without [target] -------------------------------------------------------------

def test_a_profile_without_a_target_is_one_line_everywhere(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[draft]\nmodel = "x/y"\n')
    for args in (["profiles", "validate", str(bad)], ["profiles", "show", str(bad)],
                 ["run", "-p", str(bad), "hi"]):
        one_error_line(cli(*args), "needs a [target] table")


def test_one_bad_user_profile_does_not_break_the_listing(tmp_path):
    folder = tmp_path / "user-profiles"
    folder.mkdir()
    (folder / "broken.toml").write_text('[draft]\nmodel = "x/y"\n')
    (folder / "latin1.toml").write_bytes(b'description = "caf\xe9"\n' + TARGET.encode())
    result = CliRunner().invoke(app, ["profiles", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "broken" in result.stdout and "latin1" in result.stdout and "invalid" in result.stdout


# --- 3. input that is not UTF-8 ----------------------------------------------------------------

def test_a_profile_that_is_not_utf8(tmp_path):
    bad = tmp_path / "u.toml"
    bad.write_bytes(b'description = "\xff"\n' + TARGET.encode())
    for args in (["profiles", "validate", str(bad)], ["profiles", "show", str(bad)],
                 ["run", "-p", str(bad), "hi"]):
        one_error_line(cli(*args), "not UTF-8", "0xff")


def test_prompts_that_are_not_utf8_are_refused_before_loading(tmp_path, tiny_profile, no_models):
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"hi \xff there")
    one_error_line(cli("run", "-p", str(tiny_profile), "--file", str(bad)), "not UTF-8")
    one_error_line(cli("run", "-p", str(tiny_profile), "-", input=b"hi \xff"), "stdin", "not UTF-8")
    # argv carries undecodable bytes as surrogates
    one_error_line(cli("run", "-p", str(tiny_profile), "hi \udcff"), "not UTF-8", "0xff")
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"category": "x", "prompt": "\xff"}\n')
    one_error_line(cli("bench", "-p", str(tiny_profile), "--prompts", str(prompts)), "not UTF-8")


# --- 4. Rich markup must not eat table names ---------------------------------------------------

def test_error_lines_keep_their_brackets(tmp_path):
    bad = tmp_path / "k.toml"
    bad.write_text('[target]\nmodle = "x/y"\n')
    one_error_line(cli("profiles", "validate", str(bad)), "unknown key 'modle' in [target]")
    bad.write_text(TARGET + '[speculation]\nmethod = "draft-model"\n')
    one_error_line(cli("profiles", "validate", str(bad)), "needs a [draft] model", "Add a [draft]")


# --- 5. another application's database ---------------------------------------------------------

def foreign_db(path: Path) -> bytes:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    conn.close()
    return path.read_bytes()


def test_another_applications_database_is_refused_and_untouched(tmp_path):
    db = tmp_path / "app.db"
    before = foreign_db(db)
    one_error_line(cli("stats", "--stats-db", str(db)), "not a specgen run history", "notes")
    one_error_line(cli("stats", "--stats-db", str(db), "clear", "--yes"), "not a specgen")
    warning = record_run(record(), db)
    assert warning.startswith("run not recorded:") and "not a specgen run history" in warning
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("app.db")) == ["app.db"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_an_empty_database_file_is_an_empty_history_and_stays_unwritten(tmp_path):
    db = tmp_path / "empty.db"
    db.touch()
    result = cli("stats", "--stats-db", str(db))
    assert result.exit_code == 0 and "No runs recorded yet" in result.stdout
    assert db.stat().st_size == 0  # reading wrote nothing
    assert record_run(record(), db) is None and len(load_runs(db)) == 1


# --- 6. export to a path that cannot be written ------------------------------------------------

@pytest.mark.parametrize("where", ["/nonexistent/x.csv", "."])
def test_export_to_an_unwritable_path(tmp_path, where):
    db = tmp_path / "h.db"
    assert record_run(record(), db) is None
    one_error_line(cli("stats", "--stats-db", str(db), "export", "--csv", where), "Cannot write")


# --- 7. NaN and infinity -----------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("generation.temperature", "nan"), ("generation.temperature", "inf"),
    ("generation.top_p", "nan"), ("generation.top_p", "-inf"),
    ("speculation.draft_confidence", "nan"),
])
def test_profiles_refuse_non_finite_numbers(tmp_path, key, value):
    section, name = key.split(".")
    bad = tmp_path / "n.toml"
    bad.write_text(f"{TARGET}[{section}]\n{name} = {value}\n")
    one_error_line(cli("profiles", "validate", str(bad)), f"{key} must be a finite number")


@pytest.mark.parametrize("option", ["--temperature", "--top-p"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_options_refuse_non_finite_numbers_before_loading(tiny_profile, no_models, option, value):
    one_error_line(cli("run", "-p", str(tiny_profile), option, value, "hi"), "finite number")
    one_error_line(cli("chat", "-p", str(tiny_profile), option, value), "finite number")


def test_bench_refuses_non_finite_numbers_before_loading(tiny_profile, no_models):
    one_error_line(cli("bench", "-p", str(tiny_profile), "--draft-confidence", "nan"),
                   "--draft-confidence must be a finite number")


def test_chat_refuses_non_finite_temperatures_and_keeps_its_setting(tiny_profile):
    from specgen.commands.chat import Chat
    from specgen.app.session import open_session

    chat = Chat(open_session(load_profile(str(tiny_profile))))
    for value in ("nan", "inf", "-inf", "1e-30"):
        reply = chat.command("temperature", value)
        assert reply.error and len(reply.lines) == 1, value
        assert chat.session.profile.generation.temperature == 0.0
    assert "/temperature" in chat.command("temperature", "nan").lines[0]
    assert not chat.command("temperature", "0.7").error


def test_the_shared_helpers_for_other_front_ends():
    from specgen.profiles import finite

    assert finite(0.5, "x") == 0.5 and finite(2, "x") == 2.0
    for bad in (float("nan"), float("inf"), True, "0.5", None, 10**400):
        with pytest.raises(ConfigError):
            finite(bad, "temperature")
    base = load_profile("qwen-coder-demo")
    with pytest.raises(ConfigError, match="request: generation.temperature must be a finite"):
        with_overrides(base, where="request", temperature=float("nan"))
    assert with_overrides(base, where="request", temperature=0.5).generation.temperature == 0.5


def test_stats_json_stays_valid_json_over_old_non_finite_records(tmp_path):
    db = tmp_path / "h.db"
    assert record_run(record(temperature=float("inf")), db) is None  # as older versions stored
    result = cli("stats", "--stats-db", str(db), "--format", "json", "--runs")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert doc["runs"][0]["temperature"] is None


# --- 8. seeds out of range ---------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["18446744073709551615", "-1"])
def test_seeds_out_of_range_are_refused_before_loading(tiny_profile, no_models, seed):
    from specgen.profiles import check_seed

    one_error_line(cli("run", "-p", str(tiny_profile), "--seed", seed, "hi"), "--seed must be")
    one_error_line(cli("chat", "-p", str(tiny_profile), "--seed", seed), "--seed must be")
    with pytest.raises(ConfigError):
        check_seed(int(seed))
    assert check_seed(2**63 - 1) == 2**63 - 1 and check_seed(None) is None


def test_the_engine_refuses_seeds_torch_cannot_take(tiny_pair):
    import torch

    from specgen import SpeculativeGenerator

    target, draft = tiny_pair()
    gen = SpeculativeGenerator(target, draft, 2)
    with pytest.raises(ConfigError, match="seed must be"):
        gen.generate(torch.tensor([1, 2, 3]), max_new_tokens=2, seed=2**64)
    assert len(gen.generate(torch.tensor([1, 2, 3]), max_new_tokens=2, seed=2**64 - 2).token_ids) == 2


# --- 9. a healthy history in a read-only place, or a directory --------------------------------

def test_a_read_only_history_is_read_as_it_is_and_left_alone(tmp_path, monkeypatch):
    db = tmp_path / "ro" / "h.db"
    assert record_run(record(), db) is None
    # Tests may run as root, whom permissions do not stop: say the place is read-only.
    real_access = os.access
    monkeypatch.setattr(store.os, "access",
                        lambda p, mode: False if mode & os.W_OK else real_access(p, mode))
    result = cli("stats", "--stats-db", str(db))
    assert result.exit_code == 0, result.output
    assert "1 runs" in result.stdout and "move it away" not in result.output
    assert sorted(p.name for p in db.parent.iterdir()) == ["h.db"]  # no -wal, no -shm
    warning = record_run(record(), db)
    assert "read-only" in warning and "chmod" in warning
    assert sorted(p.name for p in db.parent.iterdir()) == ["h.db"]


def test_a_directory_as_the_history(tmp_path):
    one_error_line(cli("stats", "--stats-db", str(tmp_path)), "is a directory")
    assert "is a directory" in record_run(record(), tmp_path)


# --- 10. bench --out that cannot be written ----------------------------------------------------

@pytest.mark.parametrize("out", ["/proc/x.json", "/nonexistent/dir/x.json", "."])
def test_bench_checks_its_out_file_before_loading(tiny_profile, no_models, out):
    one_error_line(cli("bench", "-p", str(tiny_profile), "--out", out), "--out")
    assert not Path("x.json").exists()


def test_the_out_check_leaves_no_file_behind(tmp_path):
    from specgen.commands.bench import check_writable

    fresh, kept = tmp_path / "fresh.json", tmp_path / "kept.json"
    kept.write_text("old")
    check_writable(fresh, "--out")
    check_writable(kept, "--out")
    assert not fresh.exists() and kept.read_text() == "old"


# --- 12. privacy and trust ---------------------------------------------------------------------

def test_a_new_history_is_private(tmp_path):
    db = tmp_path / "new" / "deeper" / "h.db"
    assert record_run(record(prompt="a secret prompt"), db) is None
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.parent.parent.stat().st_mode) == 0o700


@pytest.fixture
def remote_code_model(tmp_path) -> Path:
    """A model folder whose config names its own Python code (an unknown model type)."""
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "specgen-test-custom", "architectures": ["X"],
        "auto_map": {"AutoConfig": "custom.XConfig", "AutoModelForCausalLM": "custom.X"}}))
    (folder / "custom.py").write_text("raise SystemExit('this code must not run')\n")
    return folder


def test_a_model_with_its_own_code_is_refused_naming_the_key(remote_code_model):
    from specgen.loading.sources import ModelFiles, load_config

    with pytest.raises(SpecgenError, match="set trust_remote_code = true in the profile's"):
        load_config(ModelFiles("custom", remote_code_model))


def test_trust_remote_code_is_one_warning_line(tmp_path, monkeypatch):
    bad = tmp_path / "t.toml"
    bad.write_text(f'[target]\nmodel = "{tmp_path}/nothing"\ntrust_remote_code = true\n'
                   '[speculation]\nmethod = "prompt-lookup"\n')
    result = cli("run", "-p", str(bad), "hi")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("warning: target") and "trust_remote_code = true runs" in lines[0]
    assert lines[1].startswith("error:") and "UserWarning" not in result.stderr


# --- 13. small ones ----------------------------------------------------------------------------

def test_a_directory_given_as_a_profile(tmp_path):
    (tmp_path / "d.toml").mkdir()
    for name in ("d.toml", "./d.toml"):
        one_error_line(cli("profiles", "validate", name), "is a directory")
    one_error_line(cli("run", "-p", "./d.toml", "hi"), "is a directory")


def test_a_profile_that_extends_itself(tmp_path):
    (tmp_path / "self.toml").write_text('extends = "self"\n' + TARGET)
    one_error_line(cli("profiles", "validate", "self.toml"), "self.toml", "cycle")


def test_a_missing_base_names_the_file_that_extends_it(tmp_path):
    (tmp_path / "child.toml").write_text('extends = "nothere"\n' + TARGET)
    line = one_error_line(cli("profiles", "validate", "child.toml"), "child.toml",
                          "extends = 'nothere'", "no profile named 'nothere'")
    assert line.index("child.toml") < line.index("nothere")


def test_a_read_only_history_file_gets_no_companions(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    assert record_run(record(), db) is None
    real_access = os.access
    monkeypatch.setattr(store.os, "access",
                        lambda p, mode: False if Path(p) == db and mode & os.W_OK
                        else real_access(p, mode))
    assert "read-only" in record_run(record(), db)
    assert len(load_runs(db)) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("h.db")) == ["h.db"]


def test_the_gguf_conversion_draws_no_bar_of_its_own():
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from specgen.loading.convert import _quiet_gguf_progress

    original = gguf_utils.tqdm
    try:  # from the class itself, whether or not a command in this process silenced it already
        gguf_utils.tqdm = base = original.func if isinstance(original, functools.partial) else original
        _quiet_gguf_progress()
        _quiet_gguf_progress()  # once is enough; twice changes nothing more
        bar = gguf_utils.tqdm
        assert isinstance(bar, functools.partial) and bar.keywords == {"disable": True}
        assert bar.func is base
    finally:
        gguf_utils.tqdm = original
