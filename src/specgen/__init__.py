"""specgen: exact speculative decoding for local LLMs.

The public API is imported lazily so that `specgen --help`, `specgen stats` and the history
store start without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.2.0"
__all__ = ["GenerationResult", "Session", "SpecgenError", "SpeculativeGenerator", "Stats", "Token",
           "__version__", "load", "load_gguf", "prepare"]

if TYPE_CHECKING:
    from specgen.app.session import Session, load
    from specgen.core.engine import GenerationResult, SpeculativeGenerator
    from specgen.core.stats import Stats, Token
    from specgen.errors import SpecgenError
    from specgen.kernels import prepare
    from specgen.loading.stored import load_gguf


def __getattr__(name: str):
    if name == "SpecgenError":
        from specgen.errors import SpecgenError

        return SpecgenError
    if name == "prepare":  # kernels.prepare(model, role, quantization): the CLI's preparation
        from specgen.kernels import prepare

        return prepare
    if name == "load_gguf":  # a GGUF file as stored, ready for SpeculativeGenerator
        from specgen.loading.stored import load_gguf

        return load_gguf
    if name in ("load", "Session"):  # a profile loaded as the CLI loads it
        from specgen.app import session

        return getattr(session, name)
    if name in ("Stats", "Token"):
        from specgen.core import stats

        return getattr(stats, name)
    if name in __all__:
        from specgen.core import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
