"""The run history: one SQLite row per run, chat turn or served request (earlier versions
also recorded bench measurements, command "bench"; `specgen stats` leaves those out unless
asked).

stdlib sqlite3 in WAL mode with a busy timeout, so several specgen processes can write at
once. The schema version lives in `PRAGMA user_version`; opening a database for writing
migrates it forward inside one write transaction. Reading (`load_runs`) writes nothing: no
migration, no journal switch. specgen opens only its own databases: an empty file, or one with its
`runs` table; any other SQLite file is refused before anything touches it. A new history is
private to its user (0600, in folders made 0700), as prompts may be stored in it. Recording
must never cost the user their output: `record_run` returns a warning line instead of raising.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from specgen.errors import SpecgenError
from specgen.paths import history_db

BUSY_TIMEOUT_MS = 5000

# MIGRATIONS[i] takes a database from schema version i to i + 1. Append only; never edit.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        created_at REAL NOT NULL,
        command TEXT NOT NULL,
        profile TEXT NOT NULL,
        target TEXT NOT NULL,
        draft TEXT,
        method TEXT NOT NULL,
        device TEXT NOT NULL,
        dtype TEXT NOT NULL,
        quantization TEXT NOT NULL,
        adaptive INTEGER NOT NULL,
        k_max INTEGER NOT NULL,
        temperature REAL NOT NULL,
        top_p REAL NOT NULL,
        top_k INTEGER NOT NULL,
        ended TEXT NOT NULL,
        stop_reason TEXT,
        prompt_tokens INTEGER NOT NULL,
        prefill_tokens INTEGER NOT NULL,
        new_tokens INTEGER NOT NULL,
        target_passes INTEGER NOT NULL,
        draft_passes INTEGER NOT NULL,
        proposed INTEGER NOT NULL,
        accepted INTEGER NOT NULL,
        per_position_proposed TEXT NOT NULL,  -- JSON list, index i = draft position i + 1
        per_position_accepted TEXT NOT NULL,  -- JSON list
        accepted_length_hist TEXT NOT NULL,   -- JSON list, index n = steps that kept n drafts
        k_hist TEXT NOT NULL,                 -- JSON list, index k = steps that drafted k
        prefill_seconds REAL NOT NULL,
        draft_seconds REAL NOT NULL,
        verify_seconds REAL NOT NULL,
        wall_seconds REAL NOT NULL,
        tokens_per_second REAL NOT NULL,
        prompt TEXT
    )""",
        "CREATE INDEX runs_created_at ON runs (created_at)",
        "CREATE INDEX runs_profile ON runs (profile, created_at)",
    ),
    # A run whose CUDA decoder gave up on graphs: its one line (NULL: graphs on, or none).
    ("ALTER TABLE runs ADD COLUMN graphs_off TEXT",),
]
SCHEMA_VERSION = len(MIGRATIONS)
# Columns every version of the `runs` table has: how a database is known to be specgen's.
RUNS_COLUMNS = frozenset(("id", "created_at", "command", "profile", "target", "method",
                          "new_tokens", "target_passes", "proposed", "accepted"))

JSON_COLUMNS = ("per_position_proposed", "per_position_accepted", "accepted_length_hist", "k_hist")


@dataclass
class RunRecord:
    """One run as the CLI saw it; `stats` is specgen.engine.Stats.to_dict()."""

    command: str  # "run" | "chat" | "bench" | "serve"
    profile: str
    target: str
    draft: str | None
    method: str
    device: str
    dtype: str
    quantization: str
    adaptive: bool
    k_max: int
    temperature: float
    top_p: float
    top_k: int
    ended: str  # "completed" | "interrupted" | "error"
    stats: dict
    prompt: str | None = None  # only stored when the user passed --record-prompt
    created_at: float = field(default_factory=time.time)


