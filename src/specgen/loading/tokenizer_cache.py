"""A plan's tokenizers (`load_tokenizers`: the target's, the draft's checked against it); a
model's tokenizer (`load_tokenizer`), loaded the fast way on every run after the first; a GGUF's
tokenizer kept as such a copy on its first load (`gguf_tokenizer`).

transformers loads a tokenizer whose class has its own `__init__` (Qwen2's, Llama's, ...)
by parsing the whole tokenizer.json in Python and rebuilding the backend from its vocab and
merges, with the class's own normalizer and pre-tokenizer; that takes seconds for a
150k-token vocabulary. The first load here goes that way; then the tokenizer it built is
saved (its backend exactly as built, its special and added tokens, its chat template) and
loaded back the generic way (the backend read by the `tokenizers` library in one call), and
the two are compared: the class adds no behaviour but its `__init__`, the backends serialize
the same, every other attribute is equal, and probe texts encode, decode and render the chat
template the same. Only then is the copy kept; a refusal is kept too, so later runs load the
slow way without comparing again. Later runs load the copy.

Under `paths.cache_dir()/tokenizers/`, an entry is keyed by the bytes of the tokenizer files
it was made from and the transformers and tokenizers versions, so any change to either
makes a new entry. Only models in specgen's cache or the hub's have copies made: a local
folder is the user's to change, and it loads as it is.

A command that only generates never imports transformers (much of its start:
docs/benchmarks.md): it gets a `PlainTokenizer`, the kept copy read by the `tokenizers` library
and jinja2 alone, answering what specgen asks of a tokenizer (encode, decode, the chat
template, the special tokens). One is made only from a copy that transformers' own tokenizer
was compared against when the copy was kept: the special tokens are those transformers gave,
recorded then, and probe texts and conversations encoded, decoded and rendered the same. Its
chat template renders as transformers renders one (its sandbox, filters and globals) for
conversations of plain text messages, the only kind specgen builds.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import ModelError
from specgen.loading import cache, stored
from specgen.loading.plan import FROM_THE_FILE, PairPlan, RolePlan
from specgen.loading.sources import ModelFiles, Progress, from_pretrained, say
from specgen.paths import cache_dir

if TYPE_CHECKING:  # imported where a tokenizer needs transformers (not `lean`)
    from transformers import PreTrainedTokenizerBase

FORMAT = cache.TOKENIZER_FORMAT
FOLDER = "tokenizers"
# Files AutoTokenizer reads to build a tokenizer (chat templates: any file named chat_template*,
# and the additional_chat_templates folder).
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
         "vocab.json", "merges.txt", "tokenizer.model")
# What a tokenizer class may define and still behave as the generic backend: its constructor,
# and the class attributes loading reads (model_input_names is compared on the instances).
PLAIN_CLASS_NAMES = {"__init__", "__module__", "__qualname__", "__doc__", "__annotations__",
                     "__firstlineno__", "__static_attributes__", "__dict__", "__weakref__",
                     "vocab_files_names", "model", "model_input_names", "slow_tokenizer_class"}
# Instance attributes that differ by construction and no method of the generic class reads:
# the backend (compared serialized), a class's private copies of its vocab and merges, the
# kwargs the tokenizer was made with (compared without the paths), the folder it came from.
SET_APART = {"_tokenizer", "_vocab", "_merges", "init_kwargs", "name_or_path"}
PATH_KWARGS = {"name_or_path", "is_local", "local_files_only", "vocab", "merges", "vocab_file",
               "merges_file", "tokenizer_file", "added_tokens_decoder"}
SETTINGS = "plain.json"  # beside a copy: what transformers' tokenizer said of itself then
# Texts and conversations a copy must encode, decode and render as the tokenizer it copies.
PROBES = ["write quicksort in python", "  two  spaces\tand\ttabs\n\nnew lines\r\n",
          "e\u0301 \u00e9 \ufb01 \u2163 \u00bd", "\u4f60\u597d\uff0c\u4e16\u754c \U0001f600 \u05e9\u05dc\u05d5\u05dd",
          "def f(x):\n    return x ** 2  # comment", "<|endoftext|> <|im_start|>user<|im_end|> <s></s>"]
TURNS = [{"role": "system", "content": PROBES[0]}, {"role": "user", "content": PROBES[2]},
         {"role": "assistant", "content": PROBES[4]}, {"role": "user", "content": PROBES[5]}]




def load_tokenizer(source: ModelFiles, trust_remote_code: bool = False, lean: bool = False
                   ) -> PreTrainedTokenizerBase | PlainTokenizer:
    """The model's tokenizer: from its fast copy when one was kept (the same
    tokenizer, loaded in a fraction of the time), else as transformers loads it, keeping
    a fast copy for the next run. A GGUF's, or one with the model's own code, loads as it is.
    `lean`: a PlainTokenizer (no transformers import) where the copy was found to answer the
    same."""
    copies = not source.gguf and not trust_remote_code and eligible(source.path)
    if copies:
        tok = load(source.path, plain=lean)
        if tok is not None:
            return tok
    from transformers import AutoTokenizer

    tok = from_pretrained(AutoTokenizer, source, trust_remote_code, "load the tokenizer")
    if copies:
        store(source.path, tok)
    return tok


def gguf_tokenizer(source: ModelFiles, lean: bool = False, progress: Progress | None = None
                   ) -> tuple[PreTrainedTokenizerBase | PlainTokenizer, Path]:
    """The tokenizer of the GGUF file `source` (sha256 known), and the cache entry holding its
    copy. transformers builds it from the file's metadata, a second or more for a 150k-token
    vocabulary, so the first load keeps a copy (tokenizers/gguf-<hash of the file and of the libraries
    that read it>), compared as a folder's fast copy is, and later runs load the copy: the
    fast way where it answers the same, else the slow way from its files (a refused copy keeps
    them). No weight is read or written. `lean`: a PlainTokenizer where the copy was found to
    answer the same."""
    made = []

    def build(tmp: Path) -> dict:
        from transformers import AutoTokenizer

        say(progress, f"Reading the tokenizer of {source.gguf} (first run only)")
        # Saved, then loaded back as a folder's: what runs is the tokenizer those files give
        # (its special tokens as saved), the tokenizer every later run loads.
        auto = gguf_tokenizer_class(source) or AutoTokenizer
        from_pretrained(auto, source, False, "load the tokenizer").save_pretrained(tmp)
        made.append(AutoTokenizer.from_pretrained(tmp, local_files_only=True))
        return _copy(made[0], tmp, str(source.gguf_path), keep_refused=True)

    name = hashlib.sha256(f"{source.sha256}|{_versions()}".encode()).hexdigest()[:32]
    entry = cache.ensure(cache_dir() / FOLDER / f"gguf-{name}", build)
    tok = made[0] if made else _load_copy(entry, cache.read_manifest(entry) or {}, entry, lean)
    if tok is None:  # a copy that no longer loads: the file's own, the slow way
        from transformers import AutoTokenizer

        tok = from_pretrained(AutoTokenizer, source, False, "load the tokenizer")
    tok.name_or_path = str(entry)
    return tok, entry


def gguf_tokenizer_class(source: ModelFiles) -> type | None:
    """The class AutoTokenizer builds the GGUF file's tokenizer with, named without its way of
    finding it: AutoTokenizer learns the file's model type by reading all its metadata with
    gguf's reader (seconds for a 150k-token vocabulary), then, in a folder without a
    tokenizer_config.json, takes the class that transformers maps the type to. For the
    families specgen runs as stored, the type is the architecture in the file's header, read
    here in milliseconds. None elsewhere, and for a file transformers would take for Mistral:
    AutoTokenizer then finds the class as it does."""
    if (source.path / "tokenizer_config.json").exists():
        return None
    try:
        file = stored.File(source.gguf_path)
    except ModelError:
        return None
    family, name = file.value("general.architecture"), str(file.value("general.name", ""))
    if family not in stored.ARCHITECTURES or "mistral" in name.lower():
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING, TokenizersBackend

    found = TOKENIZER_MAPPING.get(CONFIG_MAPPING[family], TokenizersBackend)
    return None if found is None or found.__name__ == "MistralCommonBackend" else found


def eligible(path: Path) -> bool:
    """Whether a model folder is one whose tokenizer gets a fast copy: specgen's cache entries
    and the hub's snapshots."""
    from huggingface_hub import constants

    path = path.resolve()
    return any(path.is_relative_to(Path(root).resolve())
               for root in (cache_dir(), constants.HF_HUB_CACHE))


