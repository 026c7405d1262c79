"""Profiles: a TOML file naming a target and a draft model and how to run them, read into
typed, validated dataclasses. Errors name the file, the key and what is allowed.

Search order for `--profile NAME`: the user's profile folder (paths.user_profile_dir:
$SPECGEN_PROFILE_DIR, else the user config dir), then the profiles bundled with specgen. A name containing a slash
or ending in .toml is a path. A profile may `extends = "other"` and override some keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgen.choices import (DEFAULT_METHOD, DEFAULT_METHOD_WITHOUT_DRAFT, DTYPES, GPU_SCHEMES,
                             HEAD_KINDS, MAX_K, METHODS, MIN_DRAFT_WINDOW, MIN_K, QUANTIZATIONS,
                             RUNTIMES, STORED_SCHEME, listing)
from specgen.errors import ConfigError
from specgen.paths import user_profile_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PROFILE = "qwen-coder-demo"

DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Bounds that keep a valid profile runnable: integers fit the history's 64-bit columns; a
# temperature below MIN_TEMPERATURE is greedy in effect but overflows the scaled logits; an
# n-gram longer than MAX_NGRAM never pays and its match table grows with it.
MAX_INT = 2**63 - 1
MIN_TEMPERATURE = 1e-5
MAX_NGRAM = 64


@dataclass(frozen=True)
class ModelSpec:
    model: str = ""  # hub id, local directory, or path to a .gguf file ("": a [draft] head only)
    gguf_file: str | None = None  # a .gguf file inside the hub repo or directory
    revision: str | None = None
    dtype: str = "auto"
    quantization: str = "none"
    device: str = "auto"
    sha256: str | None = None  # of the single model file (GGUF)
    trust_remote_code: bool = False
    runtime: str = "transformers"  # "llama.cpp": a GGUF draft on llama.cpp's CPU kernels
    # [draft] only: a head on the target (heads/): a folder, a hub id, or the name of a head
    # `specgen heads train` made; and its kind (choices.HEAD_KINDS).
    head: str | None = None
    kind: str | None = None

    @property
    def has_model(self) -> bool:
        return bool(self.model)


@dataclass(frozen=True)
class SpeculationSpec:
    num_speculative_tokens: int = 4
    adaptive: bool = True
    tree: bool = True  # a draft model's chain may branch to its next guesses (core/tree.py)
    method: str = DEFAULT_METHOD  # DEFAULT_METHOD_WITHOUT_DRAFT without a [draft]: _build
    max_ngram: int = 3
    min_ngram: int = 1
    draft_vocab: int = 0  # draft over the first N token ids only (0: all); see ModelDrafter
    draft_confidence: float = 0.0  # end a draft below this draft probability (0: never)
    skip_layers: str | None = None  # method "self": sub-layers to skip (parse_skip_layers)
    draft_window: int = 0  # the draft reads at most the context's last N tokens (0: all)


@dataclass(frozen=True)
class GenerationSpec:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    system_prompt: str | None = None
    chat_template: bool = True


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path | None
    description: str
    target: ModelSpec
    draft: ModelSpec | None
    speculation: SpeculationSpec
    generation: GenerationSpec

    def to_dict(self) -> dict[str, Any]:
        """The resolved profile as TOML-shaped data (None values left out)."""
        out: dict[str, Any] = {"description": self.description}
        for section in ("target", "draft", "speculation", "generation"):
            spec = getattr(self, section)
            if spec is not None:
                out[section] = {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}
        return out


SECTIONS = {"target": ModelSpec, "draft": ModelSpec, "speculation": SpeculationSpec,
            "generation": GenerationSpec}
TOP_KEYS = ("description", "extends", *SECTIONS)


# --- where profiles live ------------------------------------------------------------------

def bundled_profile_dir() -> Path:
    """The profiles shipped inside the package (package data, in a wheel as in the tree)."""
    return Path(__file__).parent / "bundled_profiles"


def list_profiles() -> list[tuple[str, Path]]:
    """(name, path) of every profile found; a user profile shadows a bundled one."""
    found: dict[str, Path] = {}
    for folder in (user_profile_dir(), bundled_profile_dir()):
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return list(found.items())


def find_profile(name: str) -> Path:
    if name.endswith(".toml") or "/" in name or os.sep in name:
        path = Path(name).expanduser()
        if path.is_dir():
            raise ConfigError(f"Profile {path} is a directory: give a profile's .toml file.")
        if not path.is_file():
            raise ConfigError(f"Profile file {path} does not exist.")
        return path
    known = dict(list_profiles())
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"No profile named {name!r}.{hint} Known profiles: {', '.join(sorted(known)) or 'none'}. "
        f"Add your own as {user_profile_dir() / (name + '.toml')}, or pass a path to a .toml file."
    )


# --- reading and validating -----------------------------------------------------------------

def load_profile(name_or_path: str) -> Profile:
    """Find, read, merge (`extends`) and validate a profile."""
    path = find_profile(name_or_path)
    data = _read_merged(path, seen=())
    return _build(data, name=path.stem, path=path)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = utf8_text(path.read_bytes(), f"Profile {path}")
    except IsADirectoryError:
        raise ConfigError(f"Profile {path} is a directory: give a profile's .toml file.") from None
    except OSError as e:
        raise ConfigError(f"Cannot read profile {path}: {e.strerror}.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message already ends with "(at line L, column C)".
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None


def utf8_text(data: bytes | str, what: str) -> str:
    """`data` as text if it is valid UTF-8, else a ConfigError naming `what` and the first bad
    byte. A str from stdin or argv carries undecodable bytes as surrogates (surrogateescape):
    they count as bad bytes too."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data
        except UnicodeEncodeError as e:
            bad = data[e.start]
            byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
            at = f"byte 0x{byte:02x}" if byte is not None else f"character {bad!r}"
            raise ConfigError(f"{what} is not UTF-8 text ({at} at character {e.start}): "
                              "give it as UTF-8.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                          f"{e.start}): save it as UTF-8.") from None


