"""One exception family: every error a user can cause is a SpecgenError with a message
that says what was wrong and what to do. The CLI prints it in one line and exits 2."""


class SpecgenError(Exception):
    """Base class for errors specgen reports to the user (no traceback)."""


class ConfigError(SpecgenError):
    """A bad profile, option value or argument."""


class ModelError(SpecgenError):
    """A model that cannot be found, verified, loaded or paired."""


class ResourceError(SpecgenError):
    """Not enough memory, or no device for what was asked (e.g. CUDA-only quantization)."""
