"""The one generator behind the server: jobs run strictly one at a time, in arrival order, on
a thread of their own, so the event loop that speaks HTTP is never blocked by generation.

A job's events go back to its request through the event loop's thread-safe call: `Started`
(the prompt was accepted), `Piece`s of text with the sources of their tokens, then
`Finished` or `Failed`. A job that is cancelled (its client went away, or the server is
stopping) is dropped from the queue, or, while it runs, stops after the token being
emitted: the engine's generator is closed between steps, so its caches stay consistent and
the next job starts at once. Each generation is recorded in the run history (command
`serve`) and folded into the metrics before its `Finished` event is sent."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from specgen.app.render import IncrementalDecoder
from specgen.app.session import Session, encode_messages
from specgen.app.store import Recorder
from specgen.core.stats import Stats
from specgen.errors import SpecgenError
from specgen.loading.load import context_limit
from specgen.serve.metrics import Metrics
from specgen.serve.validate import Ask, RequestError

log = logging.getLogger("specgen.serve")


@dataclass
class Started:
    prompt_tokens: int


@dataclass
class Piece:
    text: str
    sources: list[str]


@dataclass
class Finished:
    reason: str  # "stop" | "length"
    stats: Stats
    sources: Counter[str]
    queue_seconds: float

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.stats.prompt_tokens,
                "completion_tokens": self.stats.new_tokens,
                "total_tokens": self.stats.prompt_tokens + self.stats.new_tokens}

    def extension(self) -> dict:
        """The `specgen` object of a finished response: where the tokens came from and what
        speculation did."""
        s = self.stats
        return {
            "tokens": {source: self.sources[source] for source in ("accepted", "resampled", "bonus")},
            "proposed": s.proposed,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 6),
            "tau": round(s.tau, 6),
            "speedup_estimate": round(s.speedup_estimate, 6),
            "k_max": s.k_max,
            "adaptive": s.adaptive,
            "target_passes": s.target_passes,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.prompt_tokens - s.prefill_tokens,
            "queue_seconds": round(self.queue_seconds, 6),
            "prefill_seconds": round(s.prefill_seconds, 6),
            "generation_seconds": round(s.total_seconds, 6),
            "tokens_per_second": round(s.tokens_per_second, 6),
        }


@dataclass
class Failed:
    status: int
    message: str
    param: str | None = None


class Rejected(Exception):
    """The job was not queued: the queue is full (`reason` "queue_full") or the server is
    stopping ("shutting_down"); the client may retry after `retry_after` seconds."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason, self.retry_after = reason, retry_after