def _read_merged(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    data = _read_toml(path)
    _check_keys(data, TOP_KEYS, path, where="top level")
    data["__file__"] = path
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    if not isinstance(base_name, str):
        raise ConfigError(f"{path}: 'extends' must be a profile name (a string), got {base_name!r}.")
    base_path = _find_base(base_name, path)
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        raise ConfigError(f"{path}: extends = {base_name!r} forms a cycle: a profile cannot "
                          "extend itself, directly or through others.")
    base = _read_merged(base_path, (*seen, path.resolve()))
    merged = {**base, **{k: v for k, v in data.items() if k not in SECTIONS}}
    for section in SECTIONS:
        if section in data:
            if not isinstance(data[section], dict):
                merged[section] = data[section]  # reported as a type error by _build
            else:
                merged[section] = {**base.get(section, {}), **data[section]}
    return merged


def _find_base(name: str, child: Path) -> Path:
    """`extends` looks next to the extending file first, so a profile shadowing a bundled
    one of the same name can still extend the bundled one."""
    sibling = child.parent / f"{name}.toml"
    if sibling.is_file() and sibling.resolve() != child.resolve():
        return sibling
    for folder in (user_profile_dir(), bundled_profile_dir()):
        candidate = folder / f"{name}.toml"
        if candidate.is_file() and candidate.resolve() != child.resolve():
            return candidate
    if name == child.stem and "/" not in name and not name.endswith(".toml"):
        return child  # only itself has that name: reported as a cycle
    try:
        return find_profile(name)
    except ConfigError as e:
        why = str(e)
        raise ConfigError(f"{child}: extends = {name!r}, but {why[:1].lower()}{why[1:]}") from None


def _check_keys(table: dict[str, Any], allowed: tuple[str, ...] | list[str], path: Path,
                where: str) -> None:
    for key in table:
        if key not in allowed and key != "__file__":
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{path}: unknown key {key!r} in {where}.{hint} "
                f"Allowed: {', '.join(allowed)}."
            )