# key() per folder and the stamps of the files it read: a load reads the same folder's key
# twice (its copy, then whether a GGUF draft was found to match it), and hashes it once.
_KEYS: dict[tuple, str] = {}


def key(folder: Path) -> str | None:
    """The entry name for the tokenizer in `folder` (None when it has no tokenizer.json)."""
    if not (folder / "tokenizer.json").is_file():
        return None
    names = sorted({*(n for n in FILES if (folder / n).is_file()),
                    *(p.name for p in folder.glob("chat_template*") if p.is_file()),
                    *(f"additional_chat_templates/{p.name}"
                      for p in (folder / "additional_chat_templates").glob("*") if p.is_file())})
    read = [*names, "config.json"] if (folder / "config.json").is_file() else names
    known = (str(folder.resolve()), *((n, *cache.file_stamp(folder / n)) for n in read))
    if known not in _KEYS:
        _KEYS[known] = _digest(folder, names)
    return _KEYS[known]


def _versions() -> str:
    """What a copy's name holds besides its files: the copy's format and the versions of
    the libraries that made it and compared it."""
    from importlib.metadata import version  # not transformers.__version__: no import

    return f"v{FORMAT}|{version('transformers')}|{version('tokenizers')}"


def _digest(folder: Path, names: list[str]) -> str:
    h = hashlib.sha256(_versions().encode())
    for name in names:
        data = (folder / name).read_bytes()
        h.update(f"\n{name}:{len(data)}\n".encode())
        h.update(data)
    try:  # without a tokenizer_class, the model type in config.json picks the class
        config = json.loads((folder / "config.json").read_text())
        h.update(f"\nconfig:{config.get('model_type')}:{config.get('tokenizer_class')}".encode())
    except (OSError, ValueError, AttributeError):
        pass
    return h.hexdigest()[:32]


