"""Where specgen keeps its files: one home for every path, each overridable by an
environment variable (tests and users with their own layout set them).

| what | variable | default |
|---|---|---|
| caches (converted models, packed weights, kernels, demo files, tuned skip sets) | SPECGEN_CACHE_DIR | user cache dir |
| heads trained by `specgen heads train` | SPECGEN_HEADS_DIR | cache dir / heads |
| user profiles | SPECGEN_PROFILE_DIR | user config dir / profiles |
| run history | SPECGEN_STATS_DB | user data dir / history.sqlite3 |
| chat line history | SPECGEN_HISTORY_FILE | user data dir / chat_history |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "specgen"


def _env(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    return _env("SPECGEN_CACHE_DIR") or Path(platformdirs.user_cache_dir(APP))


def tuned_dir() -> Path:
    """Skip sets found by `specgen tune`, one JSON file per target (method "self")."""
    return cache_dir() / "tuned"


def heads_dir() -> Path:
    """Where `specgen heads train` puts a head by default, one folder per name; a profile's
    `[draft] head = "NAME"` (a bare name) means the head there."""
    return _env("SPECGEN_HEADS_DIR") or cache_dir() / "heads"


def user_profile_dir() -> Path:
    return _env("SPECGEN_PROFILE_DIR") or Path(platformdirs.user_config_dir(APP)) / "profiles"


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def history_db() -> Path:
    """$SPECGEN_STATS_DB, else history.sqlite3 in the user data directory."""
    return _env("SPECGEN_STATS_DB") or data_dir() / "history.sqlite3"


def chat_history() -> Path:
    """$SPECGEN_HISTORY_FILE, else chat_history in the user data directory."""
    return _env("SPECGEN_HISTORY_FILE") or data_dir() / "chat_history"