class Job:
    """One request's generation, and the queue its events arrive on (in the event loop)."""

    def __init__(self, ask: Ask, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.ask = ask
        self.loop = loop or asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.submitted = time.monotonic()
        self._cancelled = threading.Event()
        self._outbox: list = []
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def send(self, event) -> None:
        """Deliver an event from the worker thread. The event loop is woken once for all the
        events sent before it runs (the tokens of one step, typically), not once per token:
        each wake-up takes a core from the generating threads for a moment."""
        with self._lock:
            self._outbox.append(event)
            if len(self._outbox) > 1:
                return  # a wake-up is already on its way
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self._cancelled.set()

    def _deliver(self) -> None:
        with self._lock:
            events, self._outbox = self._outbox, []
        for event in events:
            self.events.put_nowait(event)


class StopText:
    """Cuts the text at the first stop string, holding back the end of the text while it
    could be the start of one, so that no part of a stop string is ever sent."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """The text that is safe to send, and whether a stop string was found."""
        if not self.stops:
            return text, False
        buf = self.held + text
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.held = ""
            return buf[:min(found)], True
        hold = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if buf.endswith(s[:n])), default=0)
        self.held = buf[len(buf) - hold:]
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text


class Worker:
    """Owns the session; `submit` queues a job, the worker thread runs them in order."""

    def __init__(self, session: Session, max_queue: int = 16, stats_db=None,
                 record_prompt: bool = False, metrics: Metrics | None = None) -> None:
        self.session = session
        self.max_queue = max_queue
        self.recorder = Recorder(stats_db)
        self.record_prompt = record_prompt
        self.metrics = metrics or Metrics()
        pair = session.pair
        limits = [context_limit(m) for m in (pair.target, pair.draft) if m is not None]
        self.context_limit: int = min([n for n in limits if n] or [1 << 30])
        self.vocab_size = pair.target.config.get_text_config().vocab_size
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._durations: deque[float] = deque(maxlen=16)
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="specgen-generate", daemon=True)

    # --- the event loop's side -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or raise Rejected."""
        with self._cond:
            if self._stopping:
                raise Rejected("shutting_down", 5)
            idle = self._running is None and not self._waiting
            if len(self._waiting) >= self.max_queue and not idle:
                raise Rejected("queue_full", self._retry_after())
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """The job's client is gone: drop it from the queue, or stop it at the next token."""
        job._cancelled.set()
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                pass  # running or done

    def shutdown(self) -> None:
        """Stop: refuse new jobs, fail the queued ones, stop the running one at its next
        token. Safe from a signal handler's thread (it only sets flags and sends events)."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for job in waiting:
            job.send(Failed(503, "The server is shutting down; retry on another server or later."))

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: the recent mean time per
        request times the requests ahead."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, min(600, math.ceil(mean * (len(self._waiting) + 1))))

    # --- the worker thread ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while (job := self._next()) is not None:
                self._serve(job)
        finally:
            self.recorder.close()  # the history's connection belongs to this thread

    def _next(self) -> Job | None:
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if not self._waiting:  # stopping, and nothing left
                return None
            self._running = self._waiting.popleft()
            return self._running

    def _serve(self, job: Job) -> None:
        start = time.monotonic()
        try:
            self._run(job)
        except Exception as e:  # a bug, not the client's fault: answer 500, keep serving
            log.exception("generation failed")
            job.send(Failed(500, f"Generation failed: {type(e).__name__}: {e}"))
        finally:
            with self._cond:
                self._running = None
            self._durations.append(time.monotonic() - start)

    def _run(self, job: Job) -> None:
        if job.cancelled:
            return
        ask, session = job.ask, self.session
        g = session.profile.generation
        try:
            ids = self._encode(ask)
            max_new = self._budget(ask, len(ids))
        except RequestError as e:
            job.send(Failed(e.status, e.message, e.param))
            return
        temperature = g.temperature if ask.temperature is None else ask.temperature
        top_p = g.top_p if ask.top_p is None else ask.top_p
        top_k = g.top_k if ask.top_k is None else ask.top_k
        job.send(Started(len(ids)))
        generator = session.generator
        stream = generator.stream(ids, max_new_tokens=max_new, temperature=temperature, top_k=top_k,
                                  top_p=top_p, seed=ask.seed, eos_token_ids=session.eos_ids())
        decoder = IncrementalDecoder(session.tokenizer)
        stopper = StopText(ask.stop)
        sources: Counter[str] = Counter()
        queue_seconds = time.monotonic() - job.submitted
        hit = cancelled = False
        failure: Failed | None = None
        try:
            for token in stream:
                sources[token.source] += 1
                text, hit = stopper.push(decoder.push(token.id))
                job.send(Piece(text, [token.source]))
                if hit:
                    break
                if job.cancelled or self._stopping:
                    cancelled = True
                    break
            else:
                text, hit = stopper.push(decoder.flush())
                job.send(Piece(text + ("" if hit else stopper.flush()), []))
        except SpecgenError as e:
            failure = Failed(400, str(e))
        except Exception as e:
            log.exception("generation failed")
            failure = Failed(500, f"Generation failed: {type(e).__name__}: {e}")
        finally:
            stream.close()  # between steps: the engine keeps its caches consistent
        stats = generator.stats
        if hit:
            stats.stop_reason = "stop_string"
        ended = "error" if failure else "interrupted" if cancelled else "completed"
        self._record(ask, stats, sources, ended, temperature, top_p, top_k)
        if failure:
            job.send(failure)
        elif cancelled and self._stopping:
            job.send(Failed(503, "The server is shutting down; the answer was cut short."))
        elif not cancelled:
            reason = "length" if stats.stop_reason == "max_new_tokens" else "stop"
            job.send(Finished(reason, stats, sources, queue_seconds))

    def _encode(self, ask: Ask) -> list[int]:
        """The prompt's token ids, as `specgen run` would encode the same text."""
        session = self.session
        if ask.token_ids is not None:
            bad = [i for i in ask.token_ids if not 0 <= i < self.vocab_size]
            if bad:
                raise RequestError(f"prompt holds token id {bad[0]}, outside the vocabulary "
                                   f"(0 to {self.vocab_size - 1}).", param="prompt")
            if not ask.token_ids:
                raise RequestError("prompt is empty: give some text or token ids.", param="prompt")
            return list(ask.token_ids)
        if ask.messages is None:
            messages = [{"role": "user", "content": ask.text or ""}]
            use_template = False
        else:
            messages = ask.messages
            system = session.profile.generation.system_prompt
            if ask.system_default and system and not any(m["role"] == "system" for m in messages):
                messages = [{"role": "system", "content": system}, *messages]
            use_template = session.profile.generation.chat_template
            has_template = bool(getattr(session.tokenizer, "chat_template", None))
            if ask.template_required and not (use_template and has_template):
                raise RequestError(
                    f"The profile {session.profile.name!r} has no chat template (chat_template = "
                    "false, or a tokenizer without one), so messages cannot be formatted; send "
                    "plain text to /v1/completions or /api/generate with raw = true.")
        try:
            return encode_messages(session.tokenizer, messages, use_template).tolist()
        except SpecgenError as e:
            raise RequestError(str(e)) from None
        except Exception as e:  # the template's own checks (jinja2 errors: role order, ...)
            raise RequestError(f"The chat template refused these messages: {e}") from None

    def _budget(self, ask: Ask, prompt_tokens: int) -> int:
        """Tokens to generate: what was asked, never past the model's context."""
        limit = self.context_limit
        room = limit - prompt_tokens
        if room < 1:
            raise RequestError(f"The prompt ({prompt_tokens} tokens) fills the model's context "
                               f"({limit} tokens); shorten it.", param=ask.budget_param)
        if ask.fill_context:
            return room
        if ask.max_tokens is None:
            return min(self.session.profile.generation.max_new_tokens, room)
        if ask.max_tokens > room:
            raise RequestError(
                f"{ask.budget_param} = {ask.max_tokens} and the prompt ({prompt_tokens} tokens) "
                f"exceed the model's context ({limit} tokens); ask for at most {room}.",
                param=ask.budget_param, code="context_length_exceeded")
        return ask.max_tokens

    def _record(self, ask: Ask, stats: Stats, sources: Counter[str], ended: str,
                temperature: float, top_p: float, top_k: int) -> None:
        self.metrics.fold(stats, sources, ended)
        record = self.session.record("serve", stats, ended,
                                     ask.record_text() if self.record_prompt else None)
        record = dataclasses.replace(record, temperature=temperature, top_p=top_p, top_k=top_k)
        warning = self.recorder.record(record)
        if warning and not self._warned:
            log.warning("%s", warning)
            self._warned = True