# GGUF drafts whose tokenizer was found to match a target's (a file beside hashes.json)
MATCHES = "tokenizer-matches.json"


def _match(target: Path, gguf: Path) -> tuple[Path, str] | None:
    name = key(target)
    if name is None:
        return None
    st = gguf.stat()
    return cache_dir() / MATCHES, f"{name}|{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def matched(target: Path, gguf: Path) -> bool:
    """Whether the tokenizer in the GGUF file `gguf` was found, on an earlier run, to match
    the one in the model folder `target` (loading.load checks a draft's against its
    target's). transformers reads a GGUF's tokenizer by parsing the file's metadata in
    Python, seconds for a 150k-token vocabulary, and a llama.cpp draft needs it for that
    check alone. Known by the target's tokenizer entry (the bytes of its files) and the
    GGUF's path, size and time, as hashes.json knows files."""
    found = _match(target, gguf)
    if found is None:
        return False
    path, name = found
    try:
        return name in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def remember_match(target: Path, gguf: Path) -> None:
    """Record that the GGUF's tokenizer matched the target's (`matched`)."""
    found = _match(target, gguf)
    if found is None:
        return
    path, name = found
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    known[name] = True
    cache.write_json(path, known)


def entry_dir(name: str) -> Path:
    return cache_dir() / FOLDER / name


def kept(manifest: dict | None) -> bool:
    """Whether an intact entry's manifest (cache.intact) is that of a copy this release
    makes."""
    return manifest is not None and manifest.get("tokenizer_format") == FORMAT


def load(folder: Path, plain: bool = False):
    """The fast copy of the tokenizer in `folder`, or None (no copy yet, or it was refused).
    `plain`: a PlainTokenizer where the copy's manifest says it answers the same."""
    name = key(folder)
    if name is None:
        return None
    entry = entry_dir(name)
    manifest = cache.intact(entry)
    if not kept(manifest) or not manifest.get("same"):
        return None  # a damaged or older copy is made again by the slow load's `store`
    return _load_copy(entry, manifest, folder, plain)


