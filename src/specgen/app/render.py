"""Showing generation in a terminal: token text coloured by where it came from, a legend and
a one-line summary. Plain text, no escape codes, when the output is not a terminal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.markup import escape
from rich.text import Text

if TYPE_CHECKING:  # the terminal side needs no torch at import time
    from specgen.core.stats import Origin, Stats

STYLES: dict[str, str] = {"accepted": "green", "resampled": "yellow", "bonus": "cyan"}
# The error console every command writes its notes, warnings and errors to (stdout is the
# answer's alone).
err = Console(stderr=True)


def warn(message: str) -> None:
    """One `warning:` line on stderr (the message's brackets are text, not markup)."""
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


LEGEND = {
    "accepted": "accepted (draft token the target kept)",
    "resampled": "resampled (target's correction)",
    "bonus": "bonus (target's extra token)",
}


class IncrementalDecoder:
    """Token ids in, text deltas out. Decoding token by token breaks multi-byte characters
    and drops leading spaces with some tokenizers, so each delta is the growth of the text
    of a short window, held back while it ends in an incomplete character."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # ids already turned into text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. an incomplete character at the very end)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if after.startswith(before) else ""


def make_console(file: TextIO | None = None, no_color: bool = False) -> Console:
    """A console for the answer: colours only on a terminal, and never with NO_COLOR or
    --no-color (Rich reads NO_COLOR itself)."""
    return Console(file=file or sys.stdout, no_color=no_color or None, highlight=False)


class TokenPrinter:
    """Streams token text. On a terminal each piece takes its source's colour; elsewhere
    the text is written as is."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.styled = console.is_terminal and not console.no_color

    def legend(self) -> Text:
        legend = Text()
        for source, label in LEGEND.items():
            legend.append("■ ", style=STYLES[source]).append(label + "  ", style="dim")
        return legend

    def write(self, text: str, source: Origin) -> None:
        if not text:
            return
        if self.styled:
            self.console.print(Text(text, style=STYLES[source]), end="", soft_wrap=True)
        else:
            self.console.file.write(text)
            self.console.file.flush()


def summary_line(stats: Stats) -> str:
    """One line: what was generated, how fast, and what speculation contributed."""
    parts = [
        f"{stats.new_tokens} tokens in {stats.total_seconds:.1f} s",
        f"{stats.tokens_per_second:.1f} tok/s",
    ]
    if stats.proposed:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
    parts += [
        f"tau {stats.tau:.2f}",
        f"{stats.target_passes} target passes",
    ]
    if stats.tree_steps:
        parts.append(f"{stats.tree_steps} as trees, {stats.branch_kept} kept a branch")
    parts.append(f"est. speedup {stats.speedup_estimate:.2f}x")
    if stats.stop_reason == "interrupted":
        parts.append("interrupted")
    return " · ".join(parts)