def connect(db_path: Path | None = None) -> sqlite3.Connection:
    """Open the history for writing (creating it, private, if needed) and migrate it to
    SCHEMA_VERSION. Raises SpecgenError for a path that is no history of this specgen's (a
    directory, a read-only file, another application's database, a newer schema);
    sqlite3.Error and OSError for files that cannot be opened, written or read."""
    path = Path(db_path) if db_path is not None else history_db()
    _refuse_directory(path)
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecgenError(f"The run history {path} is read-only: make it writable "
                           "(chmod u+w), or point --stats-db / SPECGEN_STATS_DB at another file.")
    _create_private(path)
    # isolation_level=None: we issue BEGIN/COMMIT ourselves (a lone INSERT is atomic).
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_ours(conn, path)  # before any write: never touch another application's file
        _check_version(conn, path)  # ... nor a newer specgen's
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL stays consistent; saves an fsync
        _use_wal(conn)
        _migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(path: Path) -> sqlite3.Connection | None:
    """Open an existing history to read it, writing nothing (no migration, no journal
    switch); None for an empty one (a fresh file, or one no run has reached yet). A history
    this process may write is opened as any reader does (SQLite then tidies its -wal and
    -shm files on close); one it may not (a read-only file or folder), which nobody here can
    be writing, is read as it is on disk (`immutable`), leaving no files beside it. Raises
    as `connect` does."""
    _refuse_directory(path)
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK):
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    else:
        uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not _check_ours(conn, path):
            conn.close()
            return None
        _check_version(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _refuse_directory(path: Path) -> None:
    if path.is_dir():
        raise SpecgenError(f"The run history {path} is a directory: point --stats-db / "
                           "SPECGEN_STATS_DB at a file (it is created on the first run).")


def _create_private(path: Path) -> None:
    """Make the missing folders (0700) and the file (0600) of a new history; SQLite gives
    its -wal and -shm files the database file's permissions."""
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            pass
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def _check_ours(conn: sqlite3.Connection, path: Path) -> bool:
    """Whether the database holds specgen's runs (False: empty, specgen may create them);
    SpecgenError for any other database, which is left untouched."""
    # The version first, then the tables: each read is its own snapshot, and another process
    # may create the history between them; in this order that reads as empty or as whole,
    # never as tables missing under a set version (another application's file).
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    if not tables and version == 0:
        return False
    if "runs" in tables:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        if RUNS_COLUMNS <= columns:
            return True
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    raise SpecgenError(
        f"{path} is not a specgen run history (it holds the tables {shown or 'none'}), so "
        f"specgen leaves it untouched: point --stats-db / SPECGEN_STATS_DB at another file.")


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (persistent: once per file). SQLite refuses that switch at once,
    without its busy timeout, while another process has the file open, as happens when several
    processes open a fresh file together: retry until one of them has switched it."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _check_version(conn: sqlite3.Connection, path: Path) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SpecgenError(
            f"The run history {path} was written by a newer specgen (schema version "
            f"{version}; this one reads up to {SCHEMA_VERSION}). Upgrade specgen, or point "
            f"--stats-db / SPECGEN_STATS_DB at another file."
        )
    return version


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    if _check_version(conn, path) == SCHEMA_VERSION:
        return
    # BEGIN IMMEDIATE takes the write lock, so of several processes opening a fresh file
    # exactly one migrates; the others wait, then find the work done.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for version in range(_check_version(conn, path), SCHEMA_VERSION):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _row(record: RunRecord) -> dict:
    s = record.stats
    k_hist = Counter(s.get("k_per_step", []))
    n_k = max([record.k_max, *k_hist]) + 1
    return {
        "created_at": record.created_at,
        "command": record.command,
        "profile": record.profile,
        "target": record.target,
        "draft": record.draft,
        "method": record.method,
        "device": record.device,
        "dtype": record.dtype,
        "quantization": record.quantization,
        "adaptive": int(record.adaptive),
        "k_max": record.k_max,
        "temperature": record.temperature,
        "top_p": record.top_p,
        "top_k": record.top_k,
        "ended": record.ended,
        "stop_reason": s.get("stop_reason"),
        "prompt_tokens": s.get("prompt_tokens", 0),
        "prefill_tokens": s.get("prefill_tokens", 0),
        "new_tokens": s.get("new_tokens", 0),
        "target_passes": s.get("target_passes", 0),
        "draft_passes": s.get("draft_passes", 0),
        "proposed": s.get("proposed", 0),
        "accepted": s.get("accepted", 0),
        "per_position_proposed": json.dumps(s.get("per_position_proposed", [])),
        "per_position_accepted": json.dumps(s.get("per_position_accepted", [])),
        "accepted_length_hist": json.dumps(s.get("accepted_length_hist", [])),
        "k_hist": json.dumps([k_hist[k] for k in range(n_k)]),
        "prefill_seconds": s.get("prefill_seconds", 0.0),
        "draft_seconds": s.get("draft_seconds", 0.0),
        "verify_seconds": s.get("verify_seconds", 0.0),
        "wall_seconds": s.get("total_seconds", 0.0),
        "tokens_per_second": s.get("tokens_per_second", 0.0),
        "prompt": record.prompt,
        "graphs_off": s.get("graphs_off"),
    }


