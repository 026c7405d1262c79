"""`specgen bench`: parse the options; specgen.commands.bench does the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specgen.choices import CONTESTANTS, LLAMACPP_DRAFT_N_MAX, LLAMACPP_DRAFT_P_MIN, METHODS, listing
from specgen.bench.prompts import CODE_CATEGORIES
from specgen.cli.options import MODELS, err, load_session, shared

HELP = """Measure specgen against plain decoding and transformers' assisted generation.

All contestants run in one process on the profile's model pair, interleaved prompt by prompt,
greedy: [bold]baseline[/] (the target's own generate), [bold]peer[/] (generate with
assistant_model=draft), [bold]k2 k4 k6[/] (specgen, fixed K), [bold]adaptive[/] (specgen,
adaptive K), [bold]lookup[/] and [bold]hybrid[/] (prompt-lookup and hybrid drafting),
[bold]self[/], [bold]self-default[/] and [bold]hybrid-self[/] (the target drafting for itself
with sub-layers skipped; by default only when the profile's method is self), the profile's
draft head by its kind ([bold]eagle[/], [bold]eagle3[/], [bold]medusa[/]),
[bold]plain[/] (specgen's own loop with speculation off; only when named), [bold]chain[/]
(adaptive with token trees off: what the trees add; only when named), and,
by default when the target is quantized, [bold]bf16[/] (plain decoding of the target
unquantized in bfloat16, loaded beside the pair: what quantizing buys, and how often the
quantized target's tokens agree with it), and, by default when llama-cpp-python is installed
and the target is a GGUF file, [bold]llamacpp[/] (llama.cpp's plain decoding of that file, on
the CPU), by default when llama.cpp's tools are built (make llamacpp) and the target and the
draft are GGUF files, [bold]llamacpp-spec[/] (llama.cpp's own speculative decoding of those
files: its llama-speculative-simple, drafting as --llamacpp-draft says), and [bold]api[/] (the Python API as a user holding the two transformers models
calls it: SpeculativeGenerator(target, draft) with its defaults; only when named). Prints
tokens/s and speedups per prompt and a summary by prompt category; --out writes every figure
as JSON. The measurements are not recorded in the run history.

The summary's [bold]code[/] row covers the code categories: for the built-in prompts
CODE; for a --prompts file, every category whose name contains "code" (in any case).

[bold]Examples[/]

  specgen bench

  specgen bench --contestants baseline,peer,adaptive --repeats 3 --out bench.json

  specgen bench --prompts my_prompts.jsonl --max-new-tokens 64

  specgen bench --target-quantization int8-dyn --draft-quantization int8-dyn
""".replace("CODE", " and ".join(CODE_CATEGORIES))


@shared("profile", "k", *MODELS, "raw", "debug")
def bench(
    prompts: Optional[Path] = typer.Option(
        None, "--prompts", help='JSONL file of {"category": ..., "prompt": ...} (default: '
        'built-in set); categories containing "code" count as code.'
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", help="Tokens per generation."),
    repeats: int = typer.Option(1, "--repeats", "-r", help="Runs of each contestant per prompt (median)."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the full results as JSON."),
    contestants: Optional[str] = typer.Option(
        None, "--contestants", "-c",
        help=f"Comma-separated subset of {','.join(CONTESTANTS)}.",
    ),
    method: Optional[str] = typer.Option(
        None, "--method", help=f"Drafting method of k2/k4/k6/adaptive/chain: {listing(METHODS)}."
    ),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)."),
    draft_vocab: Optional[int] = typer.Option(
        None, "--draft-vocab", help="Draft over the first N token ids only (0: all; default: the profile's)."
    ),
    draft_confidence: Optional[float] = typer.Option(
        None, "--draft-confidence",
        help="End a draft when the draft's probability of its token falls below this (0: never; default: the profile's).",
    ),
    draft_window: Optional[int] = typer.Option(
        None, "--draft-window",
        help="The draft model reads at most N tokens of the context: its start and its end "
        "(0: all; default: the profile's).",
    ),
    llamacpp_draft: Optional[str] = typer.Option(
        None, "--llamacpp-draft",
        help="llamacpp-spec's draft settings: at most n_max tokens a draft, a draft ends below "
        f"the draft's probability p_min (default: n_max={LLAMACPP_DRAFT_N_MAX},"
        f"p_min={LLAMACPP_DRAFT_P_MIN:g}).",
    ),
    **options,
) -> None:
    from specgen.commands.bench import BenchRequest, run

    options.pop("debug")
    request = BenchRequest(
        prompts=prompts, max_new_tokens=max_new_tokens, repeats=repeats, out_file=out_file,
        contestants=contestants, method=method, threads=threads, draft_vocab=draft_vocab,
        draft_confidence=draft_confidence, draft_window=draft_window,
        llamacpp_draft=llamacpp_draft, **options)
    run(request, load_session, err)  # Ctrl-C and SIGTERM end it through cli/__init__
