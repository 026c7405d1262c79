"""One prompt, one answer: what `specgen run` (and later the server) does with a loaded
session. Token text is decoded as it streams; an interrupted answer keeps what it has."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specgen.app.render import IncrementalDecoder
from specgen.app.session import Session, encode_messages, messages_for
from specgen.core.stats import Source, Stats


@dataclass
class Answer:
    tokens: list[dict] = field(default_factory=list)  # {"id", "text", "source"} per token
    stats: Stats | None = None
    ended: str = "completed"  # or "interrupted"

    @property
    def text(self) -> str:
        return "".join(t["text"] for t in self.tokens)


def answer(session: Session, prompt: str, seed: int | None = None,
           on_text: Callable[[str, Source], None] | None = None) -> Answer:
    """Generate the profile's answer to `prompt` (its chat template and system prompt, unless
    the profile says raw), calling `on_text(piece, source)` as the text grows. Ctrl-C ends
    the answer early: it comes back with what was generated and `ended = "interrupted"`."""
    gen = session.profile.generation
    input_ids = encode_messages(session.tokenizer, messages_for(prompt, gen.system_prompt),
                                gen.chat_template)
    decoder = IncrementalDecoder(session.tokenizer)
    out = Answer()
    try:
        for tok in session.generator.stream(input_ids, **session.sampling_kwargs(seed)):
            piece = decoder.push(tok.id)
            out.tokens.append({"id": tok.id, "text": piece, "source": tok.source})
            if on_text is not None:
                on_text(piece, tok.source)
    except KeyboardInterrupt:
        out.ended = "interrupted"
    finally:
        if out.tokens:
            tail = decoder.flush()
            out.tokens[-1]["text"] += tail
            if on_text is not None and tail:
                on_text(tail, out.tokens[-1]["source"])
        out.stats = session.generator.stats
    return out