def insert_run(conn: sqlite3.Connection, record: RunRecord) -> int:
    """Insert one run; returns its id. Raises on any database error."""
    row = _row(record)
    names = ", ".join(row)
    marks = ", ".join(f":{name}" for name in row)
    return conn.execute(f"INSERT INTO runs ({names}) VALUES ({marks})", row).lastrowid


def record_run(record: RunRecord, db_path: Path | None = None) -> str | None:
    """Append one run to the history. Never raises: returns None when recorded, else a
    one-line warning for the caller to print (the user's output matters more)."""
    path = Path(db_path) if db_path is not None else history_db()
    try:
        conn = connect(path)
        try:
            insert_run(conn, record)
        finally:
            conn.close()
    except SpecgenError as e:
        return f"run not recorded: {e}"
    except Exception as e:  # locked, read-only, corrupt, unwritable directory, bad stats...
        reason = str(e) or type(e).__name__
        return f"run not recorded: {reason} ({path})"
    return None


class Recorder:
    """Appends runs over one open connection, for a process that records many (the server):
    `record_run`'s contract (never raises, returns a warning line instead) without opening
    the database for every run. A failed write closes the connection; the next reopens it.
    Use it from one thread (sqlite3 connections belong to the thread that opened them)."""

    def __init__(self, db_path: Path | None = None) -> None:
        self.path = Path(db_path) if db_path is not None else history_db()
        self._conn: sqlite3.Connection | None = None

    def record(self, record: RunRecord) -> str | None:
        try:
            if self._conn is None:
                self._conn = connect(self.path)
            insert_run(self._conn, record)
        except SpecgenError as e:
            self.close()
            return f"run not recorded: {e}"
        except Exception as e:  # as in record_run
            self.close()
            return f"run not recorded: {str(e) or type(e).__name__} ({self.path})"
        return None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass  # closing a broken connection: nothing left to save
            self._conn = None


def load_runs(
    db_path: Path | None = None,
    profile: str | None = None,
    since: float | None = None,
    last: int | None = None,
    command: str | None = None,
    skip: tuple[str, ...] = (),
) -> list[dict]:
    """Runs oldest first, JSON columns decoded, `adaptive` as bool. `since` is a Unix time;
    `command` keeps that command's runs only, `skip` leaves those commands' out; `last` keeps
    the N most recent of those matching. A missing file is an empty history. Raises
    SpecgenError for a database that cannot be read, is another application's, or is from a
    newer specgen."""
    path = Path(db_path) if db_path is not None else history_db()
    if not path.exists():
        return []
    where, args = [], []
    if profile is not None:
        where.append("profile = ?")
        args.append(profile)
    if command is not None:
        where.append("command = ?")
        args.append(command)
    for name in skip:
        where.append("command != ?")
        args.append(name)
    if since is not None:
        where.append("created_at >= ?")
        args.append(since)
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY created_at DESC, id DESC"
    if last is not None:
        sql += " LIMIT ?"
        args.append(last)
    try:
        conn = connect_read_only(path)
        if conn is None:
            return []
        try:
            conn.row_factory = sqlite3.Row
            rows = [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()
    except (sqlite3.Error, OSError) as e:
        raise unreadable(path, e) from e
    for row in rows:
        row["adaptive"] = bool(row["adaptive"])
        for name in JSON_COLUMNS:
            row[name] = json.loads(row[name])
    return rows[::-1]


def clear_runs(db_path: Path | None = None) -> int:
    """Delete every run; returns how many there were."""
    path = Path(db_path) if db_path is not None else history_db()
    if not path.exists():
        return 0
    try:
        conn = connect(path)
        try:
            n = conn.execute("DELETE FROM runs").rowcount
        finally:
            conn.close()
    except (sqlite3.Error, OSError) as e:
        raise unreadable(path, e) from e
    return n


def unreadable(path: Path, e: Exception) -> SpecgenError:
    """The one line for a history SQLite cannot use: damaged, or out of reach."""
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):
        return SpecgenError(
            f"Cannot use the run history {path}: {e}. The file is damaged or not a database: "
            f"move it away (a new one is created on the next run), or point --stats-db at "
            f"another file.")
    reason = getattr(e, "strerror", None) or str(e)
    return SpecgenError(f"Cannot use the run history {path}: {reason}. Check that it and its "
                        f"folder can be read, or point --stats-db at another file.")
