"""Request bodies in, a validated `Ask` out, or a `RequestError` that says what was wrong.

Both APIs share these checks: the body is a JSON object (no NaN or Infinity, no number too
large for a float, valid UTF-8, no lone surrogates in text), each field has its type and
range, and fields that would change what the model says in a way specgen cannot honour
(penalties, logit biases, several choices, tools, images) are refused by name rather than
ignored, because the output must stay exactly the target's. Fields that change nothing
(a user id, metadata, keep_alive) are ignored. No torch here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from specgen.choices import listing

# The largest request body read; a bigger one is refused with 413 before it is parsed.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_STOP = 16  # stop strings per request
MAX_SEED = 2**63 - 2  # the engine seeds the draft with seed + 1
MAX_INT = 2**31 - 1  # for counts such as top_k
# Below this a temperature means greedy (as vLLM does): dividing logits by a far smaller
# number overflows float32.
MIN_TEMPERATURE = 1e-5


class RequestError(Exception):
    """A request the server refuses: an HTTP status, a message and the field at fault."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


@dataclass
class Ask:
    """One generation, as the worker runs it. Exactly one of `messages` (rendered with the
    chat template), `text` (plain continuation) and `token_ids` is set. `None` in a sampling
    field means the profile's value; `max_tokens` None means the profile's max_new_tokens,
    cut to what the context leaves."""

    endpoint: str
    model: str
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    max_tokens: int | None = None
    fill_context: bool = False  # Ollama num_predict -1 / -2: until the context is full
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False  # OpenAI stream_options.include_usage
    system_default: bool = True  # add the profile's system prompt when none is given
    template_required: bool = False  # chat endpoints: refuse a profile without a template
    budget_param: str = "max_tokens"  # the field that asked for max_tokens, for messages

    def record_text(self) -> str:
        """What --record-prompt stores for this request."""
        if self.messages is not None:
            return json.dumps(self.messages, ensure_ascii=False)
        if self.text is not None:
            return self.text
        return json.dumps(self.token_ids)


def _reject_constant(name: str) -> Any:
    raise RequestError(f"The body holds {name}, which is not a number JSON allows; send a "
                       "finite number.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(f"The number {text[:40]} is too large; send a finite number.")
    return value


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a RequestError (400) saying why not."""
    if not raw.strip():
        raise RequestError("The request body is empty: send a JSON object.")
    try:
        data = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except RequestError:
        raise
    except UnicodeDecodeError:
        raise RequestError("The request body is not valid UTF-8 JSON.") from None
    except RecursionError:
        raise RequestError("The request body nests too deeply.") from None
    except ValueError as e:  # JSONDecodeError, and integers too long to read
        raise RequestError(f"The request body is not valid JSON: {e}.") from None
    if not isinstance(data, dict):
        raise RequestError(f"The request body must be a JSON object, got {_kind(data)}.")
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def text_ok(value: str, name: str) -> str:
    """A string that can be encoded as UTF-8 (JSON may carry lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{name} holds an unpaired surrogate (\\ud800-\\udfff); send "
                           "valid Unicode text.", param=name) from None
    return value


class Fields:
    """Typed reads of one JSON object's fields; `prefix` names nested objects in messages."""

    def __init__(self, data: dict[str, Any], prefix: str = "") -> None:
        self.data, self.prefix = data, prefix

    def _name(self, key: str) -> str:
        return self.prefix + key

    def _wrong(self, key: str, want: str, value: Any) -> RequestError:
        return RequestError(f"{self._name(key)} must be {want}, got {_kind(value)}.",
                            param=self._name(key))

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def string(self, key: str, required: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise RequestError(f"{self._name(key)} is required.", param=self._name(key))
            return None
        if not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        return text_ok(value, self._name(key))

    def boolean(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise self._wrong(key, "true or false", value)

    def integer(self, key: str, lo: int, hi: int) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong(key, "an integer", value)
        if not lo <= value <= hi:
            raise RequestError(f"{self._name(key)} must be from {lo} to {hi}, got {value}.",
                               param=self._name(key))
        return value

    def number(self, key: str, lo: float, hi: float = math.inf, lo_open: bool = False) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._wrong(key, "a number", value)
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            value = math.inf
        if not math.isfinite(value):
            raise RequestError(f"{self._name(key)} must be a finite number.", param=self._name(key))
        if value < lo or (lo_open and value == lo) or value > hi:
            low = f"> {lo:g}" if lo_open else f">= {lo:g}"
            high = "" if hi == math.inf else f" and <= {hi:g}"
            raise RequestError(f"{self._name(key)} must be {low}{high}, got {value:g}.",
                               param=self._name(key))
        return value

    def stop(self, key: str) -> list[str]:
        """A stop string or a list of them (empty strings refused: they would match at once)."""
        value = self.data.get(key)
        if value is None:
            return []
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise self._wrong(key, "a string or an array of strings", value)
        if len(items) > MAX_STOP:
            raise RequestError(f"{self._name(key)} holds {len(items)} strings; at most "
                               f"{MAX_STOP} are allowed.", param=self._name(key))
        if any(not s for s in items):
            raise RequestError(f"{self._name(key)} holds an empty string; remove it.",
                               param=self._name(key))
        return [text_ok(s, self._name(key)) for s in items]

    def refuse(self, key: str, neutral: tuple[Any, ...], why: str) -> None:
        """Refuse a field that specgen cannot honour unless it holds a neutral value."""
        if key in self.data and not any(_same(self.data[key], n) for n in neutral):
            raise RequestError(f"{self._name(key)} is not supported: {why}", param=self._name(key))


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(neutral, (int, float)) and not isinstance(neutral, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == neutral
    return value == neutral and type(value) is type(neutral)


EXACT = ("specgen samples exactly the target's own distribution, and this would change it. "
         "Leave it out.")


def seed_value(fields: Fields, key: str, negative_is_random: bool = False) -> int | None:
    value = fields.integer(key, -(2**63) if negative_is_random else 0, MAX_SEED)
    return None if value is not None and value < 0 else value


def temperature_value(fields: Fields, key: str) -> float | None:
    value = fields.number(key, 0.0)
    return 0.0 if value is not None and value < MIN_TEMPERATURE else value


def message_fields(message: object, i: int, roles: tuple[str, ...]) -> tuple[str, Fields, str]:
    """messages[i] of a chat request: its name for messages, its fields, and its role, one of
    `roles` (both APIs refuse tool messages: specgen calls no tools)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with a role and a content.", param=where)
    f = Fields(message, f"{where}.")
    role = f.string("role", required=True)
    if role not in roles:
        raise RequestError(f"{where}.role = {role!r} is not supported; use {listing(roles)} "
                           "(specgen does not call tools).", param=f"{where}.role")
    return where, f, role


def model_matches(asked: str, served: str) -> bool:
    """The served profile's name, with or without Ollama's `:latest` tag."""
    return asked == served or asked == f"{served}:latest"
