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
from datetime import datetime
from pathlib import Path

SETTINGS = "plain.json"  # what transformers' tokenizer said of itself when the copy was kept


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
    """A chat template compiled as transformers compiles one: its immutable sandbox with
    trimmed blocks and loop controls, JSON without HTML escaping, `raise_exception`,
    `strftime_now`, and a `dict` and `namespace` that refuse private attributes."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


def settings_of(tok) -> dict | None:
    """What a PlainTokenizer needs to know of transformers' tokenizer `tok`, or None where it
    cannot stand in for it (a cleanup of decoded text, several named templates, a template
    with transformers' own tags)."""
    import re

    template = getattr(tok, "chat_template", None)
    if getattr(tok, "clean_up_tokenization_spaces", False) or not isinstance(template, (str, type(None))):
        return None
    if template is not None and re.search(r"\{%-?\s*generation\s*-?%\}", template):
        return None
    return {"special_tokens_map": dict(tok.special_tokens_map), "chat_template": template,
            "eos_token_id": tok.eos_token_id}
