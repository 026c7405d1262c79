"""The run history: what the engine reported is what is stored, several writers lose
nothing, and a database that cannot be used never costs the user their output."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from specgen.app import store
from specgen.core.engine import SpeculativeGenerator
from specgen.errors import SpecgenError
from specgen.app.store import RunRecord, load_runs, record_run
from specgen.paths import history_db


def make_record(profile: str = "p", stats: dict | None = None, **fields) -> RunRecord:
    base = dict(
        command="run", profile=profile, target="org/target", draft="org/draft", method="draft",
        device="cpu", dtype="float32", quantization="none", adaptive=True, k_max=4,
        temperature=0.0, top_p=1.0, top_k=0, ended="completed",
        stats=stats if stats is not None else {"new_tokens": 10, "k_per_step": [4, 4]},
    )
    return RunRecord(**{**base, **fields})


@pytest.fixture(scope="module")
def pair(tiny_model, sharpen):
    """A target and a draft close enough to it that some drafts are accepted, some not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: extra threads only contend on a shared machine
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=0)
    sharpen(target, 20.0)
    sharpen(draft, 20.0)
    head = draft.get_output_embeddings().weight
    with torch.no_grad():
        head.add_(0.2 * torch.randn(head.shape, generator=torch.Generator().manual_seed(1)))
    yield target, draft
    torch.set_num_threads(threads)


@pytest.mark.parametrize("temperature, adaptive", [(0.0, False), (0.8, True)])
def test_recorded_figures_equal_engine_stats(pair, tmp_path, temperature, adaptive):
    target, draft = pair
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=4, adaptive=adaptive)
    # A run that exercised both branches of verification (adaptive K follows timings, so a
    # given seed may draft little).
    runs = (gen.generate([1, 2, 3, 4, 5], max_new_tokens=32, temperature=temperature, seed=seed).stats
            for seed in range(3, 23))
    s = next((s for s in runs if 0 < s.accepted < s.proposed), None)
    assert s is not None, "no run both accepted and rejected drafts"
    db = tmp_path / "h.sqlite3"
    record = make_record(stats=s.to_dict(), adaptive=adaptive, temperature=temperature,
                         top_p=0.9, top_k=20, prompt="hello")

    assert record_run(record, db) is None
    [row] = load_runs(db)

    for key in ("prompt_tokens", "prefill_tokens", "new_tokens", "target_passes",
                "draft_passes", "proposed", "accepted", "per_position_proposed",
                "per_position_accepted", "accepted_length_hist", "prefill_seconds",
                "draft_seconds", "verify_seconds", "tokens_per_second", "stop_reason"):
        assert row[key] == getattr(s, key), key
    assert row["wall_seconds"] == s.total_seconds
    assert row["k_hist"] == [Counter(s.k_per_step)[k] for k in range(s.k_max + 1)]
    assert sum(row["k_hist"]) == s.target_passes - 1  # the prompt's pass is no step
    assert row["accepted"] / row["proposed"] == s.acceptance_rate
    assert row["new_tokens"] / row["target_passes"] == s.tau
    for key in ("command", "profile", "target", "draft", "method", "device", "dtype",
                "quantization", "adaptive", "k_max", "temperature", "top_p", "top_k", "ended",
                "prompt", "created_at"):
        assert row[key] == getattr(record, key), key


def test_prompt_is_not_stored_unless_given(tmp_path):
    db = tmp_path / "h.sqlite3"
    assert record_run(make_record(), db) is None
    assert load_runs(db)[0]["prompt"] is None


def _write_rows(args: tuple[str, int, int]) -> list[str]:
    path, worker, n = args
    warnings = []
    for i in range(n):
        warning = record_run(make_record(profile=f"w{worker}", stats={"new_tokens": i}), Path(path))
        if warning:
            warnings.append(warning)
    return warnings


def test_concurrent_writers_lose_no_rows(tmp_path):
    db = tmp_path / "h.sqlite3"  # fresh: the writers also race to create and migrate it
    workers, per_worker = 4, 100
    # fork: the children need no second torch import; they only touch sqlite3.
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        warnings = pool.map(_write_rows, [(str(db), w, per_worker) for w in range(workers)])
    assert warnings == [[]] * workers
    rows = load_runs(db)
    assert len(rows) == workers * per_worker
    written = {(r["profile"], r["new_tokens"]) for r in rows}
    assert written == {(f"w{w}", i) for w in range(workers) for i in range(per_worker)}


class _CreatedBetweenReads:
    """A connection to a fresh history across whose first read another process creates it."""

    def __init__(self, path: Path) -> None:
        self.path, self.conn, self.raced = path, sqlite3.connect(path, isolation_level=None), False

    def execute(self, sql: str):
        rows = self.conn.execute(sql).fetchall()
        if not self.raced:
            self.raced = True
            store.connect(self.path).close()  # the other process: creates and migrates it
        return _Rows(rows)


class _Rows(list):
    def fetchone(self):
        return self[0] if self else None


