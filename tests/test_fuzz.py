"""Property-based fuzzing (hypothesis) of what users type: random TOML documents through the
profile loader, random option values through `specgen run`'s parser, random arguments to
chat's commands. Never a traceback: a clear error, or a configuration that is valid (one
that loads again, and whose numbers are finite and in range). Nothing loads a model."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specgen.cli import app
from specgen.commands.profiles import to_toml
from specgen.errors import SpecgenError
from specgen.profiles import SECTIONS, TOP_KEYS, Profile, load_profile, with_overrides

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# --- random TOML documents --------------------------------------------------------------------

KEYS = {section: [f.name for f in __import__("dataclasses").fields(cls)]
        for section, cls in SECTIONS.items()}
WORDS = ["auto", "cpu", "cuda", "cuda:1", "none", "int8-dyn", "int4-wo", "nf4", "bfloat16",
         "float32", "draft-model", "prompt-lookup", "hybrid", "llama.cpp", "transformers",
         "org/model", "x.gguf", "qwen-coder-demo", "", " ", "a" * 64, "0" * 64]
NUMBERS = [0, 1, -1, 4, 32, 33, 2**31, 2**63 - 1, 2**63, 10**30, 0.0, 0.5, 1.0, 1.5, -0.0,
           1e-300, 1e-6, 1e300, math.nan, math.inf, -math.inf]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else "inf" if value == math.inf else (
            "-inf" if value == -math.inf else repr(value))
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string (JSON's escapes are TOML's)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


scalars = st.one_of(
    st.booleans(), st.integers(), st.floats(), st.sampled_from(NUMBERS), st.sampled_from(WORDS),
    st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=5),
                                   scalars, max_size=2))
def plausible(section: str, key: str):
    """Values of the key's own type, near and past its limits: most documents then get
    as far as the range checks."""
    kind = SECTIONS[section].__dataclass_fields__[key].type
    if "bool" in kind:
        return st.booleans()
    if "int" in kind:
        return st.one_of(st.sampled_from([v for v in NUMBERS if type(v) is int]), st.integers())
    if "float" in kind:
        return st.one_of(st.sampled_from(NUMBERS), st.floats())
    return st.sampled_from(WORDS)


def section_tables(section: str):
    known = st.sampled_from(KEYS[section]).flatmap(
        lambda key: st.tuples(st.just(key), st.one_of(plausible(section, key), plausible(
            section, key), values)))
    unknown = st.tuples(st.text(string.ascii_lowercase + "_", min_size=1, max_size=8), values)
    return st.lists(st.one_of(known, known, known, unknown), max_size=5).map(dict)


sections = st.fixed_dictionaries(
    {"target": section_tables("target").map(lambda t: {"model": "org/big", **t})},
    optional={section: section_tables(section) for section in KEYS if section != "target"})
tops = st.dictionaries(st.sampled_from([*TOP_KEYS, "modle", "extend"]), values, max_size=2)


@st.composite
def toml_documents(draw) -> str:
    top = {k: v for k, v in draw(tops).items() if k not in SECTIONS}
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    tables = draw(sections)
    if draw(st.integers(0, 9)) == 0:  # now and then, no [target] at all
        tables.pop("target")
    for section, table in tables.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def check_valid(profile: Profile) -> None:
    """A profile the loader accepted: a target, finite numbers, and it validates again."""
    assert profile.target is not None and profile.target.model.strip()
    for section in ("speculation", "generation", "target", "draft"):
        spec = getattr(profile, section)
        for value in ([] if spec is None else vars(spec).values()):
            if isinstance(value, float):
                assert math.isfinite(value), (section, value)
    assert with_overrides(profile) == profile


def load_or_refuse(path: Path) -> None:
    try:
        profile = load_profile(str(path))
    except SpecgenError as e:
        assert "\n" not in str(e) and str(e).strip()
        return
    check_valid(profile)
    path.write_text(to_toml(profile.to_dict()), encoding="utf-8")  # `specgen profiles show`
    again = load_profile(str(path))
    assert again.to_dict() == profile.to_dict()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FAST
@given(doc=toml_documents())
@example(doc='[target]\nmodel = "org/big"\n[generation]\ntemperature = nan\n')
@example(doc='[target]\nmodel = "org/big"\n[generation]\ntop_p = inf\n')
@example(doc='[target]\nmodel = "org/big"\n[speculation]\nmax_ngram = 1000000000\n'
             'method = "prompt-lookup"\n')
@example(doc='[draft]\nmodel = "org/small"\n')
@example(doc='description = "\x7f"\n[target]\nmodel = "org/big"\n')
def test_random_profiles_load_or_are_refused_in_one_line(folder, doc):
    path = folder / "p.toml"
    path.write_text(doc, encoding="utf-8")
    load_or_refuse(path)


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(max_size=80), st.text(max_size=80).map(str.encode)))
@example(data=b'description = "\xff"\n')
def test_random_bytes_as_a_profile(folder, data):
    path = folder / "r.toml"
    path.write_bytes(b'[target]\nmodel = "org/x"\n' + data)
    load_or_refuse(path)


# --- random `specgen run` options -------------------------------------------------------------

class Reached(Exception):
    """The options parsed and the profile validated: the models were about to load."""


NUMERIC = ["nan", "inf", "-inf", "1e309", "-0", "0", "1", "-1", "0.5", "1.0001", "33", "4",
           "18446744073709551615", "9223372036854775808", "1e-30", "1e-5", "abc", "", " 2"]
OPTIONS = {  # option: values to try beside random text
    "--max-new-tokens": NUMERIC, "--temperature": NUMERIC, "--top-p": NUMERIC,
    "--top-k": NUMERIC, "--seed": NUMERIC, "--k": NUMERIC,
    "--method": ["draft-model", "prompt-lookup", "hybrid", "magic", ""],
    "--device": ["auto", "cpu", "cuda:0", "cuda:x", "tpu"],
    "--target-quantization": ["none", "int8-dyn", "int4-wo", "nf4", "int3"],
    "--draft-quantization": ["none", "int8-dyn", "int4-dyn", "fp8"],
    "--draft-runtime": ["transformers", "llama.cpp", "onnx"],
    "--format": ["text", "json", "xml"], "--system": ["be brief", "", "\udcff"],
}
FLAGS = ["--raw", "--no-adaptive", "--no-color", "--record-prompt"]

option_lists = st.lists(st.one_of(
    st.sampled_from(sorted(OPTIONS)).flatmap(lambda option: st.tuples(st.just(option), st.one_of(
        st.sampled_from(OPTIONS[option]), st.sampled_from(OPTIONS[option]), st.text(max_size=8)))),
    st.tuples(st.sampled_from(FLAGS))), max_size=4)


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "fuzz.toml"
    path.write_text('[target]\nmodel = "org/big"\n[draft]\nmodel = "org/small"\n')
    return path


@settings(FAST, max_examples=100)
@given(options=option_lists, prompt=st.text(max_size=20))
@example(options=[("--temperature", "nan")], prompt="hi")
@example(options=[("--top-p", "inf")], prompt="hi")
@example(options=[("--temperature", "1e-30")], prompt="hi")
@example(options=[("--system", "\udcff")], prompt="hi")
@example(options=[], prompt="hi \udcff")
def test_random_run_options_parse_or_are_refused(profile_file, monkeypatch, options, prompt):
    seen: list[Profile] = []

    def load_session(prof, **options):
        seen.append(prof)
        raise Reached

    monkeypatch.setattr("specgen.cli.run.load_session", load_session)
    args = ["run", "-p", str(profile_file), *[a for option in options for a in option],
            "--", prompt]
    result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Reached):
        (prof,) = seen
        check_valid(prof)
        assert prompt.strip(), "an empty prompt must be refused"
        prompt.encode("utf-8")  # text the tokenizer can take
        for text in (prof.generation.system_prompt or "",):
            text.encode("utf-8")
        t = prof.generation.temperature
        assert t == 0 or t >= 1e-5, "a temperature this small overflows the scaled logits"
        return
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert "error" in result.output.lower()


# --- random chat command arguments ------------------------------------------------------------

@pytest.fixture(scope="module")
def chat(tiny_profile):
    from specgen.commands.chat import Chat
    from specgen.app.session import open_session

    return Chat(open_session(load_profile(str(tiny_profile))))


@settings(max_examples=100, deadline=None)
@example(name="temperature", arg="nan")
@example(name="save", arg="a\x00b")
@given(name=st.sampled_from(["k", "temperature", "adaptive", "system", "save", "nope"]),
       arg=st.one_of(st.sampled_from(NUMERIC),
                     st.text(max_size=10).filter(lambda s: "\n" not in s and "\r" not in s)))
def test_random_chat_commands_reply_and_keep_a_valid_profile(chat, tmp_path_factory, name, arg):
    if name == "save":
        arg = str(tmp_path_factory.mktemp("save") / (arg.replace("/", "_") or "x"))
    reply = chat.command(name, arg)
    assert all("\n" not in str(line) for line in reply.lines)
    check_valid(chat.session.profile)
    assert chat.session.generator.k_max == chat.session.profile.speculation.num_speculative_tokens