def _build(data: dict[str, Any], name: str, path: Path | None) -> Profile:
    where = data.get("__file__", path)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: 'description' must be a string, got {description!r}.")
    specs: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        table = data.get(section)
        if table is None:
            specs[section] = None if cls is ModelSpec else cls()
            continue
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{section}] must be a table, got {table!r}.")
        specs[section] = _build_section(cls, table, section, where)
    if specs["target"] is None:
        raise ConfigError(f"{where}: a profile needs a [target] table naming the model that "
                          "verifies (model = a hub id, a directory or a .gguf file), or "
                          "extends = \"another profile\" that has one.")
    no_model = specs["draft"] is None or not specs["draft"].has_model
    if no_model and "method" not in (data.get("speculation") or {}):
        specs["speculation"] = dataclasses.replace(specs["speculation"],
                                                   method=DEFAULT_METHOD_WITHOUT_DRAFT)
    profile = Profile(name=name, path=path, description=description, **specs)
    _validate(profile, where)
    return profile


def _build_section(cls: type, table: dict[str, Any], section: str, where: Any) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _check_keys(table, list(fields), where, where=f"[{section}]")
    if cls is ModelSpec and "model" not in table and not (section == "draft" and "head" in table):
        also = " or a 'head'" if section == "draft" else ""
        raise ConfigError(f"{where}: [{section}] needs a 'model' (a hub id, a directory or a "
                          f".gguf file){also}.")
    values = {}
    for key, value in table.items():
        values[key] = _coerce(value, fields[key].type, f"{section}.{key}", where)
    if cls is ModelSpec and "quantization" not in values and _runs_stored(values):
        values["quantization"] = STORED_SCHEME  # a GGUF runs its own blocks unless told
    return cls(**values)


def _runs_stored(values: dict[str, Any]) -> bool:
    """Whether a model entry that names no quantization runs as stored: a GGUF file that
    specgen runs itself (not llama.cpp) on the CPU (its kernels are the CPU's)."""
    gguf = bool(values.get("gguf_file")) or str(values.get("model", "")).endswith(".gguf")
    return (gguf and values.get("runtime", "transformers") == "transformers"
            and not str(values.get("device", "auto")).startswith("cuda"))


def _coerce(value: Any, annotation: str, key: str, where: Any) -> Any:
    """Check a TOML value against the field's annotation (int accepted where float is)."""
    optional = "None" in annotation
    kind = annotation.replace("| None", "").strip()
    if value is None and optional:
        return None
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
    }[kind]
    if not ok:
        names = {"str": "a string", "bool": "true or false", "int": "an integer",
                 "float": "a number"}
        raise ConfigError(f"{where}: {key} must be {names[kind]}, got {value!r}.")
    if kind == "int" and abs(value) > MAX_INT:
        raise ConfigError(f"{where}: {key} = {value} is out of range (at most {MAX_INT}).")
    if kind == "float":
        return finite(value, f"{where}: {key}")
    if kind == "str":
        if "\x00" in value:
            raise ConfigError(f"{where}: {key} must not contain a NUL character.")
        return utf8_text(value, f"{where}: {key}")
    return value


def finite(value: Any, name: str) -> float:
    """`value` as a float if it is a finite number (not a bool), else a ConfigError that
    names it. Every number a user gives passes here before any model loads: profiles and
    command-line options (through `with_overrides`), chat commands, HTTP request bodies
    (whose JSON may spell NaN and Infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}.")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number, got {value!r}.")
    return number


def check_seed(seed: Any, name: str = "--seed") -> int | None:
    """A sampling seed: None, or an integer from 0 to MAX_INT (torch's generators take 64
    bits, and chat turns add their index to it)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_INT:
        raise ConfigError(f"{name} must be an integer from 0 to {MAX_INT}, got {seed!r}.")
    return seed


def _choice(value: str, allowed: tuple[str, ...], key: str, where: Any) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where}: {key} = {value!r} is not allowed.{hint} "
                          f"Allowed: {', '.join(allowed)}.")


