"""One prompt, one answer: what `specgen run` (and later the server) does with a loaded
session. Token text is decoded as it streams; an interrupted answer keeps what it has: Ctrl-C,
SIGTERM (errors.Terminated) or a reader of the streamed text that went away (BrokenPipeError
from `on_text`) end it, and `Answer.stopped_by` says which, for the caller to re-raise once
the answer is recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specgen.app.render import IncrementalDecoder
from specgen.app.session import Session, encode_messages, messages_for
from specgen.core.stats import Origin, Stats


@dataclass
class Answer:
    tokens: list[dict] = field(default_factory=list)  # {"id", "text", "source"} per token
    stats: Stats | None = None
    ended: str = "completed"  # or "interrupted"
    stopped_by: BaseException | None = None  # what interrupted it

    @property
    def text(self) -> str:
        return "".join(t["text"] for t in self.tokens)


def answer(session: Session, prompt: str, seed: int | None = None,
           on_text: Callable[[str, Origin], None] | None = None) -> Answer:
    """Generate the profile's answer to `prompt` (its chat template and system prompt, unless
    the profile says raw), calling `on_text(piece, source)` as the text grows. Ctrl-C ends
    the answer early, and so do SIGTERM and a closed output (`on_text` raising BrokenPipeError):
    it comes back with what was generated, `ended = "interrupted"` and `stopped_by` set."""
    gen = session.profile.generation
    input_ids = encode_messages(session.tokenizer, messages_for(prompt, gen.system_prompt),
                                gen.chat_template)
    decoder = IncrementalDecoder(session.tokenizer)
    out = Answer()
    stream = session.generator.stream(input_ids, **session.sampling_kwargs(seed))
    try:
        for tok in stream:
            piece = decoder.push(tok.id)
            out.tokens.append({"id": tok.id, "text": piece, "source": tok.source})
            if on_text is not None:
                on_text(piece, tok.source)
    except (KeyboardInterrupt, BrokenPipeError) as e:
        stream.close()  # the engine's stats end: "interrupted", with the time spent
        # A signal can land outside the engine's own frame (in torch's wrapper around it).
        session.generator.stats.stop_reason = "interrupted"
        out.ended, out.stopped_by = "interrupted", e
    finally:
        if out.tokens:
            tail = decoder.flush()
            out.tokens[-1]["text"] += tail
            if on_text is not None and tail and not isinstance(out.stopped_by, BrokenPipeError):
                try:
                    on_text(tail, out.tokens[-1]["source"])
                except BrokenPipeError as e:  # the answer is whole; its reader went away
                    out.stopped_by = e
        out.stats = session.generator.stats
    return out
