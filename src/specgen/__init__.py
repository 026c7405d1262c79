"""specgen: exact speculative decoding for local LLMs."""

from specgen.engine import GenerationResult, SpeculativeGenerator, Stats, Token
from specgen.errors import SpecgenError

__version__ = "0.1.0"
__all__ = ["GenerationResult", "SpecgenError", "SpeculativeGenerator", "Stats", "Token", "__version__"]
