"""`specgen tune`: parse the options; specgen.tune.command does the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specgen.cli.options import DEBUG, DEVICE, K, PROFILE, TARGET_QUANTIZATION, err, load_session

HELP = """Find the sub-layers the target skips when it drafts for itself (method "self").

Self-speculative drafting runs the target's own layers with some attention and MLP
sub-layers left out: no draft model, no extra weights. Which ones to leave out decides its
speed. This command ranks the target's sub-layers, then measures real speculative decoding
(greedy, adaptive K) with candidate skip sets on a small built-in prompt set (plus
--prompts), against plain decoding, for --minutes. The fastest set is stored in specgen's
cache for this target (its weights, quantization and device kind), and `method = "self"`
uses it from then on; a profile's \\[speculation] skip_layers still comes first.

[bold]Examples[/]

  specgen tune --profile qwen-coder-demo-int4

  specgen tune -p my-llama.toml --minutes 20 --prompts my_prompts.jsonl
"""


def tune(
    profile: str = PROFILE,
    prompts: Optional[Path] = typer.Option(
        None, "--prompts", help='JSONL file of {"category": ..., "prompt": ...}, added to the built-in set.'),
    minutes: float = typer.Option(8.0, "--minutes", "-m", help="Time budget, loading included."),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", "-n", help="Tokens per generation."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)."),
    k: Optional[int] = K,
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    debug: bool = DEBUG,
) -> None:
    from specgen.tune.command import TuneRequest, run

    request = TuneRequest(profile=profile, prompts=prompts, minutes=minutes,
                          max_new_tokens=max_new_tokens, threads=threads, device=device,
                          target_quantization=target_quantization, k=k)
    result = run(request, load_session, err)
    speedup = result.tokens_per_second / result.plain_tokens_per_second
    err.print(f"skip set: [bold]{result.skip_layers}[/] · {result.tokens_per_second:.2f} tok/s, "
              f"{speedup:.2f}x plain decoding ({result.plain_tokens_per_second:.2f} tok/s) · "
              f"{result.trials} sets tried", highlight=False)
    if result.default_tokens_per_second:
        err.print(f"the default set: {result.default_tokens_per_second:.2f} tok/s, "
                  f"{result.default_tokens_per_second / result.plain_tokens_per_second:.2f}x plain",
                  highlight=False)
    err.print(f"stored in {result.path}; method \"self\" uses it for this target from now on.",
              highlight=False)
    if speedup < 1.0:
        err.print("[yellow]note:[/] no set drafted faster than plain decoding here; adaptive K "
                  "switches self drafting off where it does not pay.")
    if not result.all_equal:
        err.print("[bold red]warning:[/] some output differed from plain decoding, which an exact "
                  "target never gives: please report it.")
