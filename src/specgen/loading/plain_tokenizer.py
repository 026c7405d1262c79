"""A tokenizer on the `tokenizers` library and jinja2 alone, answering what specgen asks of
one (encode, decode, the chat template, the special tokens), so that a command that only
generates never imports transformers (much of its start: docs/benchmarks.md).

It is made only from a tokenizer copy that transformers' own tokenizer was compared against
when the copy was kept (tokenizer_cache.py): the special tokens are those transformers gave,
recorded then, and probe texts and conversations encoded, decoded and rendered the same.
The chat template renders as transformers renders one (its sandbox, filters and globals) for
conversations of plain text messages, the only kind specgen builds."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

SETTINGS = "plain.json"  # what transformers' tokenizer said of itself when the copy was kept
# Texts and conversations a copy must encode, decode and render as the tokenizer it copies.
PROBES = ["write quicksort in python", "  two  spaces\tand\ttabs\n\nnew lines\r\n",
          "e\u0301 \u00e9 \ufb01 \u2163 \u00bd", "\u4f60\u597d\uff0c\u4e16\u754c \U0001f600 \u05e9\u05dc\u05d5\u05dd",
          "def f(x):\n    return x ** 2  # comment", "<|endoftext|> <|im_start|>user<|im_end|> <s></s>"]
TURNS = [{"role": "system", "content": PROBES[0]}, {"role": "user", "content": PROBES[2]},
         {"role": "assistant", "content": PROBES[4]}, {"role": "user", "content": PROBES[5]}]


class PlainTokenizer:
    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        settings = json.loads((folder / SETTINGS).read_text())
        self.backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.special_tokens_map: dict[str, str] = settings["special_tokens_map"]
        self.chat_template: str | None = settings["chat_template"]
        self.eos_token_id: int | None = settings["eos_token_id"]
        self.name_or_path = str(folder)
        self._template = None

    def __getattr__(self, name: str):
        if name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            return self.special_tokens_map.get(name)
        raise AttributeError(name)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = False,
                            tokenize: bool = True):
        """The conversation rendered by the chat template (and encoded, with `tokenize`)."""
        if self._template is None:
            self._template = compile_template(self.chat_template)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        text = self._template.render(messages=chat, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **self.special_tokens_map)
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text


def compile_template(source: str):
    """A chat template compiled in the environment transformers renders one in: an immutable
    sandbox with trimmed blocks and loop controls, `tojson` without HTML escaping,
    `raise_exception`, `strftime_now`, and a `dict` and `namespace` that refuse names with a
    leading underscore (what templates on the hub are written against)."""
    import jinja2.ext
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    def refuse_private(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set {name!r} on a namespace")

    class Guarded(Namespace):
        def __init__(*args, **kwargs):  # jinja2's signature: `self` may be a key as well
            for name in dict(*args[1:], **kwargs):
                refuse_private(name)
            Namespace.__init__(*args, **kwargs)

        def __setitem__(self, name, value):
            refuse_private(name)
            super().__setitem__(name, value)

    class Dicts:  # `dict(...)` and `dict.fromkeys(...)`, without handing out the type
        __call__ = staticmethod(dict)
        fromkeys = staticmethod(dict.fromkeys)

    def fail(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys))
    env.globals.update(raise_exception=fail, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=Dicts(), namespace=Guarded)
    return env.from_string(source)


def settings_of(tok) -> dict | None:
    """What a PlainTokenizer needs to know of transformers' tokenizer `tok`, or None where it
    cannot stand in for it (a cleanup of decoded text, several named templates, a template
    with transformers' own tags)."""
    template = getattr(tok, "chat_template", None)
    if getattr(tok, "clean_up_tokenization_spaces", False) or not isinstance(template, (str, type(None))):
        return None
    if template is not None and re.search(r"\{%-?\s*generation\s*-?%\}", template):
        return None
    return {"special_tokens_map": dict(tok.special_tokens_map), "chat_template": template,
            "eos_token_id": tok.eos_token_id}


def load_plain(entry: Path, folder: Path) -> PlainTokenizer | None:
    try:
        tok = PlainTokenizer(entry)
    except Exception:  # the tokenizers library raises a bare Exception on a file it cannot read
        return None
    tok.name_or_path = str(folder)
    return tok


def save_plain(tok, folder: Path) -> str | None:
    """Record what a PlainTokenizer needs beside the copy in `folder`; None when it answers as
    `tok` does, else what differs (and the record is removed)."""
    settings = settings_of(tok)
    if settings is None:
        return "transformers' tokenizer does more than a plain one"
    (folder / SETTINGS).write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    try:
        problem = difference(tok, PlainTokenizer(folder))
    except Exception as e:  # a template jinja2 cannot compile here, a backend it cannot read
        problem = f"the plain tokenizer fails: {e}"
    if problem is not None:
        (folder / SETTINGS).unlink()
    return problem


def difference(tok, plain: PlainTokenizer) -> str | None:
    """What a PlainTokenizer answers differently from transformers' `tok` (None when nothing)."""
    if plain.get_vocab() != tok.get_vocab():
        return "the vocabularies differ"
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "eos_token_id"):
        if getattr(plain, attr) != getattr(tok, attr, None):
            return f"{attr} differs"
    for text in PROBES:
        for special in (True, False):
            ids = tok(text, add_special_tokens=special)["input_ids"]
            if plain(text, add_special_tokens=special)["input_ids"] != ids:
                return "an encoding differs"
            for skip in (False, True):
                if plain.decode(ids, skip_special_tokens=skip) != tok.decode(ids, skip_special_tokens=skip):
                    return "a decoding differs"
    if tok.chat_template is None:
        return None
    for messages in (TURNS[1:2], TURNS[:2], TURNS[1:], TURNS):
        for prompt in (True, False):
            try:
                want = tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
            except Exception as e:  # a template that refuses these roles must refuse them here too
                want = type(e).__name__
            try:
                got = plain.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
            except Exception as e:
                got = type(e).__name__
            if got != want:
                return "the chat template renders differently"
    return None
