"""`specgen serve`: the loaded profile behind the HTTP APIs (serve/) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specgen.app.render import err
from specgen.profiles import Profile


@dataclass(frozen=True)
class ServeRequest:
    """What cli/serve.py parsed: where to listen, who may ask, how many may wait."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 16
    stats_db: Path | None = None
    record_prompt: bool = False

    def check(self) -> None:
        from specgen.serve.server import check_options  # starlette, uvicorn

        check_options(self.port, self.max_queue)


def run(request: ServeRequest, prof: Profile, load_session: Callable) -> None:
    """Load the pair, bind (a port in use fails here, before the banner), warn about a wide
    address without a key, serve until stopped."""
    from specgen.serve.server import Server, is_loopback

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    session = load_session(prof)
    server = Server(session, request.host, request.port, request.api_key, request.max_queue,
                    request.stats_db, request.record_prompt)
    server.bind()
    if not is_loopback(request.host) and not request.api_key:
        err.print(f"[yellow]warning:[/] listening on {request.host} without an API key: anyone "
                  "who can reach this port can use the models. Pass --api-key (or "
                  "SPECGEN_API_KEY).", highlight=False)
    err.print(f"Serving [bold]{prof.name}[/] on {server.url} (OpenAI: {server.url}/v1, Ollama: "
              f"{server.url}). Ctrl-C stops.", highlight=False, soft_wrap=True)
    server.run()
    err.print("Stopped.", style="dim")