def _validate(p: Profile, where: Any) -> None:
    """Value checks that types alone cannot express."""
    for role in ("target", "draft"):
        spec: ModelSpec | None = getattr(p, role)
        if spec is None:
            continue
        _check_head(spec, role, where)
        if not spec.model.strip() and not (role == "draft" and spec.head):
            raise ConfigError(f"{where}: {role}.model is empty.")
        _choice(spec.dtype, DTYPES, f"{role}.dtype", where)
        _choice(spec.quantization, QUANTIZATIONS, f"{role}.quantization", where)
        if not DEVICE_RE.match(spec.device):
            raise ConfigError(f"{where}: {role}.device = {spec.device!r} is not allowed. "
                              "Allowed: auto, cpu, cuda, cuda:N (N a GPU index).")
        if spec.quantization == STORED_SCHEME and not (spec.gguf_file or spec.model.endswith(".gguf")):
            raise ConfigError(f"{where}: {role}.quantization = \"{STORED_SCHEME}\" runs a GGUF file "
                              f"as stored, but {role}.model names none. Name a .gguf file (model "
                              "or gguf_file), or choose another quantization.")
        if spec.quantization == STORED_SCHEME and spec.device.startswith("cuda"):
            raise ConfigError(f"{where}: {role}.quantization = \"{STORED_SCHEME}\" runs on the CPU, "
                              f"but {role}.device = {spec.device!r}. On a GPU use \"none\" (the "
                              "GGUF converted to the dtype) or \"int4-gpu\".")
        if spec.quantization in GPU_SCHEMES and spec.device == "cpu":
            raise ConfigError(f"{where}: {role}.quantization = {spec.quantization!r} runs on a "
                              f"CUDA GPU, but {role}.device = \"cpu\". On the CPU use int4-dyn "
                              "or int4-wo; or set device = \"cuda\" (or \"auto\").")
        if spec.sha256 is not None and not SHA256_RE.match(spec.sha256):
            raise ConfigError(f"{where}: {role}.sha256 must be 64 lowercase hex digits, "
                              f"got {spec.sha256!r}.")
        if spec.gguf_file is not None and not spec.gguf_file.endswith(".gguf"):
            raise ConfigError(f"{where}: {role}.gguf_file must name a .gguf file, "
                              f"got {spec.gguf_file!r}.")
        _choice(spec.runtime, RUNTIMES, f"{role}.runtime", where)
        if spec.runtime == "llama.cpp":
            _check_llama_runtime(spec, role, where)
    s, g = p.speculation, p.generation
    if p.draft is not None and p.draft.runtime == "llama.cpp" and s.draft_vocab:
        raise ConfigError(f"{where}: speculation.draft_vocab trims the output layer of a "
                          "draft specgen runs; a llama.cpp draft always drafts over its whole "
                          "vocabulary. Set speculation.draft_vocab = 0 (a profile this one "
                          "extends may set it), or draft.runtime = \"transformers\".")
    _choice(s.method, METHODS, "speculation.method", where)
    if (p.draft is None or not p.draft.has_model) and s.method == "draft-model":
        raise ConfigError(f"{where}: speculation.method = {s.method!r} needs a [draft] model. "
                          "Add a [draft] table, or use method = \"self\" or \"prompt-lookup\".")
    if s.method in HEAD_KINDS and (p.draft is None or p.draft.kind != s.method):
        have = (f"draft.kind = {p.draft.kind!r}" if p.draft is not None and p.draft.kind
                else "no head")
        raise ConfigError(f"{where}: speculation.method = {s.method!r} drafts with a {s.method} "
                          f"head, and the profile has {have}. Set [draft] head = \"...\" and "
                          f"kind = \"{s.method}\" (docs/heads.md).")
    if s.skip_layers is not None:
        try:
            attention, mlp = parse_skip_layers(s.skip_layers)
        except ConfigError as e:
            raise ConfigError(f"{where}: speculation.skip_layers: {e}") from None
        if not attention and not mlp:
            raise ConfigError(f"{where}: speculation.skip_layers names no sub-layer. Name some "
                              "(e.g. \"m8,m10,a12\"), or remove the key to use the tuned or "
                              "default set.")
    if not MIN_K <= s.num_speculative_tokens <= MAX_K:
        raise ConfigError(f"{where}: speculation.num_speculative_tokens must be from {MIN_K} to {MAX_K} "
                          f"(0 turns speculation off), got {s.num_speculative_tokens}.")
    if s.draft_vocab < 0:
        raise ConfigError(f"{where}: speculation.draft_vocab must be >= 0 (0 drafts over the "
                          f"whole vocabulary), got {s.draft_vocab}.")
    if not 0.0 <= s.draft_confidence < 1.0:
        raise ConfigError(f"{where}: speculation.draft_confidence must be in [0, 1) (0 never "
                          f"ends a draft early; 0.4 is a good start), got {s.draft_confidence}.")
    if s.draft_window and s.draft_window < MIN_DRAFT_WINDOW or s.draft_window < 0:
        raise ConfigError(f"{where}: speculation.draft_window must be 0 (the draft reads the whole "
                          f"context) or at least {MIN_DRAFT_WINDOW} tokens, got {s.draft_window}.")
    if not 1 <= s.min_ngram <= s.max_ngram <= MAX_NGRAM:
        raise ConfigError(f"{where}: speculation needs 1 <= min_ngram <= max_ngram <= "
                          f"{MAX_NGRAM}, got min_ngram = {s.min_ngram}, max_ngram = {s.max_ngram}.")
    if g.temperature < 0:
        raise ConfigError(f"{where}: generation.temperature must be >= 0 (0 is greedy), "
                          f"got {g.temperature}.")
    if 0 < g.temperature < MIN_TEMPERATURE:
        raise ConfigError(f"{where}: generation.temperature must be 0 (greedy) or at least "
                          f"{MIN_TEMPERATURE:g}, got {g.temperature}: a temperature that small "
                          "is greedy in effect.")
    if not 0 < g.top_p <= 1:
        raise ConfigError(f"{where}: generation.top_p must be in (0, 1], got {g.top_p}.")
    if g.top_k < 0:
        raise ConfigError(f"{where}: generation.top_k must be >= 0 (0 is off), got {g.top_k}.")
    if g.max_new_tokens < 1:
        raise ConfigError(f"{where}: generation.max_new_tokens must be >= 1, "
                          f"got {g.max_new_tokens}.")


