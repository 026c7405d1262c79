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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process happens to be (the CLI's handler: cli/signals.py).
    A KeyboardInterrupt, so every path that keeps the output of a Ctrl-C'd run keeps a
    terminated one's too, and `finally` blocks (temporary files, caches) clean up alike; the
    CLI then exits 143 instead of 130."""

    exit_code = 143


class SpecgenWarning(UserWarning):
    """Something the user should know that does not stop the work (e.g. a model's own Python
    code about to run). The CLI prints it as one `warning:` line."""
