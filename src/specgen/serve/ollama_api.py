"""The Ollama-compatible API: /api/generate and /api/chat (streamed as NDJSON by default, as
Ollama does, or whole with "stream": false), /api/tags, /api/ps, /api/show and /api/version,
with Ollama's option names (num_predict, temperature, top_p, top_k, seed, stop). The last
object of an answer carries Ollama's counts and durations (nanoseconds) and a `specgen`
object; errors are {"error": "..."} (mid-stream: one such line)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specgen import __version__
from specgen.serve.common import (Api, Events, ServedModel, endpoints, iso_time, read_ask,
                                  read_json)
from specgen.serve.validate import (EXACT, MAX_INT, Ask, Fields, RequestError, message_fields,
                                    model_matches, seed_value, temperature_value)
from specgen.serve.worker import Failed, Finished, Piece

ROLES = ("system", "user", "assistant")
# Options that would change the distribution, with the value that leaves it alone.
NEUTRAL_OPTIONS = {"repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0,
                   "min_p": 0, "typical_p": 1, "tfs_z": 1, "mirostat": 0}
NS = 1_000_000_000


def error_response(status: int, message: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def ndjson(obj: dict) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


# --- parsing ------------------------------------------------------------------------------

def _common(body: dict, served: ServedModel, endpoint: str) -> tuple[Fields, Ask]:
    f = Fields(body)
    model = f.string("model", required=True)
    if not model_matches(model, served.name):
        raise RequestError(f"model {model!r} not found; this server serves {served.name!r} "
                           "(see GET /api/tags)", status=404, param="model")
    f.refuse("format", (None, ""), "specgen does not constrain the output to a format.")
    f.refuse("think", (None, False), "the served model does not think aloud.")
    f.refuse("tools", (None, []), "specgen does not call tools.")
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("options must be an object.", param="options")
    o = Fields(options or {}, "options.")
    for key, neutral in NEUTRAL_OPTIONS.items():
        o.number(key, -1e9, 1e9)
        o.refuse(key, (None, neutral), EXACT)
    o.integer("num_ctx", 1, MAX_INT)  # the model's context is fixed; checked, not applied
    predict = o.integer("num_predict", -2, MAX_INT)
    if predict == 0:
        raise RequestError("options.num_predict must be at least 1 (or -1: until the context "
                           "is full).", param="options.num_predict")
    top_k = o.integer("top_k", 0, MAX_INT)
    ask = Ask(
        endpoint=endpoint, model=model,
        max_tokens=predict if predict is not None and predict > 0 else None,
        fill_context=predict is not None and predict < 0,
        budget_param="options.num_predict",
        temperature=temperature_value(o, "temperature"),
        top_p=o.number("top_p", 0.0, 1.0, lo_open=True),
        top_k=top_k,
        seed=seed_value(o, "seed", negative_is_random=True),
        stop=o.stop("stop"),
        stream=f.boolean("stream") is not False,  # Ollama streams unless told not to
    )
    return f, ask


def parse_generate(body: dict, served: ServedModel) -> Ask:
    f, ask = _common(body, served, "/api/generate")
    f.refuse("suffix", (None, ""), "specgen does not fill in the middle.")
    f.refuse("images", (None, []), "specgen reads text only.")
    f.refuse("context", (None, []), "send the conversation to /api/chat instead.")
    f.refuse("template", (None, ""), "specgen uses the tokenizer's own chat template.")
    prompt = f.string("prompt") or ""
    system = f.string("system")
    if f.boolean("raw"):
        ask.text = prompt
    else:
        messages = [{"role": "system", "content": system}] if system else []
        ask.messages = messages + [{"role": "user", "content": prompt}]
    return ask


def parse_chat(body: dict, served: ServedModel) -> Ask:
    f, ask = _common(body, served, "/api/chat")
    messages = body.get("messages")
    if messages is None:
        messages = []
    if not isinstance(messages, list):
        raise RequestError("messages must be an array of {role, content} objects.", param="messages")
    ask.messages = [_message(m, i) for i, m in enumerate(messages)]
    ask.template_required = True
    return ask


def _message(message: object, i: int) -> dict[str, str]:
    _, f, role = message_fields(message, i, ROLES)
    f.refuse("images", (None, []), "specgen reads text only.")
    f.refuse("tool_calls", (None, []), "specgen does not call tools.")
    return {"role": role, "content": f.string("content") or ""}


# --- responses ----------------------------------------------------------------------------

class Ollama(Api):
    media_type = "application/x-ndjson"
    busy_status = 503  # as Ollama answers when its queue is full

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model

    def error(self, status, message, param=None, code=None, retry_after=None) -> Response:
        return error_response(status, message, retry_after)

    def part(self, text: str, done: bool) -> dict:
        body: dict = {"model": self.model, "created_at": iso_time()}
        if self.chat:  # ollama's ChatResponse needs `message` on every line, the last too
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = done
        return body

    def _final(self, text: str, finished: Finished) -> dict:
        s = finished.stats
        return {**self.part(text, True), "done_reason": finished.reason,
                "total_duration": int((finished.queue_seconds + s.total_seconds) * NS),
                "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens,
                "prompt_eval_duration": int(s.prefill_seconds * NS),
                "eval_count": s.new_tokens,
                "eval_duration": int(max(s.total_seconds - s.prefill_seconds, 0.0) * NS),
                "specgen": finished.extension()}

    def whole(self, text: str, finished: Finished) -> dict:
        return self._final(text, finished)

    async def chunks(self, events: Events):
        async for event in events.merged():
            if isinstance(event, Piece):
                if event.text:
                    yield ndjson({**self.part(event.text, False),
                                  "specgen": {"sources": event.sources}})
            elif isinstance(event, Finished):
                yield ndjson(self._final("", event))
                return
            elif isinstance(event, Failed):
                yield ndjson({"error": event.message})
                return


# --- handlers -----------------------------------------------------------------------------

async def _generate(request: Request, chat: bool) -> Response:
    served, ask = await read_ask(request, parse_chat if chat else parse_generate)
    api = Ollama(chat, served.name)
    if chat:
        empty = not ask.messages
    else:
        empty = (ask.text if ask.text is not None else ask.messages[-1]["content"]) == ""
    if empty:  # Ollama's way to load a model: an empty prompt answers at once, done_reason "load"
        done = {**api.part("", True), "done_reason": "load"}
        return JSONResponse(done) if not ask.stream else Response(ndjson(done), media_type=api.media_type)
    return await api.generate(request, request.app.state.worker, ask)


generate, chat = endpoints(_generate)  # POST /api/generate, POST /api/chat


def _details(served: ServedModel) -> dict:
    return {"parent_model": "", "format": served.format, "family": served.family,
            "families": [served.family] if served.family else None,
            "parameter_size": served.parameter_size, "quantization_level": served.quantization}


def _listing(served: ServedModel) -> dict:
    return {"name": served.name, "model": served.name, "modified_at": iso_time(served.created),
            "size": served.size, "digest": served.digest, "details": _details(served),
            "specgen": {"target": served.target, "draft": served.draft, "method": served.method}}


async def tags(request: Request) -> Response:
    return JSONResponse({"models": [_listing(request.app.state.served)]})


async def ps(request: Request) -> Response:
    served: ServedModel = request.app.state.served
    worker = request.app.state.worker
    device = worker.session.pair.device
    return JSONResponse({"models": [{**_listing(served), "expires_at": "9999-12-31T23:59:59Z",
                                     "size_vram": served.size if device.startswith("cuda") else 0,
                                     "context_length": served.context_length}]})


async def show(request: Request) -> Response:
    served: ServedModel = request.app.state.served
    body = await read_json(request)
    name = Fields(body).string("model") or Fields(body).string("name")
    if name is None:
        return error_response(400, "model is required")
    if not model_matches(name, served.name):
        return error_response(404, f"model {name!r} not found; this server serves {served.name!r}")
    family = served.family or "model"
    return JSONResponse({
        "modelfile": "", "parameters": "", "template": served.template,
        "details": _details(served), "modified_at": iso_time(served.created),
        "model_info": {"general.architecture": family, "general.parameter_count": served.parameters,
                       f"{family}.context_length": served.context_length},
        "capabilities": ["completion"],
    })


async def version(request: Request) -> Response:
    return JSONResponse({"version": __version__})
