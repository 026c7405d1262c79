"""`specgen serve`: the loaded profile behind OpenAI- and Ollama-compatible HTTP APIs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from specgen.cli.options import (DEBUG, DEVICE, DRAFT_QUANTIZATION, DRAFT_RUNTIME, K, MAX_NEW_TOKENS,
                                 METHOD, NO_ADAPTIVE, PROFILE, RECORD_PROMPT, STATS_DB, SYSTEM,
                                 TARGET_QUANTIZATION, TEMPERATURE, TOP_K, TOP_P, err, load_session,
                                 profile_with_options)

HELP = """Serve the profile over HTTP: OpenAI- and Ollama-compatible APIs on exact speculative
decoding, one request at a time, in arrival order.

OpenAI: GET /v1/models, POST /v1/completions, POST /v1/chat/completions. Ollama: POST
/api/generate, POST /api/chat, GET /api/tags, GET /api/version. Also GET /health and GET
/metrics (Prometheus). Every answer carries a [bold]specgen[/] object with its token
sources, acceptance and tau, and is recorded in the run history (`specgen stats`).

[bold]Examples[/]

  specgen serve

  specgen serve --profile llama3-8b --port 8080 --max-queue 4

  SPECGEN_API_KEY=secret specgen serve --host 0.0.0.0
"""


def serve(
    profile: str = PROFILE,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (127.0.0.1: "
                             "this machine only)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="SPECGEN_API_KEY",
        help="Answer only requests with 'Authorization: Bearer KEY' (else 401)."),
    max_queue: int = typer.Option(16, "--max-queue", help="Requests that may wait behind the "
                                  "one generating; more are refused (429 / 503, Retry-After)."),
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    temperature: Optional[float] = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    k: Optional[int] = K,
    no_adaptive: bool = NO_ADAPTIVE,
    method: Optional[str] = METHOD,
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    draft_quantization: Optional[str] = DRAFT_QUANTIZATION,
    draft_runtime: Optional[str] = DRAFT_RUNTIME,
    system: Optional[str] = SYSTEM,
    stats_db: Optional[Path] = STATS_DB,
    record_prompt: bool = RECORD_PROMPT,
    debug: bool = DEBUG,
) -> None:
    from specgen.serve.server import Server, check_options, is_loopback  # starlette, uvicorn

    check_options(port, max_queue)
    prof = profile_with_options(
        profile, max_new_tokens, temperature, top_p, top_k, k, no_adaptive, method, system,
        device=device, target_quantization=target_quantization,
        draft_quantization=draft_quantization, draft_runtime=draft_runtime,
    )
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    session = load_session(prof)
    server = Server(session, host, port, api_key, max_queue, stats_db, record_prompt)
    server.bind()
    if not is_loopback(host) and not api_key:
        err.print(f"[yellow]warning:[/] listening on {host} without an API key: anyone who can "
                  "reach this port can use the models. Pass --api-key (or SPECGEN_API_KEY).",
                  highlight=False)
    err.print(f"Serving [bold]{prof.name}[/] on {server.url} (OpenAI: {server.url}/v1, Ollama: "
              f"{server.url}). Ctrl-C stops.", highlight=False, soft_wrap=True)
    server.run()
    err.print("Stopped.", style="dim")
