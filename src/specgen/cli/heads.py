"""`specgen heads train`: parse the options, show a progress bar; specgen.app.heads trains."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specgen.choices import TRAINABLE_HEADS, listing
from specgen.cli.options import DEBUG, PROFILE, err, reflow

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
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from specgen.app.heads import TrainRequest
    from specgen.app.heads import train as run_training
    from specgen.heads.train import budget_note

    hf_logging.disable_progress_bar()  # the bar below says what is loading
    request = TrainRequest(profile, kind, corpus, minutes, out, threads, seq_len, batch,
                           max_steps=steps)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("{task.fields[figures]}"))
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("loading", total=minutes * 60, figures="")

        def report(p) -> None:
            agree = "/".join(f"{a:.3f}" for a in p.agreement) or "-"
            loss = f"{p.loss:.3f}" if p.loss is not None else "-"
            bar.update(task, completed=min(p.seconds, p.budget), description=p.phase,
                       figures=f"loss {loss}  held-out agreement {agree}  {p.tokens:,} tokens "
                       f"read  {p.steps} steps" + ("  (corpus done)" if p.corpus_done else ""))

        try:
            folder, state, settings = run_training(
                request, report, progress=lambda msg: bar.update(task, description=msg))
        except KeyboardInterrupt:
            err.print("[yellow]interrupted:[/] the checkpoint is saved; run the same command "
                      "again to resume.")
            raise typer.Exit(130) from None
    err.print(f"[bold]{settings.kind} head[/] in {folder}: {budget_note(state, settings)}",
              highlight=False)
