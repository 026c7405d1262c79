"""How the command line ends when it is told to: SIGTERM is handled like Ctrl-C, and a
closed stdout (`specgen run ... | head -1`) ends the work quietly; and once a command is done
(`leave`): without the interpreter's teardown.

While a command runs, SIGTERM raises errors.Terminated (a KeyboardInterrupt) wherever the
process is, once: every path that keeps the output of a Ctrl-C'd run (the answer so far, the
history record, the bench figures) keeps a terminated one's, and `finally` blocks clean up
as usual. Further SIGTERMs while that cleanup runs are ignored, so that it can finish (a
supervisor that will not wait sends SIGKILL). The exit code is 128 + the signal: 130 for
Ctrl-C, 143 for SIGTERM, and 141 for a closed pipe, as if SIGPIPE had ended the process."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

from specgen.errors import SpecgenWarning, Terminated

INTERRUPTED = 130  # 128 + SIGINT
PIPE_CLOSED = 141  # 128 + SIGPIPE


def exit_code(stop: BaseException) -> int:
    """The exit code of a run that `stop` ended: Ctrl-C, SIGTERM or a closed stdout."""
    if isinstance(stop, BrokenPipeError):
        return PIPE_CLOSED
    return getattr(stop, "exit_code", INTERRUPTED)


def leave(code: int | None) -> NoReturn:
    """End the process of a command that is done, with its exit code: the atexit handlers run
    and standard output and error are flushed, as at any exit, but the interpreter's teardown
    (every module's objects freed one by one, then PyTorch's C++ destructors) is skipped: it
    changes nothing a finished command leaves behind. A thread still working (one Python
    would wait for), output that cannot be flushed, or a profiler or tracer watching (cProfile,
    coverage, a debugger: each reports after the program returns) ends the usual way."""
    watched = sys.getprofile() is not None or sys.gettrace() is not None
    if watched or any(t is not threading.main_thread() and not t.daemon
                      for t in threading.enumerate()):
        raise SystemExit(code)
    atexit._run_exitfuncs()  # what the interpreter runs first at exit (then clears)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # the interpreter reports it, and says so in the exit code
        raise SystemExit(code) from None
    os._exit(code or 0)


def silence_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null, so that neither later
    writes nor the interpreter's final flush raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test runner's stream)
        pass


@contextmanager
def handled(show_warning: Callable[[str], None]) -> Iterator[None]:
    """For the duration of a command: SIGTERM raises Terminated (in the main thread only, where
    Python runs signal handlers), and SpecgenWarnings go to `show_warning` as one line each."""
    previous_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SpecgenWarning):
            show_warning(str(message))
        else:
            previous_show(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    fired = False

    def on_sigterm(signum, frame):
        nonlocal fired
        if not fired:
            fired = True
            raise Terminated()

    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        warnings.showwarning = previous_show
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
