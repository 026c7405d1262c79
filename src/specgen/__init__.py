"""specgen: exact speculative decoding for local LLMs.

The public API is imported lazily so that `specgen --help`, `specgen stats` and the history
store start without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.2.0"
__all__ = ["GenerationResult", "SpecgenError", "SpeculativeGenerator", "Stats", "Token", "__version__"]

if TYPE_CHECKING:
    from specgen.core.engine import GenerationResult, SpeculativeGenerator
    from specgen.core.stats import Stats, Token
    from specgen.errors import SpecgenError


def __getattr__(name: str):
    if name == "SpecgenError":
        from specgen.errors import SpecgenError

        return SpecgenError
    if name in ("Stats", "Token"):
        from specgen.core import stats

        return getattr(stats, name)
    if name in __all__:
        from specgen.core import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
