"""The `specgen` command line. Errors a user can cause print one line and exit 2;
`--debug` shows the traceback instead."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from specgen import __version__
from specgen import cli_profiles, cli_stats
from specgen.errors import ConfigError, SpecgenError
from specgen.profiles import DEFAULT_PROFILE, METHODS, Profile, load_profile, with_overrides
from specgen.render import IncrementalDecoder, TokenPrinter, make_console, summary_line
from specgen.store import record_run

if TYPE_CHECKING:
    from specgen.session import Session


class _Group(TyperGroup):
    """Turns a SpecgenError raised by any command into one clear line and exit code 2
    (the traceback only with --debug or SPECGEN_DEBUG=1), and Ctrl-C into exit code 130."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except SpecgenError as e:
            if debug_enabled():
                raise
            err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("SPECGEN_DEBUG") == "1"


app = typer.Typer(
    cls=_Group,
    name="specgen",
    help="Exact speculative decoding for local LLMs: a small draft model proposes, the "
    "large target model verifies, and the output is exactly the target's.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
app.add_typer(cli_stats.app, name="stats")
app.add_typer(cli_profiles.app, name="profiles")


def _version(value: bool) -> None:
    if value:
        print(f"specgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """specgen: faster local generation that never changes what the model says."""


# Options shared by run and chat.
PROFILE = typer.Option(
    DEFAULT_PROFILE, "--profile", "-p", help="Profile name or path to a .toml file."
)
MAX_NEW_TOKENS = typer.Option(None, "--max-new-tokens", "-n", help="Most tokens to generate.")
TEMPERATURE = typer.Option(None, "--temperature", "-t", help="0 is greedy.")
TOP_P = typer.Option(None, "--top-p", help="Nucleus sampling mass, in (0, 1].")
TOP_K = typer.Option(None, "--top-k", help="Sample from the k likeliest tokens (0: off).")
SEED = typer.Option(None, "--seed", help="Seed for reproducible sampling.")
K = typer.Option(None, "--k", help="Speculative tokens per step, 0 to 32 (the most, when adaptive).")
NO_ADAPTIVE = typer.Option(False, "--no-adaptive", help="Always draft exactly K tokens.")
METHOD = typer.Option(None, "--method", help="draft-model, prompt-lookup or hybrid.")
DEVICE = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N (both models).")
TARGET_QUANTIZATION = typer.Option(
    None, "--target-quantization", help="none, nf4, fp4, int8 (bitsandbytes), int8-wo, int4-wo, int8-dyn or int4-dyn (CPU)."
)
DRAFT_QUANTIZATION = typer.Option(
    None, "--draft-quantization", help="Same choices, for the draft model."
)
DRAFT_RUNTIME = typer.Option(
    None, "--draft-runtime",
    help="transformers, or llama.cpp: run a GGUF draft on llama.cpp's CPU kernels (needs llama-cpp-python).",
)
SYSTEM = typer.Option(None, "--system", help="System prompt (chat template only).")
NO_COLOR = typer.Option(False, "--no-color", help="No colours (NO_COLOR is honoured too).")
STATS_DB = typer.Option(None, "--stats-db", help="Run-history database to record into.")
RECORD_PROMPT = typer.Option(False, "--record-prompt", help="Store the prompt text in the history.")
DEBUG = typer.Option(False, "--debug", help="Show tracebacks for errors.")


RUN_HELP = """Generate an answer with speculative decoding, streamed as it is verified.

In a terminal each token is coloured by where it came from: [green]accepted[/] (a draft token
the target kept), [yellow]resampled[/] (the target's correction) and [cyan]bonus[/] (the
target's extra token). A summary line follows on stderr. Piped output is plain text.

[bold]Examples[/]

  specgen run "write quicksort in python"

  specgen run --profile llama3-8b --temperature 0.7 --seed 1 "a haiku about caches"

  cat notes.txt | specgen run --raw -

  specgen run --file prompt.md --format json > answer.json
"""


@app.command(help=RUN_HELP, no_args_is_help=False)
def run(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' (or a pipe) reads stdin."),
    profile: str = PROFILE,
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    temperature: Optional[float] = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    seed: Optional[int] = SEED,
    k: Optional[int] = K,
    no_adaptive: bool = NO_ADAPTIVE,
    method: Optional[str] = METHOD,
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    draft_quantization: Optional[str] = DRAFT_QUANTIZATION,
    draft_runtime: Optional[str] = DRAFT_RUNTIME,
    raw: bool = typer.Option(False, "--raw", help="Plain continuation: no chat template."),
    system: Optional[str] = SYSTEM,
    output_format: str = typer.Option("text", "--format", help="text or json (one object on stdout)."),
    no_color: bool = NO_COLOR,
    stats_db: Optional[Path] = STATS_DB,
    record_prompt: bool = RECORD_PROMPT,
    debug: bool = DEBUG,
) -> None:
    if output_format not in ("text", "json"):
        raise ConfigError(f"--format must be 'text' or 'json', got {output_format!r}.")
    err.no_color = no_color or bool(os.environ.get("NO_COLOR"))
    text = read_prompt(prompt, file)
    prof = profile_with_options(
        profile, max_new_tokens, temperature, top_p, top_k, k, no_adaptive, method, system, raw,
        device=device, target_quantization=target_quantization,
        draft_quantization=draft_quantization, draft_runtime=draft_runtime,
    )
    from specgen.session import encode_messages, messages_for  # loads torch

    session = load_session(prof)
    gen = prof.generation
    input_ids = encode_messages(
        session.tokenizer, messages_for(text, gen.system_prompt), gen.chat_template
    )
    out = make_console(no_color=no_color)
    as_json = output_format == "json"
    printer = TokenPrinter(out)
    if printer.styled and not as_json:
        err.print(printer.legend())
    decoder = IncrementalDecoder(session.tokenizer)
    tokens: list[dict] = []
    ended = "completed"
    try:
        for tok in session.generator.stream(input_ids, **session.sampling_kwargs(seed)):
            piece = decoder.push(tok.id)
            tokens.append({"id": tok.id, "text": piece, "source": tok.source})
            if not as_json:
                printer.write(piece, tok.source)
    except KeyboardInterrupt:
        ended = "interrupted"
    finally:
        if tokens:
            tail = decoder.flush()
            tokens[-1]["text"] += tail
            if not as_json:
                printer.write(tail, tokens[-1]["source"])
    stats = session.generator.stats
    warning = record_run(
        session.record("run", stats, ended, text if record_prompt else None),
        stats_db,
    )
    if as_json:
        answer = {
            "text": "".join(t["text"] for t in tokens),
            "tokens": tokens,
            "stats": stats.to_dict(),
            "profile": prof.name,
            "target": session.pair.target_name,
            "draft": session.pair.draft_name,
        }
        out.file.write(json.dumps(answer, ensure_ascii=False) + "\n")
    else:
        out.file.write("\n")
    err.print(summary_line(stats), style="dim", soft_wrap=True, highlight=False)
    if warning:
        err.print(f"[yellow]warning:[/] {warning}")
    if ended == "interrupted":
        raise typer.Exit(130)


def profile_with_options(
    profile: str, max_new_tokens: int | None, temperature: float | None, top_p: float | None,
    top_k: int | None, k: int | None, no_adaptive: bool, method: str | None,
    system: str | None, raw: bool = False, **models: str | None,
) -> Profile:
    """The named profile with the shared command-line options applied; `models` takes
    device, target_quantization, draft_quantization and draft_runtime."""
    return with_overrides(
        load_profile(profile),
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        num_speculative_tokens=k, adaptive=False if no_adaptive else None, method=method,
        system_prompt=system, chat_template=False if raw else None, **models,
    )


def load_session(prof: Profile, peer_draft: bool = False) -> "Session":
    """Load the profile's models behind a status line (`peer_draft`: see models.load_pair)."""
    from specgen.session import open_session  # loads torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own status line says what is loading
    with err.status("Loading models…") as status:
        return open_session(prof, progress=lambda msg: status.update(msg), peer_draft=peer_draft)


CHAT_HELP = """Chat with the model pair: a multi-turn conversation streamed as it is verified.

Each turn is coloured like [bold]specgen run[/]. The models stay loaded and their caches
are kept between turns, so a new turn only prefills its own tokens. Commands: /help,
/reset, /system TEXT, /k N, /adaptive on|off, /temperature X, /stats, /save FILE, /exit.
A line of \"\"\" starts and ends a multi-line message; Ctrl-C stops an answer, Ctrl-D leaves.
With stdin not a terminal, each line is a turn and only the answers go to stdout.

[bold]Examples[/]

  specgen chat

  specgen chat --profile llama3-8b --system "You are a terse senior engineer."

  printf 'hi\\nand in French?\\n' | specgen chat > answers.txt
"""


@app.command(help=CHAT_HELP)
def chat(
    profile: str = PROFILE,
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    temperature: Optional[float] = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    seed: Optional[int] = SEED,
    k: Optional[int] = K,
    no_adaptive: bool = NO_ADAPTIVE,
    method: Optional[str] = METHOD,
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    draft_quantization: Optional[str] = DRAFT_QUANTIZATION,
    draft_runtime: Optional[str] = DRAFT_RUNTIME,
    system: Optional[str] = SYSTEM,
    no_color: bool = NO_COLOR,
    stats_db: Optional[Path] = STATS_DB,
    record_prompt: bool = RECORD_PROMPT,
    debug: bool = DEBUG,
) -> None:
    err.no_color = no_color or bool(os.environ.get("NO_COLOR"))
    prof = profile_with_options(
        profile, max_new_tokens, temperature, top_p, top_k, k, no_adaptive, method, system,
        device=device, target_quantization=target_quantization,
        draft_quantization=draft_quantization, draft_runtime=draft_runtime,
    )
    from specgen import chat as chat_mod  # loads torch

    session = load_session(prof)
    conversation = chat_mod.Chat(session, prof.generation.system_prompt, seed)
    out = make_console(no_color=no_color)
    interactive = sys.stdin.isatty()
    if interactive:
        pair = session.pair
        err.print(f"[bold]specgen chat[/] · {prof.name}: {pair.draft_name or 'no draft'} → "
                  f"{pair.target_name}", highlight=False)
        err.print('/help for commands · \"\"\" for multi-line input · Ctrl-C stops an answer · '
                  "Ctrl-D leaves", style="dim", highlight=False)
        printer = TokenPrinter(out)
        if printer.styled:
            err.print(printer.legend())
        with chat_mod.line_editing(chat_mod.history_file()):
            chat_mod.repl(conversation, input, out, err, stats_db, record_prompt)
    else:
        chat_mod.repl(conversation, chat_mod.pipe_line, out, err, stats_db, record_prompt)


BENCH_HELP = """Measure specgen against plain decoding and transformers' assisted generation.

All contestants run in one process on the profile's model pair, interleaved prompt by prompt,
greedy: [bold]baseline[/] (the target's own generate), [bold]peer[/] (generate with
assistant_model=draft), [bold]k2 k4 k6[/] (specgen, fixed K), [bold]adaptive[/] (specgen,
adaptive K), [bold]lookup[/] and [bold]hybrid[/] (prompt-lookup and hybrid drafting),
[bold]plain[/] (specgen's own loop with speculation off; only when named), and,
by default when the target is quantized, [bold]bf16[/] (plain decoding of the target
unquantized in bfloat16, loaded beside the pair: what quantizing buys, and how often the
quantized target's tokens agree with it), and, by default when llama-cpp-python is installed
and the target is a GGUF file, [bold]llamacpp[/] (llama.cpp's plain decoding of that file, on
the CPU). Prints tokens/s and speedups per prompt and a summary; --out writes every figure as
JSON.

[bold]Examples[/]

  specgen bench

  specgen bench --contestants baseline,peer,adaptive --repeats 3 --out bench.json

  specgen bench --prompts my_prompts.jsonl --max-new-tokens 64

  specgen bench --target-quantization int8-dyn --draft-quantization int8-dyn
"""


@app.command(help=BENCH_HELP)
def bench(
    profile: str = PROFILE,
    prompts: Optional[Path] = typer.Option(
        None, "--prompts", help='JSONL file of {"category": ..., "prompt": ...} (default: built-in set).'
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", help="Tokens per generation."),
    repeats: int = typer.Option(1, "--repeats", "-r", help="Runs of each contestant per prompt (median)."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the full results as JSON."),
    chosen: Optional[str] = typer.Option(
        None, "--contestants", "-c",
        help="Comma-separated subset of baseline,plain,peer,k2,k4,k6,adaptive,lookup,hybrid,bf16,llamacpp.",
    ),
    method: Optional[str] = typer.Option(
        None, "--method", help="Drafting method of k2/k4/k6/adaptive: draft-model, prompt-lookup or hybrid."
    ),
    k: Optional[int] = typer.Option(None, "--k", help="Most speculative tokens of the adaptive contestants (0 to 32)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)."),
    draft_vocab: Optional[int] = typer.Option(
        None, "--draft-vocab", help="Draft over the first N token ids only (0: all; default: the profile's)."
    ),
    draft_confidence: Optional[float] = typer.Option(
        None, "--draft-confidence",
        help="End a draft when the draft's probability of its token falls below this (0: never; default: the profile's).",
    ),
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    draft_quantization: Optional[str] = DRAFT_QUANTIZATION,
    draft_runtime: Optional[str] = DRAFT_RUNTIME,
    raw: bool = typer.Option(False, "--raw", help="Plain continuation: no chat template."),
    stats_db: Optional[Path] = STATS_DB,
    debug: bool = DEBUG,
) -> None:
    from specgen import bench as b
    from specgen import llamacpp
    from specgen.models import gguf_file, is_gguf

    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}.")
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}.")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}.")
    if draft_confidence is not None and not 0.0 <= draft_confidence < 1.0:
        raise ConfigError(f"--draft-confidence must be in [0, 1), got {draft_confidence}.")
    prompt_set = b.read_prompts(prompts) if prompts else b.builtin_prompts()
    prof = load_profile(profile)
    spec_method = method or prof.speculation.method
    if spec_method not in METHODS:
        raise ConfigError(f"--method {spec_method!r} is not a drafting method; choose one of "
                          f"{', '.join(METHODS)}.")
    everyone = b.contestants(spec_method, k if k is not None else prof.speculation.num_speculative_tokens)
    quantized = (target_quantization or prof.target.quantization) != "none"
    base_dir = prof.path.parent if prof.path else None
    default = b.default_names(everyone, quantized, llamacpp.available() and is_gguf(prof.target))
    names = [n.strip() for n in chosen.split(",") if n.strip()] if chosen else default
    unknown = [n for n in names if n not in everyone]
    if unknown or not names:
        raise ConfigError(f"Unknown contestant(s) {', '.join(unknown) or '(none given)'}; choose "
                          f"from {', '.join(everyone)}.")
    picked = [everyone[n] for n in dict.fromkeys(names)]
    gguf = None
    if "llamacpp" in names:
        if not llamacpp.available():
            raise ConfigError(f"The llamacpp contestant needs llama-cpp-python: {llamacpp.INSTALL_HINT}.")
        gguf = gguf_file(prof.target, "target", base_dir)
        if gguf is None:
            raise ConfigError(f"The llamacpp contestant runs the target's GGUF file, but profile "
                              f"{prof.name!r}'s target {prof.target.model!r} is not a GGUF model.")
    needs_draft = any(c.needs_draft_model for c in picked)
    if needs_draft and prof.draft is None:
        if chosen:
            raise ConfigError(f"Profile {prof.name!r} has no draft model, which "
                              f"{', '.join(c.name for c in picked if c.needs_draft_model)} need.")
        picked = [c for c in picked if not c.needs_draft_model]
    # Load the draft whenever a contestant needs it, whatever the profile's own method.
    prof = with_overrides(prof, method="draft-model" if needs_draft and prof.draft else None,
                          chat_template=False if raw else None, max_new_tokens=max_new_tokens,
                          temperature=0.0, device=device, target_quantization=target_quantization,
                          draft_quantization=draft_quantization, draft_runtime=draft_runtime)
    if draft_vocab and prof.draft is not None and prof.draft.runtime == "llama.cpp":
        raise ConfigError("--draft-vocab trims a transformers draft's output layer; a llama.cpp "
                          "draft drafts over its whole vocabulary. Drop --draft-vocab.")
    import torch

    from specgen.session import encode_messages, messages_for
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate's notes on generation configs are noise here
    if threads is not None:
        torch.set_num_threads(threads)
    session = load_session(prof, peer_draft=any(c.kind == "peer" for c in picked))
    reference = None
    if any(c.kind == "reference" for c in picked):  # the target alone, unquantized, in bf16
        reference = load_session(with_overrides(
            prof, method="prompt-lookup", target_quantization="none", target_dtype="bfloat16")).pair.target
    gen = prof.generation
    inputs = [encode_messages(session.tokenizer, messages_for(p.prompt, gen.system_prompt),
                              gen.chat_template) for p in prompt_set]
    runner = b.Bench(session.pair.target, session.pair.draft, max_new_tokens, session.eos_ids(),
                     prof.speculation.max_ngram, prof.speculation.min_ngram,
                     (prof.speculation.draft_vocab if draft_vocab is None else draft_vocab) or None,
                     prof.speculation.draft_confidence if draft_confidence is None else draft_confidence,
                     reference, peer_draft=session.pair.peer_draft)
    if gguf is not None:  # the same threads as torch, room for the longest prompt
        runner.llama = llamacpp.load(gguf, torch.get_num_threads(),
                                     max(len(i) for i in inputs) + max_new_tokens + 16)
    total = len(prompt_set) * repeats * len(picked)
    warnings: list[str] = []

    names = [c.name for c in picked]
    by_name = {c.name: c for c in picked}
    config = {"profile": prof.name, "target": session.pair.target_name,
              "draft": session.pair.draft_name, "dtype": session.pair.dtype,
              "device": session.pair.device, "max_new_tokens": max_new_tokens,
              "quantization": session.pair.quantization,
              "draft_quantization": session.pair.draft_quantization,
              "draft_runtime": prof.draft.runtime if prof.draft else None,
              "repeats": repeats, "method": spec_method, "k_max": everyone["adaptive"].k,
              "threads": torch.get_num_threads(), "chat_template": gen.chat_template,
              "draft_vocab": runner.drafter_options[2] or 0, "draft_confidence": runner.drafter_options[3],
              "command": "specgen " + " ".join(sys.argv[1:]), "complete": False,
              **({"llamacpp_gguf": str(gguf)} if gguf is not None else {})}
    measurements: list = []

    def write_json() -> dict:
        doc = b.report(measurements, prompt_set, names, config)
        if out_file is not None:
            try:
                out_file.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"Cannot write {out_file}: {e.strerror}.") from None
        return doc

    def progress(m, stats) -> None:
        measurements.append(m)
        err.print(f"[dim][{len(measurements)}/{total}] prompt {m.prompt + 1} ({m.category}) "
                  f"{m.contestant}: {m.new_tokens} tokens, {m.tokens_per_second:.2f} tok/s[/]",
                  highlight=False)
        warning = b.record(session, by_name[m.contestant], stats, stats_db)
        if warning and warning not in warnings:
            warnings.append(warning)
        if len(measurements) % (len(picked) * repeats) == 0:
            write_json()  # a long bench keeps its figures prompt by prompt

    err.print(f"[dim]bench: {len(prompt_set)} prompts x {len(picked)} contestants x {repeats} "
              f"repeat(s), {max_new_tokens} new tokens, {torch.get_num_threads()} threads[/]")
    interrupted = False
    try:
        b.run_bench(runner, prompt_set, inputs, picked, repeats, on_measurement=progress)
        config["complete"] = True
    except KeyboardInterrupt:
        interrupted = True  # show and keep what was measured
    doc = write_json()
    console = Console()
    for table in b.tables(doc):
        console.print(table)
    for name, t in doc["targets"].items():
        state = "[green]met[/]" if t["met"] else "[red]not met[/]"
        by = f" by {t['by']}" if "by" in t else ""
        console.print(f"target {name}: {b.fmt_ratio(t['value'])}{by} (goal {t['goal']}x) {state}")
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    if interrupted:
        err.print("[yellow]interrupted:[/] the figures cover the measurements made so far.")
        raise typer.Exit(130)


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file, or stdin ('-' or a pipe)."""
    if file is not None:
        if prompt is not None:
            raise ConfigError("Give the prompt either as an argument or with --file, not both.")
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"Cannot read the prompt file {file}: {e.strerror}.") from None
    elif prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
    elif prompt is None:
        raise ConfigError('No prompt given. Try: specgen run "write quicksort in python"')
    else:
        text = prompt
    if not text.strip():
        raise ConfigError("The prompt is empty: give some text to continue or answer.")
    return text


def main() -> None:
    """Console-script entry point."""
    app()
