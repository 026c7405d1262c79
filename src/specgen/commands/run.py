"""`specgen run`: one prompt, one streamed answer, recorded in the run history."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specgen.app.render import TokenPrinter, err, make_console, summary_line, warn
from specgen.app.store import record_run
from specgen.profiles import Profile


@dataclass(frozen=True)
class RunRequest:
    """What cli/run.py parsed: the profile with the options applied, the prompt's text."""

    profile: Profile
    text: str
    seed: int | None = None
    as_json: bool = False
    no_color: bool = False
    stats_db: Path | None = None
    record_prompt: bool = False


def run(request: RunRequest, load_session: Callable) -> None:
    """Load, answer (streamed, or one JSON object), record, summarise; an answer ended by
    Ctrl-C, SIGTERM or a closed stdout is recorded, then its cause re-raised."""
    from specgen.app.answer import answer  # loads torch: after every check of the input

    prof = request.profile
    session = load_session(prof)
    out = make_console(no_color=request.no_color)
    printer = TokenPrinter(out)
    if printer.styled and not request.as_json:
        err.print(printer.legend())
    result = answer(session, request.text, request.seed,
                    on_text=None if request.as_json else printer.write)
    # Recorded first: whatever ended the answer (Ctrl-C, SIGTERM, a closed stdout), the run
    # is in the history before anything else is written.
    prompt = request.text if request.record_prompt else None
    warning = record_run(session.record("run", result.stats, result.ended, prompt),
                         request.stats_db)
    if not isinstance(result.stopped_by, BrokenPipeError):
        if request.as_json:
            doc = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict(),
                   "profile": prof.name, "target": session.pair.target_name,
                   "draft": session.pair.draft_name}
            out.file.write(json.dumps(doc, ensure_ascii=False) + "\n")
        else:
            out.file.write("\n")
        out.file.flush()  # a closed stdout shows here, not at exit
        err.print(summary_line(result.stats), style="dim", soft_wrap=True, highlight=False)
    if warning:
        warn(warning)
    if result.stopped_by is not None:
        raise result.stopped_by  # the exit code says what ended it (cli/signals.py)