def _load_copy(entry: Path, manifest: dict, origin: Path, plain: bool):
    """The tokenizer kept in `entry` (its manifest says how it loads), named for `origin`;
    None where it fails to load (the caller then loads the slow way)."""
    try:
        if not manifest.get("same"):  # a refused copy that kept its files
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(entry, local_files_only=True)
        if plain and manifest.get("plain"):
            return load_plain(entry, origin)
        tok = _load_generic(entry)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    tok.name_or_path = str(origin)
    tok.init_kwargs["name_or_path"] = str(origin)
    return tok


def store(folder: Path, tok) -> bool:
    """Keep a fast copy of `tok` (loaded from `folder` the usual way) when it loads back the
    same, else a refusal; returns whether the copy was kept. Never raises: without a copy
    the tokenizer loads the slow way."""
    name = key(folder)
    if name is None or kept(cache.intact(entry_dir(name))):
        return False
    try:
        with cache.building(entry_dir(name)) as tmp:
            manifest = _copy(tok, tmp, str(folder), keep_refused=False)
            cache.finish(tmp, **manifest)
        return manifest["same"]
    except (OSError, ValueError, TypeError, RuntimeError):
        return False


def _copy(tok, folder: Path, source: str, keep_refused: bool) -> dict:
    """Save `tok` into the empty entry `folder` as a fast copy and, where it answers the same,
    a plain one; returns what the entry's manifest records. A refused copy keeps its files
    only with `keep_refused` (where they are the only copy, as a GGUF's)."""
    problem = _save(tok, folder)
    plain = save_plain(tok, folder) if problem is None else problem
    if problem is not None and not keep_refused:
        for child in folder.iterdir():
            cache.remove(child)
    return dict(kind="tokenizer", tokenizer_format=FORMAT, same=problem is None, problem=problem,
                plain=plain is None, plain_problem=plain, source=source)


def _load_generic(folder: Path):
    from transformers import TokenizersBackend

    return TokenizersBackend.from_pretrained(folder, local_files_only=True)


def _save(tok, folder: Path) -> str | None:
    """Save `tok` into `folder` for the generic load; None when that load gives the same
    tokenizer, else what differs."""
    from transformers import TokenizersBackend

    if not isinstance(tok, TokenizersBackend):
        return f"{type(tok).__name__} is not backed by the tokenizers library"
    for klass in type(tok).__mro__[:type(tok).__mro__.index(TokenizersBackend)]:
        extra = sorted(set(vars(klass)) - PLAIN_CLASS_NAMES)
        if extra:
            return f"{klass.__name__} defines {', '.join(extra)}"
    tok.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # With the added tokens in the config, the load does not parse tokenizer.json in Python.
    config["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in tok.added_tokens_decoder.items()}
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    fast = _load_generic(folder)
    return difference(tok, fast)


def difference(slow, fast) -> str | None:
    """What differs between two tokenizers that should be the same (None when nothing)."""
    if slow._tokenizer.to_str() != fast._tokenizer.to_str():
        return "the backends differ"
    a, b = vars(slow), vars(fast)
    for attr in sorted((set(a) | set(b)) - SET_APART):
        if repr(a.get(attr)) != repr(b.get(attr)):
            return f"{attr} differs"
    ka = {k: repr(v) for k, v in slow.init_kwargs.items() if k not in PATH_KWARGS}
    kb = {k: repr(v) for k, v in fast.init_kwargs.items() if k not in PATH_KWARGS}
    if ka != kb:
        return "the init kwargs differ"
    if slow.model_input_names != fast.model_input_names or slow.chat_template != fast.chat_template:
        return "the model inputs or the chat template differ"
    for text in PROBES:
        ids = slow.encode(text, add_special_tokens=True)
        if ids != fast.encode(text, add_special_tokens=True):
            return "an encoding differs"
        for skip in (False, True):
            if slow.decode(ids, skip_special_tokens=skip) != fast.decode(ids, skip_special_tokens=skip):
                return "a decoding differs"
    if slow.chat_template is not None:
        messages = TURNS
        try:
            want = slow.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception:  # a template that refuses these roles: compare on a user turn alone
            messages = messages[1:2]
            want = slow.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) != want:
            return "the chat template renders differently"
    return None


