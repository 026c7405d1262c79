"""`specgen tune`: parse the options; specgen.commands.tune does the rest."""

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
    from specgen.commands import tune as flow

    request = flow.TuneRequest(profile=profile, prompts=prompts, minutes=minutes,
                               max_new_tokens=max_new_tokens, threads=threads, device=device,
                               target_quantization=target_quantization, k=k)
    flow.report(flow.run(request, load_session, err))
