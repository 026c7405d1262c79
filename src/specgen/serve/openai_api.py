"""The OpenAI-compatible API: /v1/models, /v1/completions and /v1/chat/completions, whole or
streamed as server-sent events ending in `data: [DONE]`. Responses carry OpenAI's fields
and one more, `specgen`: the sources of the tokens (per chunk) and, when the answer is
done, acceptance, tau and the speedup estimate. Errors have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specgen.serve.common import Api, Events, ServedModel, endpoints, read_ask
from specgen.serve.validate import (EXACT, MAX_INT, Ask, Fields, RequestError, message_fields,
                                    model_matches, seed_value, temperature_value, text_ok)
from specgen.serve.worker import Failed, Finished, Piece

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error", 503: "server_error", 500: "server_error"}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   retry_after: int | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


# --- parsing ------------------------------------------------------------------------------

def _common(body: dict, served: ServedModel, endpoint: str) -> tuple[Fields, Ask]:
    f = Fields(body)
    model = f.string("model", required=True)
    if not model_matches(model, served.name):
        raise RequestError(f"The model {model!r} does not exist here: this server serves "
                           f"{served.name!r} (see GET /v1/models).", status=404, param="model",
                           code="model_not_found")
    if f.get("n") is not None and f.integer("n", 1, MAX_INT) != 1:
        raise RequestError("n must be 1: specgen makes one answer per request.", param="n")
    for key in ("presence_penalty", "frequency_penalty"):
        f.number(key, -2.0, 2.0)
        f.refuse(key, (None, 0), EXACT)
    f.refuse("logit_bias", (None, {}), EXACT)
    top_k = f.integer("top_k", -1, MAX_INT)  # an extension vLLM has too; -1 is off there
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object.", param="stream_options")
    include_usage = Fields(options or {}, "stream_options.").boolean("include_usage") or False
    budget = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    ask = Ask(
        endpoint=endpoint, model=model,
        max_tokens=f.integer(budget, 1, MAX_INT), budget_param=budget,
        temperature=temperature_value(f, "temperature"),
        top_p=f.number("top_p", 0.0, 1.0, lo_open=True),
        top_k=None if top_k is None else max(top_k, 0),
        seed=seed_value(f, "seed"),
        stop=f.stop("stop"),
        stream=f.boolean("stream") or False,
        include_usage=include_usage,
    )
    return f, ask


def parse_chat(body: dict, served: ServedModel) -> Ask:
    f, ask = _common(body, served, "/v1/chat/completions")
    f.refuse("logprobs", (None, False), "specgen does not return log-probabilities.")
    f.refuse("top_logprobs", (None, 0), "specgen does not return log-probabilities.")
    f.refuse("tools", (None, []), "specgen does not call tools.")
    f.refuse("functions", (None, []), "specgen does not call functions.")
    f.refuse("response_format", (None, {"type": "text"}),
             "specgen does not constrain the output to a format.")
    f.refuse("audio", (None,), "specgen makes text only.")
    f.refuse("modalities", (None, ["text"]), "specgen makes text only.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty array of {role, content} objects.",
                           param="messages")
    ask.messages = [_message(m, i) for i, m in enumerate(messages)]
    ask.template_required = True
    return ask


def _message(message: object, i: int) -> dict[str, str]:
    where, _, role = message_fields(message, i, tuple(ROLES))
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content[{j}] must be a text part "
                                   '({"type": "text", "text": "..."}); specgen reads text only.',
                                   param=f"{where}.content")
            texts.append(text_ok(part["text"], f"{where}.content"))
        content = "".join(texts)
    elif not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or an array of text parts.",
                           param=f"{where}.content")
    return {"role": ROLES[role], "content": text_ok(content, f"{where}.content")}


def parse_completion(body: dict, served: ServedModel) -> Ask:
    f, ask = _common(body, served, "/v1/completions")
    f.refuse("echo", (None, False), "specgen does not echo the prompt.")
    f.refuse("suffix", (None, ""), "specgen does not fill in the middle.")
    f.refuse("logprobs", (None,), "specgen does not return log-probabilities.")
    if f.get("best_of") is not None and f.integer("best_of", 1, MAX_INT) != 1:
        raise RequestError("best_of must be 1: specgen makes one answer per request.", param="best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty: give some text.", param="prompt")
        ask.text = text_ok(prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ask.token_ids = prompt
    else:
        raise RequestError("prompt must be a string or an array of token ids (one prompt per "
                           "request).", param="prompt")
    return ask


# --- responses ----------------------------------------------------------------------------

class OpenAI(Api):
    media_type = "text/event-stream"
    busy_status = 429  # OpenAI clients retry a 429 after Retry-After

    def __init__(self, chat: bool, model: str, include_usage: bool = False) -> None:
        self.chat, self.model, self.include_usage = chat, model, include_usage
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def error(self, status, message, param=None, code=None, retry_after=None) -> Response:
        return error_response(status, message, param, code, retry_after)

    def _head(self, chunk: bool = False) -> dict:
        kind = "chat.completion.chunk" if self.chat and chunk else self.object
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta = {} if text is None else {"content": text}
        if first:
            delta = {"role": "assistant", "content": ""}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    @staticmethod
    def _usage(finished: Finished) -> dict:
        cached = finished.stats.prompt_tokens - finished.stats.prefill_tokens
        return {**finished.usage, "prompt_tokens_details": {"cached_tokens": cached}}

    def whole(self, text: str, finished: Finished) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finished.reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finished.reason}
        return {**self._head(), "choices": [choice], "usage": self._usage(finished),
                "specgen": finished.extension()}

    def _chunk(self, choice: dict | None, **extra) -> bytes:
        body = {**self._head(chunk=True), "choices": [] if choice is None else [choice], **extra}
        if self.include_usage and "usage" not in body:
            body["usage"] = None
        return sse(body)

    async def chunks(self, events: Events):
        if self.chat:
            yield self._chunk(self._choice(None, None, first=True))
        async for event in events.merged():
            if isinstance(event, Piece):
                if event.text:
                    yield self._chunk(self._choice(event.text, None),
                                      specgen={"sources": event.sources})
            elif isinstance(event, Finished):
                yield self._chunk(self._choice(None if self.chat else "", event.reason),
                                  specgen=event.extension())
                if self.include_usage:
                    yield self._chunk(None, usage=self._usage(event))
                yield sse("[DONE]")
                return
            elif isinstance(event, Failed):
                yield sse({"error": {"message": event.message, "type": ERROR_TYPES.get(
                    event.status, "server_error"), "param": event.param, "code": None}})
                yield sse("[DONE]")
                return


# --- handlers -----------------------------------------------------------------------------

async def models(request: Request) -> Response:
    served: ServedModel = request.app.state.served
    return JSONResponse({"object": "list", "data": [_model(served)]})


async def model(request: Request) -> Response:
    served: ServedModel = request.app.state.served
    name = request.path_params["model"]
    if not model_matches(name, served.name):
        return error_response(404, f"The model {name!r} does not exist here: this server serves "
                              f"{served.name!r}.", param="model", code="model_not_found")
    return JSONResponse(_model(served))


def _model(served: ServedModel) -> dict:
    return {"id": served.name, "object": "model", "created": int(served.created),
            "owned_by": "specgen", "specgen": {"target": served.target, "draft": served.draft,
                                               "method": served.method,
                                               "context_length": served.context_length}}


async def _generate(request: Request, chat: bool) -> Response:
    served, ask = await read_ask(request, parse_chat if chat else parse_completion)
    api = OpenAI(chat, served.name, ask.include_usage)
    return await api.generate(request, request.app.state.worker, ask)


completions, chat_completions = endpoints(_generate)  # POST /v1/completions, /v1/chat/completions
