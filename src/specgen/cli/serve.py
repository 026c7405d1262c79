"""`specgen serve`: parse and check the options; specgen.commands.serve serves."""

from __future__ import annotations

from typing import Optional

import typer

from specgen.cli.options import (MODELS, load_session, pause_gc, prefetch, profile_with_options,
                                 shared)

HELP = """Serve the profile over HTTP: OpenAI- and Ollama-compatible APIs.

Exact speculative decoding behind the APIs, one request at a time, in arrival order.

OpenAI: GET /v1/models, POST /v1/completions, POST /v1/chat/completions. Ollama: POST
/api/generate, POST /api/chat, GET /api/tags, GET /api/version. Also GET /health and GET
/metrics (Prometheus). Every answer carries a [bold]specgen[/] object with its token
sources, acceptance and tau, and is recorded in the run history (`specgen stats`).

[bold]Examples[/]

  specgen serve

  specgen serve --profile llama3-8b --port 8080 --max-queue 4

  SPECGEN_API_KEY=secret specgen serve --host 0.0.0.0
"""


@shared("profile", "max_new_tokens", "temperature", "top_p", "top_k", "k", "no_adaptive",
        "no_tree", "method", *MODELS, "system", "stats_db", "record_prompt", "debug")
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (127.0.0.1: "
                             "this machine only)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="SPECGEN_API_KEY",
        help="Answer only requests with 'Authorization: Bearer KEY' (else 401)."),
    max_queue: int = typer.Option(16, "--max-queue", help="Requests that may wait behind the "
                                  "one generating; more are refused (429 / 503, Retry-After)."),
    **options,
) -> None:
    from specgen.commands import serve as flow

    request = flow.ServeRequest(host, port, api_key, max_queue, options["stats_db"],
                                options["record_prompt"])
    request.check()
    prof = profile_with_options(options)
    prefetch(prof)  # the weights are read from disk while torch is imported
    pause_gc()  # until load_session has loaded the models
    flow.run(request, prof, load_session)