def test_a_history_created_between_two_reads_is_not_taken_for_a_foreign_file(tmp_path):
    """Writers opening a fresh history together: one may create it while another checks
    whose file it is; the check must read it as empty or as specgen's, never refuse it."""
    db = tmp_path / "h.sqlite3"
    db.touch()
    racing = _CreatedBetweenReads(db)
    try:
        assert store._check_ours(racing, db) is True  # specgen's, created meanwhile
    finally:
        racing.conn.close()
    assert racing.raced


def test_corrupt_database_warns_and_does_not_raise(tmp_path):
    db = tmp_path / "h.sqlite3"
    garbage = b"this is not a database\x00" * 512
    db.write_bytes(garbage)
    warning = record_run(make_record(), db)
    assert warning.startswith("run not recorded:") and str(db) in warning
    assert "\n" not in warning
    assert db.read_bytes() == garbage
    with pytest.raises(SpecgenError, match="move it away"):
        load_runs(db)


def test_locked_database_warns(tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite3"
    assert record_run(make_record(), db) is None
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 50)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        warning = record_run(make_record(), db)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert warning.startswith("run not recorded: database is locked")
    assert len(load_runs(db)) == 1


def test_read_only_database_warns(tmp_path, monkeypatch):
    # Tests may run as root, for whom chmod does not stop writes: open read-only by URI.
    db = tmp_path / "h.sqlite3"
    assert record_run(make_record(), db) is None
    real_connect = sqlite3.connect

    def read_only(path, **kwargs):
        return real_connect(f"file:{path}?mode=ro", uri=True, **kwargs)

    monkeypatch.setattr(store.sqlite3, "connect", read_only)
    warning = record_run(make_record(), db)
    assert warning.startswith("run not recorded:") and "readonly" in warning
    monkeypatch.undo()
    assert len(load_runs(db)) == 1


def test_unwritable_location_warns(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    warning = record_run(make_record(), blocker / "h.sqlite3")
    assert warning.startswith("run not recorded:")


def test_newer_schema_is_refused_clearly(tmp_path):
    db = tmp_path / "h.sqlite3"
    assert record_run(make_record(), db) is None
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 1}")
    with pytest.raises(SpecgenError, match="newer specgen") as e:
        load_runs(db)
    assert "Upgrade specgen" in str(e.value)
    warning = record_run(make_record(), db)
    assert warning.startswith("run not recorded:") and "newer specgen" in warning
    with sqlite3.connect(db) as conn:  # untouched
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION + 1


def test_older_schema_is_migrated_forward(tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite3"
    assert record_run(make_record(profile="old"), db) is None
    migrations = [*store.MIGRATIONS, ("ALTER TABLE runs ADD COLUMN note TEXT",)]
    monkeypatch.setattr(store, "MIGRATIONS", migrations)
    monkeypatch.setattr(store, "SCHEMA_VERSION", len(migrations))

    assert record_run(make_record(profile="new"), db) is None
    rows = load_runs(db)
    assert [r["profile"] for r in rows] == ["old", "new"]
    assert rows[0]["note"] is None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(migrations)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_load_runs_filters(tmp_path):
    db = tmp_path / "h.sqlite3"
    now = time.time()
    for i, profile in enumerate(["a", "b", "a", "b", "a"]):
        rec = make_record(profile, {"new_tokens": i}, created_at=now - (4 - i) * 86400)
        assert record_run(rec, db) is None
    assert [r["new_tokens"] for r in load_runs(db)] == [0, 1, 2, 3, 4]  # oldest first
    assert [r["new_tokens"] for r in load_runs(db, profile="a")] == [0, 2, 4]
    assert [r["new_tokens"] for r in load_runs(db, since=now - 2.5 * 86400)] == [2, 3, 4]
    assert [r["new_tokens"] for r in load_runs(db, last=2)] == [3, 4]
    assert [r["new_tokens"] for r in load_runs(db, profile="b", last=1)] == [3]
    assert load_runs(db, profile="missing") == []


def test_missing_database_is_an_empty_history_and_is_not_created(tmp_path):
    db = tmp_path / "nothing" / "h.sqlite3"
    assert load_runs(db) == []
    assert not db.parent.exists()


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "x.sqlite3"))
    assert history_db() == tmp_path / "x.sqlite3"
    monkeypatch.delenv("SPECGEN_STATS_DB")
    path = history_db()
    assert path.name == "history.sqlite3" and "specgen" in path.parent.parts[-1]


def test_recorder_keeps_one_connection_and_never_raises(tmp_path):
    from specgen.app.store import Recorder

    recorder = Recorder(tmp_path / "h.sqlite3")
    assert recorder.record(make_record("a")) is None
    assert recorder.record(make_record("b")) is None
    recorder.close()
    assert [r["profile"] for r in store.load_runs(tmp_path / "h.sqlite3")] == ["a", "b"]
    (tmp_path / "dir").mkdir()
    broken = Recorder(tmp_path / "dir")  # a directory, not a database file
    warning = broken.record(make_record("c"))
    assert warning and warning.startswith("run not recorded")
