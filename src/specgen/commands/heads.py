"""`specgen heads train`: load a profile's target (unquantized, in its dtype), read a corpus
as chat answers, and fit a head to the target (heads/train.py) in an output folder that a
later run resumes from and a profile's `[draft] head` loads, behind a progress bar (`run`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from specgen.choices import TRAINABLE_HEADS, listing
from specgen.errors import ConfigError
from specgen.paths import heads_dir
from specgen.profiles import Profile, load_profile


@dataclass
class TrainRequest:
    profile: str
    kind: str | None = None  # None: the profile's draft.kind
    corpus: Path | None = None  # None: heads.train.default_corpus()
    minutes: float = 60.0  # the whole budget, over every run into the same folder
    out: Path | None = None  # None: out_folder
    threads: int | None = None
    seq_len: int = 512
    batch: int = 4
    rows: int | None = None  # None: the profile's draft_vocab, else 32768
    max_steps: int | None = None  # stop this run after so many more steps (tests)


def kind_for(prof: Profile, kind: str | None) -> str:
    kind = kind or (prof.draft.kind if prof.draft is not None else None)
    if kind is None:
        raise ConfigError(f"Profile {prof.name!r} names no head kind: give --kind "
                          f"{listing(TRAINABLE_HEADS)}.")
    if kind not in TRAINABLE_HEADS:
        raise ConfigError(f"specgen trains {listing(TRAINABLE_HEADS)} heads, not {kind!r}; "
                          "EAGLE-3 heads load from their published checkpoints.")
    return kind


def out_folder(prof: Profile, kind: str, out: Path | None) -> Path:
    """--out, else the profile's head when it names a trained head (a bare name) of this kind,
    else paths.heads_dir() / '<profile>-<kind>'."""
    if out is not None:
        return out.expanduser()
    d = prof.draft
    if d is not None and d.head and d.kind == kind and "/" not in d.head and not d.head.startswith(("~", ".")):
        return heads_dir() / d.head
    return heads_dir() / f"{prof.name}-{kind}"


def framing(tokenizer) -> Callable[[Path, str], tuple[list[int], list[int]]]:
    """(frame, body) ids of a corpus file: the frame is the chat template's prompt for a
    request to show the file, then the opening of a code block for sources, so that the
    head learns the target's answers as the bench and chat ask for them."""
    cache: dict[str, list[int]] = {}

    def frame(suffix: str) -> list[int]:
        if suffix not in cache:
            text = ""
            if getattr(tokenizer, "chat_template", None):
                ask = "Write the Python module." if suffix == ".py" else "Write the document."
                text = tokenizer.apply_chat_template([{"role": "user", "content": ask}],
                                                     add_generation_prompt=True, tokenize=False)
            text += "```python\n" if suffix == ".py" else ""
            cache[suffix] = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        return cache[suffix]

    def encode(path: Path, text: str) -> tuple[list[int], list[int]]:
        return frame(path.suffix), tokenizer(text, add_special_tokens=False)["input_ids"]

    return encode


def train(request: TrainRequest, report: Callable | None = None,
          progress: Callable[[str], None] | None = None):
    """Train (or resume) as asked; (out folder, TrainState, TrainSettings)."""
    import torch

    from specgen.heads import train as t
    from specgen.loading.load import load_for_training

    if request.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {request.minutes}.")
    if request.seq_len < 64 or request.batch < 1:
        raise ConfigError("--seq-len must be >= 64 and --batch >= 1.")
    prof = load_profile(request.profile)
    kind = kind_for(prof, request.kind)
    out = out_folder(prof, kind, request.out)
    state = t.Trainer.load_state(out)
    if state is not None and state.settings.get("kind") != kind:
        raise ConfigError(f"{out} holds a {state.settings.get('kind')} head in training, not a "
                          f"{kind} head: give another --out.")
    if state is None and out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and holds no training run: give an empty or new --out.")
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    target, tokenizer, target_name = load_for_training(prof, progress)
    rows = request.rows or prof.speculation.draft_vocab or 32768
    if state is None:
        settings = t.TrainSettings(kind=kind, seq_len=request.seq_len, batch=request.batch,
                                   rows=min(rows, target.config.get_text_config().vocab_size))
        state = t.TrainState(settings=asdict(settings))
    else:
        fields = t.TrainSettings.__dataclass_fields__
        settings = t.TrainSettings(**{k: v for k, v in state.settings.items() if k in fields})
        if state.settings.get("target", target_name) != target_name:
            raise ConfigError(f"{out} trains a head for {state.settings['target']}, not "
                              f"{target_name}: give another --out.")
    state.settings["target"] = target_name
    corpus = (request.corpus or t.default_corpus()).expanduser()
    files = t.corpus_files(corpus)
    source = itertools.islice(t.chunks(files, framing(tokenizer), settings.seq_len),
                              state.chunks_read, None)
    head = t.new_head(kind, target, settings.intermediate, settings.rows, settings.medusa_heads,
                      settings.seed)
    info = {"target": target_name, "profile": prof.name, "corpus": str(corpus),
            "corpus_files": len(files)}
    trainer = t.Trainer(target, head, source, out, settings, state, info)
    trainer.restore()
    state = trainer.run(request.minutes * 60, report, request.max_steps)
    return out, state, settings


def run(request: TrainRequest) -> None:
    """Train behind a progress bar on stderr (loss, held-out agreement, tokens read); Ctrl-C
    keeps the checkpoint and exits 130; the last line says where the head is."""
    import typer
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from specgen.app.render import err
    from specgen.heads.train import budget_note

    hf_logging.disable_progress_bar()  # the bar below says what is loading
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("{task.fields[figures]}"))
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("loading", total=request.minutes * 60, figures="")

        def report(p) -> None:
            agree = "/".join(f"{a:.3f}" for a in p.agreement) or "-"
            loss = f"{p.loss:.3f}" if p.loss is not None else "-"
            bar.update(task, completed=min(p.seconds, p.budget), description=p.phase,
                       figures=f"loss {loss}  held-out agreement {agree}  {p.tokens:,} tokens "
                       f"read  {p.steps} steps" + ("  (corpus done)" if p.corpus_done else ""))

        try:
            folder, state, settings = train(
                request, report, progress=lambda msg: bar.update(task, description=msg))
        except KeyboardInterrupt:
            err.print("[yellow]interrupted:[/] the checkpoint is saved; run the same command "
                      "again to resume.")
            raise typer.Exit(130) from None
    err.print(f"[bold]{settings.kind} head[/] in {folder}: {budget_note(state, settings)}",
              highlight=False)
