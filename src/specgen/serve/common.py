"""What both APIs share: the served model's description, their two generating endpoints,
reading a request body, and waiting for a job's events while watching for the client to go
away."""

from __future__ import annotations

import asyncio
import hashlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specgen.serve.validate import MAX_BODY_BYTES, Ask, RequestError, parse_body
from specgen.serve.worker import Failed, Finished, Job, Piece, Rejected, Worker

if TYPE_CHECKING:
    from specgen.app.session import Session


Endpoint = Callable[[Request], Awaitable[Response]]


def endpoints(generate: Callable[[Request, bool], Awaitable[Response]]) -> tuple[Endpoint, Endpoint]:
    """An API's two generating endpoints, plain text and chat, both served by its
    `generate(request, chat)`."""
    async def plain(request: Request) -> Response:
        return await generate(request, False)

    async def chat(request: Request) -> Response:
        return await generate(request, True)

    return plain, chat


@dataclass(frozen=True)
class ServedModel:
    """The loaded profile as the model listings describe it."""

    name: str  # the profile's name: what clients pass as `model`
    target: str
    draft: str | None
    method: str
    created: float
    size: int  # bytes of the loaded weights
    parameters: int  # the target's
    family: str
    format: str  # "gguf" when the target came from a GGUF file
    quantization: str
    context_length: int
    template: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.name}|{self.target}|{self.draft}|{self.method}".encode()).hexdigest()

    @property
    def parameter_size(self) -> str:
        n = self.parameters
        return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n}"

    @classmethod
    def of(cls, session: Session, context_length: int) -> ServedModel:
        pair, profile = session.pair, session.profile
        models = [m for m in (pair.target, pair.draft) if hasattr(m, "parameters")]
        size = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
        gguf = bool(profile.target.gguf_file) or profile.target.model.endswith(".gguf")
        return cls(
            name=profile.name, target=pair.target_name, draft=pair.draft_name,
            method=profile.speculation.method, created=time.time(), size=size,
            parameters=sum(p.numel() for p in pair.target.parameters()),
            family=getattr(pair.target.config, "model_type", "") or "",
            format="gguf" if gguf else "safetensors", quantization=pair.quantization,
            context_length=context_length,
            template=getattr(session.tokenizer, "chat_template", None) or "",
        )


def iso_time(t: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes its times."""
    stamp = datetime.fromtimestamp(time.time() if t is None else t, tz=timezone.utc)
    return stamp.isoformat().replace("+00:00", "Z")


async def read_json(request: Request) -> dict:
    """The body as a JSON object; 413 past MAX_BODY_BYTES, 400 for anything not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"The request body is larger than {MAX_BODY_BYTES} bytes.", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"The request body is larger than {MAX_BODY_BYTES} bytes.", status=413)
        chunks.append(chunk)
    return parse_body(b"".join(chunks))


async def read_ask(request: Request, parse) -> tuple[ServedModel, Ask]:
    """The served model, and the request's body read by `parse(body, served)` (an API's
    parser). A RequestError (the body or a field is wrong) goes up to the app, which answers
    it in the shape of the path's API (app.py)."""
    served: ServedModel = request.app.state.served
    return served, parse(await read_json(request), served)


class Events:
    """A job's events, one at a time; None when the client went away (see `watch`)."""

    def __init__(self, job: Job, worker: Worker) -> None:
        self.job, self.worker = job, worker

    async def next(self):
        return await self.job.events.get()

    def ready(self) -> list:
        """The events already delivered."""
        out = []
        while not self.job.events.empty():
            out.append(self.job.events.get_nowait())
        return out

    async def merged(self):
        """The events as they come, those delivered together merged (see `merged`); the
        iteration ends when the client is gone."""
        while True:
            for event in merged([await self.next()] + self.ready()):
                if event is None:
                    return
                yield event

    def close(self) -> None:
        """The client is done or gone: stop the job if it still waits or runs."""
        self.worker.cancel(self.job)

    def gone(self) -> None:
        self.close()
        self.job.events.put_nowait(None)


async def watch(request: Request, events: Events) -> None:
    """Until cancelled: when the client disconnects, cancel its job and wake its handler.
    (Inside a streaming body the web framework does this watching itself.)"""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    events.gone()


class Api(ABC):
    """How one API frames a generation: its error body, its streaming format, and its
    finished answer. Subclasses fill in the shapes; `generate` is the flow both share."""

    media_type = "application/json"
    busy_status = 503  # a full queue

    @abstractmethod
    def error(self, status: int, message: str, param: str | None = None,
              code: str | None = None, retry_after: int | None = None) -> Response:
        """The API's error response."""

    @abstractmethod
    def whole(self, text: str, finished: Finished) -> dict:
        """The API's body for a finished, non-streamed answer."""

    @abstractmethod
    def chunks(self, events: Events) -> AsyncIterator[bytes]:
        """The streamed body: encoded chunks, ending with the API's own end marker."""

    def failed(self, failure: Failed) -> Response:
        retry = 5 if failure.status == 503 else None
        return self.error(failure.status, failure.message, failure.param, retry_after=retry)

    async def generate(self, request: Request, worker: Worker, ask: Ask) -> Response:
        job = Job(ask)
        try:
            worker.submit(job)
        except Rejected as r:
            worker.metrics.count_rejected(r.reason)
            if r.reason == "queue_full":
                return self.error(self.busy_status, f"The queue is full ({worker.max_queue} "
                                  "requests waiting); retry later.", code="queue_full",
                                  retry_after=r.retry_after)
            return self.error(503, "The server is shutting down.", retry_after=r.retry_after)
        events = Events(job, worker)
        watcher = asyncio.ensure_future(watch(request, events))
        try:
            first = await events.next()
            if first is None:  # the client left while waiting for its turn
                return Response(status_code=499)
            if isinstance(first, Failed):
                return self.failed(first)
            if ask.stream:
                watcher.cancel()  # the streaming response listens for the disconnect itself
                return StreamingResponse(self._streamed(events), media_type=self.media_type,
                                         headers={"Cache-Control": "no-cache"})
            pieces = []
            while True:
                event = await events.next()
                if event is None:
                    return Response(status_code=499)
                if isinstance(event, Piece):
                    pieces.append(event.text)
                elif isinstance(event, Finished):
                    return JSONResponse(self.whole("".join(pieces), event))
                else:
                    return self.failed(event)
        finally:
            watcher.cancel()

    async def _streamed(self, events: Events):
        try:
            async for chunk in self.chunks(events):
                yield chunk
        finally:
            events.close()


def merged(events: list):
    """Consecutive pieces joined into one (text and sources), other events kept as they are:
    a client slower than the generator gets fewer, larger chunks."""
    out: list = []
    for event in events:
        if isinstance(event, Piece) and out and isinstance(out[-1], Piece):
            out[-1] = Piece(out[-1].text + event.text, out[-1].sources + event.sources)
        else:
            out.append(event)
    return out
