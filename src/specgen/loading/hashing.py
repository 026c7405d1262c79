"""sha256 of a whole file, read in 16 MiB blocks: the cache's manifests and `specgen cache
verify`, and the demo files' checks. A module of its own because cache.py lists the demo
entries (it reads demo.ASSETS), so demo.py cannot import cache.py. No torch here."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 24  # 16 MiB reads


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()