def check_tokenizers(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                     target_name: str = "target", draft_name: str = "draft") -> None:
    """Refuse a draft whose tokenizer differs from the target's: the same token must have the
    same id over the ids both know (one may have a few extra tokens), and the special tokens
    that end and start text must be the same."""
    id_t = {i: t for t, i in target.get_vocab().items()}
    id_d = {i: t for t, i in draft.get_vocab().items()}
    shared = min(len(id_t), len(id_d))
    for i in range(shared):
        if id_t.get(i) != id_d.get(i):
            raise ModelError(
                f"The draft {draft_name} does not share the target {target_name}'s tokenizer: "
                f"token id {i} is {id_t.get(i)!r} for the target and {id_d.get(i)!r} for the "
                "draft. Pick a draft from the target's model family.")
    for attr in ("eos_token", "bos_token", "unk_token"):
        t, d = getattr(target, attr, None), getattr(draft, attr, None)
        if t != d:
            raise ModelError(
                f"The draft {draft_name} and the target {target_name} disagree on the special "
                f"token {attr}: {d!r} vs {t!r}. Pick a draft from the target's model family.")


def same_tokenizer_files(a: ModelFiles, b: ModelFiles) -> bool:
    """Whether two cache entries hold byte-identical tokenizer files (their manifests' sha256;
    the chat template aside, which only the target's tokenizer uses)."""
    if a.gguf or b.gguf:
        return False
    ma, mb = cache.current(a.path), cache.current(b.path)
    if ma is None or mb is None or "tokenizer.json" not in ma["files"]:
        return False
    return all((ma["files"].get(f) or {}).get("sha256") == (mb["files"].get(f) or {}).get("sha256")
               for f in FILES)


def _load_role(role: RolePlan, lean: bool, progress: Progress | None
               ) -> tuple[PreTrainedTokenizerBase | PlainTokenizer, Path]:
    """The role's tokenizer and the folder or file it was read from: a GGUF run as stored,
    from its kept copy; else from its files (a GGUF not converted yet, from the file)."""
    if role.runtime == "stored":
        return gguf_tokenizer(role.files, lean, progress)
    return load_tokenizer(role.files, role.spec.trust_remote_code, lean), role.files.path


def _shares_tokenizer(target: RolePlan, target_folder: Path, draft: RolePlan) -> bool:
    """The draft's tokenizer is the target's: the same files, or (a GGUF read as it is) one
    found to match on an earlier run."""
    if same_tokenizer_files(target.files, draft.files):
        return True
    return draft.runtime in FROM_THE_FILE and matched(target_folder, draft.files.gguf_path)


def load_tokenizers(plan: PairPlan, progress: Progress | None = None
                    ) -> PreTrainedTokenizerBase | PlainTokenizer:
    """The target's tokenizer, the draft's checked against it (read once where they share it)."""
    target, draft = plan.target, plan.draft
    tokenizer, folder = _load_role(target, plan.lean, progress)
    if draft is None or _shares_tokenizer(target, folder, draft):
        return tokenizer
    other, _ = _load_role(draft, plan.lean, progress)
    check_tokenizers(tokenizer, other, target.files.name, draft.files.name)
    if draft.runtime in FROM_THE_FILE:
        remember_match(folder, draft.files.gguf_path)
    return tokenizer


# --- the plain tokenizer ----------------------------------------------------------------------

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
        problem = plain_difference(tok, PlainTokenizer(folder))
    except Exception as e:  # a template jinja2 cannot compile here, a backend it cannot read
        problem = f"the plain tokenizer fails: {e}"
    if problem is not None:
        (folder / SETTINGS).unlink()
    return problem


def plain_difference(tok, plain: PlainTokenizer) -> str | None:
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
