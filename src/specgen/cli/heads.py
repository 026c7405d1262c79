"""`specgen heads train`: parse the options; specgen.commands.heads trains."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specgen.choices import TRAINABLE_HEADS, listing
from specgen.cli.options import DEBUG, PROFILE, reflow

app = typer.Typer(help="Draft heads on the target (EAGLE, Medusa): train one for a profile.",
                  no_args_is_help=True)

TRAIN_HELP = f"""Train a draft head for a profile's target on text found on this machine.

Teacher-forces the target over a corpus (by default the Python installation's own sources;
any folder of text files with --corpus) and fits a head ({listing(TRAINABLE_HEADS)}) to the
target's own next-token distributions. Checkpoints as it goes: Ctrl-C keeps what was learned,
and running the same command again resumes, up to --minutes in all. The result is a head a
profile loads (\\[draft] head = the folder, or the name of a head trained into the default
folder; docs/heads.md).

[bold]Examples[/]

  specgen heads train --profile qwen-coder-demo-eagle

  specgen heads train --profile qwen-coder-demo --kind medusa --minutes 30 --out ./my-medusa
"""


@app.command("train", help=reflow(TRAIN_HELP))
def train(
    profile: str = PROFILE,
    kind: Optional[str] = typer.Option(
        None, "--kind", help=f"{listing(TRAINABLE_HEADS)} (default: the profile's draft.kind)."),
    corpus: Optional[Path] = typer.Option(
        None, "--corpus", help="A folder of text files (default: the Python standard library)."),
    minutes: float = typer.Option(60.0, "--minutes", help="Training time in all, over every run."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Folder for the head and its checkpoints (default: the profile's "
        "head name, or <profile>-<kind>, under the heads folder)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per training chunk."),
    batch: int = typer.Option(4, "--batch", help="Chunks per training step."),
    steps: Optional[int] = typer.Option(None, "--steps", hidden=True),
    debug: bool = DEBUG,
) -> None:
    from specgen.commands import heads as flow

    flow.run(flow.TrainRequest(profile, kind, corpus, minutes, out, threads, seq_len, batch,
                               max_steps=steps))
