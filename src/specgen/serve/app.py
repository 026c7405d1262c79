"""The ASGI application: the routes of both APIs, /health and /metrics, the API-key check,
request counting, and errors in the shape of the API the path belongs to (Ollama's under
/api/, OpenAI's elsewhere), so that a client library reads every refusal as its own."""

from __future__ import annotations

import hmac
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from specgen.serve import ollama_api, openai_api
from specgen.serve.common import ServedModel
from specgen.serve.metrics import CONTENT_TYPE
from specgen.serve.validate import RequestError
from specgen.serve.worker import Worker

log = logging.getLogger("specgen.serve")

OPEN_PATHS = ("/", "/health")  # answered without an API key (they reveal nothing)


def _is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def error_for(path: str, status: int, message: str, code: str | None = None,
              param: str | None = None) -> Response:
    if _is_ollama(path):
        return ollama_api.error_response(status, message)
    return openai_api.error_response(status, message, param, code)


async def root(request: Request) -> Response:
    return PlainTextResponse("specgen is running: OpenAI API under /v1, Ollama API under /api.\n")


async def health(request: Request) -> Response:
    worker: Worker = request.app.state.worker
    if worker.stopping:
        return JSONResponse({"status": "stopping"}, status_code=503)
    return JSONResponse({"status": "ok", "model": request.app.state.served.name,
                         "queue_length": worker.queue_length, "running": worker.busy})


async def metrics(request: Request) -> Response:
    worker: Worker = request.app.state.worker
    text = worker.metrics.render(worker.queue_length, worker.busy)
    return PlainTextResponse(text, media_type=CONTENT_TYPE)


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_for(request.url.path, 404, f"No route {request.url.path!r}: see the API "
                     "reference (GET /v1/models, POST /v1/chat/completions, POST /api/chat, ...).")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_for(request.url.path, 405, f"{request.method} is not allowed on {request.url.path}.")


async def _request_error(request: Request, exc: RequestError) -> Response:
    """A body or field an endpoint refused (serve/validate.py)."""
    return error_for(request.url.path, exc.status, exc.message, exc.code, exc.param)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return error_for(request.url.path, exc.status_code, str(exc.detail))


async def _internal(request: Request, exc: Exception) -> Response:
    log.exception("request failed", exc_info=exc)
    return error_for(request.url.path, 500, f"Internal error: {type(exc).__name__}.")


ROUTES = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/health", health, methods=["GET", "HEAD"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/v1/models", openai_api.models, methods=["GET"]),
    Route("/v1/models/{model:path}", openai_api.model, methods=["GET"]),
    Route("/v1/completions", openai_api.completions, methods=["POST"]),
    Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
    Route("/api/generate", ollama_api.generate, methods=["POST"]),
    Route("/api/chat", ollama_api.chat, methods=["POST"]),
    Route("/api/tags", ollama_api.tags, methods=["GET", "HEAD"]),
    Route("/api/ps", ollama_api.ps, methods=["GET"]),
    Route("/api/show", ollama_api.show, methods=["POST"]),
    Route("/api/version", ollama_api.version, methods=["GET", "HEAD"]),
]
KNOWN_PATHS = {route.path for route in ROUTES if "{" not in route.path}


class Guard:
    """ASGI middleware: counts every response by endpoint and status, and, with an API key,
    answers 401 to a request without `Authorization: Bearer KEY` (compared in constant time)."""

    def __init__(self, app, worker: Worker, api_key: str | None) -> None:
        self.app, self.worker = app, worker
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in KNOWN_PATHS else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                self.worker.metrics.count_request(endpoint, message["status"])
            await send(message)

        if self.expected is not None and path not in OPEN_PATHS and not self._authorized(scope):
            response = error_for(path, 401, "A valid API key is needed: send the header "
                                 "'Authorization: Bearer KEY' with the server's --api-key.",
                                 code="invalid_api_key")
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, counted)
            return
        await self.app(scope, receive, counted)

    def _authorized(self, scope) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest takes as long for any token of a given length, right or wrong
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)


def create_app(worker: Worker, served: ServedModel, api_key: str | None = None) -> Starlette:
    app = Starlette(routes=ROUTES, exception_handlers={
        404: _not_found, 405: _not_allowed, HTTPException: _http_error,
        RequestError: _request_error, Exception: _internal})
    app.state.worker = worker
    app.state.served = served
    app.add_middleware(Guard, worker=worker, api_key=api_key)
    return app