def _check_head(spec: ModelSpec, role: str, where: Any) -> None:
    if role != "draft" and (spec.head is not None or spec.kind is not None):
        raise ConfigError(f"{where}: {role}.head and {role}.kind are not allowed: a head drafts, "
                          "so it belongs in [draft].")
    if spec.head is not None and not spec.head.strip():
        raise ConfigError(f"{where}: draft.head is empty. Give a folder, a hub id, or the name "
                          "of a head trained with `specgen heads train`.")
    if spec.head is not None and spec.kind is None:
        raise ConfigError(f"{where}: draft.head needs draft.kind, the head's kind: "
                          f"{listing(HEAD_KINDS)}.")
    if spec.kind is not None:
        _choice(spec.kind, HEAD_KINDS, "draft.kind", where)
        if spec.head is None:
            raise ConfigError(f"{where}: draft.kind = {spec.kind!r} needs draft.head, the head "
                              "itself (a folder, a hub id, or a trained head's name).")


def _check_llama_runtime(spec: ModelSpec, role: str, where: Any) -> None:
    if role == "target":
        raise ConfigError(
            f"{where}: target.runtime = \"llama.cpp\" is not allowed: the target checks K drafts "
            "in one pass, and llama.cpp's CPU kernels cost nearly a decode step per token "
            "checked. Run the draft in llama.cpp instead (draft.runtime).")
    if not (spec.model.endswith(".gguf") or spec.gguf_file):
        raise ConfigError(f"{where}: draft.runtime = \"llama.cpp\" runs a GGUF file, but "
                          f"draft.model = {spec.model!r} names none. Point draft.model at a .gguf "
                          "file (or set gguf_file), or set draft.runtime = \"transformers\".")
    if spec.device not in ("auto", "cpu"):
        raise ConfigError(f"{where}: a llama.cpp draft runs on the CPU, but draft.device = "
                          f"{spec.device!r}. Set draft.device = \"cpu\", or set "
                          "draft.runtime = \"transformers\" to draft on the GPU.")


# --- skip sets (method "self") --------------------------------------------------------------

SKIP_ITEM_RE = re.compile(r"^([am]?)(\d+)(?:-(\d+))?$")
SKIP_SYNTAX = ("comma-separated items: mN skips layer N's MLP, aN its attention, N both; "
               "a range such as m8-12 names several layers (layers count from 0)")


def parse_skip_layers(text: str) -> tuple[frozenset[int], frozenset[int]]:
    """A skip set's text ("m8,m10,a12,20", ranges "m8-12") as (attention, mlp) layer indices.
    Only the syntax is checked here; the model's layer count at load time."""
    attention: set[int] = set()
    mlp: set[int] = set()
    for item in (part.strip() for part in text.replace(" ", ",").split(",")):
        if not item:
            continue
        match = SKIP_ITEM_RE.match(item.lower())
        if match is None:
            raise ConfigError(f"{item!r} is not a sub-layer: {SKIP_SYNTAX}.")
        kind, first, last = match.group(1), int(match.group(2)), match.group(3)
        last = first if last is None else int(last)
        if last < first:
            raise ConfigError(f"{item!r} is an empty range: write the lower layer first.")
        layers = range(first, last + 1)
        if kind in ("a", ""):
            attention.update(layers)
        if kind in ("m", ""):
            mlp.update(layers)
    return frozenset(attention), frozenset(mlp)


def format_skip_layers(attention: frozenset[int] | set[int], mlp: frozenset[int] | set[int]) -> str:
    """The text of a skip set, layer by layer ("m8,a12,20"): what parse_skip_layers reads."""
    items = []
    for i in sorted(set(attention) | set(mlp)):
        items.append(str(i) if i in attention and i in mlp else f"a{i}" if i in attention else f"m{i}")
    return ",".join(items)


# --- command-line overrides -----------------------------------------------------------------

_OVERRIDES = {
    "temperature": ("generation", "temperature"),
    "top_p": ("generation", "top_p"),
    "top_k": ("generation", "top_k"),
    "max_new_tokens": ("generation", "max_new_tokens"),
    "system_prompt": ("generation", "system_prompt"),
    "chat_template": ("generation", "chat_template"),
    "num_speculative_tokens": ("speculation", "num_speculative_tokens"),
    "adaptive": ("speculation", "adaptive"),
    "tree": ("speculation", "tree"),
    "method": ("speculation", "method"),
    "draft_window": ("speculation", "draft_window"),
    "target_quantization": ("target", "quantization"),
    "target_dtype": ("target", "dtype"),
    "draft_quantization": ("draft", "quantization"),
    "draft_runtime": ("draft", "runtime"),
}


def with_overrides(profile: Profile, *, where: str = "command line", **overrides: Any) -> Profile:
    """A copy of `profile` with command-line values applied (None means "not given"),
    validated again as a profile is (types, finite numbers, ranges), so that any caller (a
    chat command, an HTTP request: `where` names it in errors) checks its values before a
    model runs. `device` sets both models' device (but a llama.cpp draft's, always the CPU)."""
    data = profile.to_dict()
    data["__file__"] = where
    for name, value in overrides.items():
        if value is None:
            continue
        if name == "device":
            targets = [("target", "device"), ("draft", "device")]
        elif name in _OVERRIDES:
            targets = [_OVERRIDES[name]]
        else:
            allowed = [*_OVERRIDES, "device"]
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown override {name!r}.{hint} Allowed: {', '.join(allowed)}.")
        for section, key in targets:
            if section in data:
                data[section][key] = value
            elif section != "draft" or name != "device":
                raise ConfigError(f"Cannot set {name}: profile {profile.name!r} has no [{section}].")
    if overrides.get("device") and data.get("draft", {}).get("runtime") == "llama.cpp":
        data["draft"]["device"] = "cpu"  # --device moves what it can; llama.cpp drafts on the CPU
    if overrides.get("draft_runtime") == "llama.cpp" and "speculation" in data:
        data["speculation"]["draft_vocab"] = 0  # llama.cpp drafts over the whole vocabulary
    return _build(data, name=profile.name, path=profile.path)
