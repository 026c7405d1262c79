"""Profiles: schema validation, every bad-input message, search order, extends, overrides,
and the `specgen profiles` commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.cli import app
from specgen.errors import ConfigError
from specgen.profiles import (DEFAULT_PROFILE, bundled_profile_dir, list_profiles, load_profile,
                              with_overrides)

BUNDLED = {"qwen-coder-demo", "qwen-coder-demo-fp32", "qwen-coder-demo-int8", "qwen-coder-demo-int8-llamacpp",
           "qwen-coder-demo-int8-int4", "qwen-coder-demo-llamacpp", "llama3-70b", "llama3-8b", "llama3-8b-int4",
           "qwen2.5-32b", "qwen2.5-coder-7b"}

MINIMAL = """
description = "test pair"
[target]
model = "org/big"
[draft]
model = "org/small"
"""


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "user-profiles"
    folder.mkdir()
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(folder))
    return folder


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def error_of(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_profile(str(write(tmp_path, "bad", text)))
    return str(e.value)


# --- bundled profiles -------------------------------------------------------------------------

def test_bundled_profiles_all_load_and_describe_hardware():
    names = {name for name, _ in list_profiles()}
    assert BUNDLED <= names
    for name in BUNDLED:
        p = load_profile(name)
        assert p.path.parent == bundled_profile_dir()
        assert p.draft is not None and p.speculation.method == "hybrid"  # the default where a draft is
        assert "GB" in p.description  # says what memory it needs


def test_the_llamacpp_demo_profile_keeps_the_bf16_target_and_drafts_in_llama_cpp():
    p = load_profile("qwen-coder-demo-llamacpp")
    base = load_profile("qwen-coder-demo")
    assert p.target == base.target and p.draft.gguf_file == base.draft.gguf_file
    assert p.draft.runtime == "llama.cpp" and p.draft.quantization == "int8-dyn"  # the peer's copy
    assert p.speculation.num_speculative_tokens == 16 and p.speculation.adaptive


def test_the_int8_int4_demo_profile_keeps_the_int8_target_and_drafts_in_int4_dyn():
    p = load_profile("qwen-coder-demo-int8-int4")
    base = load_profile("qwen-coder-demo-int8")
    assert p.target == base.target and p.speculation == base.speculation
    assert (p.draft.quantization, p.draft.dtype, p.draft.runtime) == ("int4-dyn", "float32", "transformers")
    assert p.draft.gguf_file == base.draft.gguf_file


def test_the_int4_demo_profile_drafts_by_prompt_lookup_alone():
    p = load_profile("qwen-coder-demo-int4")
    assert p.draft is None and p.speculation.method == "prompt-lookup" and p.speculation.adaptive
    assert (p.target.quantization, p.target.dtype) == ("int4-dyn", "float32")
    assert p.target.sha256 == load_profile("qwen-coder-demo").target.sha256
    assert "GB" in p.description and "AVX2" in p.description


def test_default_profile_names_upstream_gguf_with_sha256():
    p = load_profile(DEFAULT_PROFILE)
    assert p.target.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert p.target.gguf_file == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert p.target.sha256.startswith("cc324af0")
    assert p.draft.model == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert p.draft.sha256.startswith("1d961463")


def test_large_profiles_quantize_the_target():
    assert load_profile("llama3-70b").target.quantization == "int4-gpu"  # flat verify passes
    int4 = load_profile("llama3-8b-int4")
    assert int4.target.quantization == "int4-gpu" and int4.target.device == "cuda"
    assert int4.speculation == load_profile("llama3-8b").speculation
    assert load_profile("qwen2.5-32b").target.quantization == "nf4"
    # Pairs come from one family, so they share a tokenizer.
    assert "Llama-3.2" in load_profile("llama3-8b").draft.model
    assert "Coder-0.5B" in load_profile("qwen2.5-coder-7b").draft.model
    fp32 = load_profile("qwen-coder-demo-fp32")  # the demo pair, target in fp32
    assert (fp32.target.dtype, fp32.draft.dtype) == ("float32", "bfloat16")
    assert fp32.target.sha256 == load_profile("qwen-coder-demo").target.sha256


# --- search order -------------------------------------------------------------------------------

def test_user_profile_shadows_bundled_and_is_listed_first(user_dir):
    write(user_dir, "llama3-8b", MINIMAL)
    write(user_dir, "mine", MINIMAL)
    listed = list_profiles()
    names = [n for n, _ in listed]
    assert names[:2] == ["llama3-8b", "mine"]
    assert names.count("llama3-8b") == 1
    assert load_profile("llama3-8b").target.model == "org/big"
    assert load_profile("mine").path == user_dir / "mine.toml"


def test_a_path_loads_that_file(tmp_path):
    path = write(tmp_path, "elsewhere", MINIMAL)
    p = load_profile(str(path))
    assert (p.name, p.path, p.description) == ("elsewhere", path, "test pair")


def test_defaults_fill_missing_sections(tmp_path):
    p = load_profile(str(write(tmp_path, "p", MINIMAL)))
    assert p.target.dtype == "auto" and p.target.quantization == "none"
    assert p.speculation.num_speculative_tokens == 4 and p.speculation.adaptive
    assert p.generation.temperature == 0.0 and p.generation.chat_template


def test_extends_merges_tables(user_dir):
    write(user_dir, "fast8b", 'extends = "llama3-8b"\n[target]\nquantization = "nf4"\n'
                              '[generation]\ntemperature = 0.7\n')
    p = load_profile("fast8b")
    assert p.target.model == "meta-llama/Llama-3.1-8B-Instruct"  # inherited
    assert p.target.quantization == "nf4"  # overridden
    assert p.generation.temperature == 0.7 and p.generation.max_new_tokens == 512
    assert p.draft.model == "meta-llama/Llama-3.2-1B-Instruct"


def test_extends_a_bundled_profile_of_the_same_name(user_dir):
    write(user_dir, "llama3-8b", 'extends = "llama3-8b"\n[speculation]\nnum_speculative_tokens = 7\n')
    p = load_profile("llama3-8b")
    assert p.speculation.num_speculative_tokens == 7
    assert p.target.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_extends_cycle_is_refused(user_dir):
    write(user_dir, "a", 'extends = "b"\n')
    write(user_dir, "b", 'extends = "a"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_profile("a")


def test_prompt_lookup_needs_no_draft(tmp_path):
    p = load_profile(str(write(tmp_path, "pl", '[target]\nmodel = "org/big"\n'
                                               '[speculation]\nmethod = "prompt-lookup"\n')))
    assert p.draft is None


# --- bad input ------------------------------------------------------------------------------------

def test_missing_profile_lists_names_and_suggests():
    with pytest.raises(ConfigError) as e:
        load_profile("lama3-8b")
    msg = str(e.value)
    assert "No profile named 'lama3-8b'" in msg
    assert "Did you mean 'llama3-8b'?" in msg
    assert all(name in msg for name in BUNDLED)


def test_missing_profile_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile("no/such/profile.toml")


def test_toml_syntax_error_names_file_line_and_column(tmp_path):
    msg = error_of('[target]\nmodel = "x"\ndtype = bfloat16\n', tmp_path)
    assert "bad.toml" in msg and "line 3" in msg and "column" in msg


@pytest.mark.parametrize("text, expected", [
    ('descripton = "x"\n' + MINIMAL, "unknown key 'descripton' in top level. Did you mean 'description'?"),
    (MINIMAL + '[generation]\ntemprature = 0.5\n', "unknown key 'temprature' in [generation]. Did you mean 'temperature'?"),
    (MINIMAL.replace("[draft]", "[draft]\nquantisation = 'nf4'"), "Did you mean 'quantization'?"),
])
def test_unknown_key_suggests(tmp_path, text, expected):
    assert expected in error_of(text, tmp_path)


@pytest.mark.parametrize("text, expected", [
    (MINIMAL + "[speculation]\nnum_speculative_tokens = \"4\"\n", "speculation.num_speculative_tokens must be an integer, got '4'"),
    (MINIMAL + "[speculation]\nadaptive = 1\n", "speculation.adaptive must be true or false, got 1"),
    (MINIMAL + "[generation]\ntemperature = true\n", "generation.temperature must be a number"),
    (MINIMAL.replace('model = "org/big"', "model = 5"), "target.model must be a string"),
    ('target = "org/big"\n', "[target] must be a table"),
])
def test_wrong_type(tmp_path, text, expected):
    assert expected in error_of(text, tmp_path)


@pytest.mark.parametrize("key, value, expected", [
    ("quantization", "nf8", "target.quantization = 'nf8' is not allowed. Did you mean 'nf4'?"),
    ("dtype", "bf16", "target.dtype = 'bf16' is not allowed."),
    ("device", "gpu", "target.device = 'gpu' is not allowed. Allowed: auto, cpu, cuda, cuda:N"),
    ("sha256", "abc", "target.sha256 must be 64 lowercase hex digits"),
    ("gguf_file", "model.bin", "target.gguf_file must name a .gguf file"),
])
def test_unknown_values(tmp_path, key, value, expected):
    text = MINIMAL.replace('model = "org/big"', f'model = "org/big"\n{key} = "{value}"')
    msg = error_of(text, tmp_path)
    assert expected in msg
    if key == "dtype":
        assert "Allowed: auto, bfloat16, float16, float32" in msg


def test_quantization_names_are_accepted(tmp_path):
    for q in ("int8-wo", "int4-wo", "int8-dyn", "fp4", "int8"):
        text = MINIMAL.replace('model = "org/big"', f'model = "org/big"\nquantization = "{q}"')
        assert load_profile(str(write(tmp_path, "q", text))).target.quantization == q


@pytest.mark.parametrize("extra, expected", [
    ("[speculation]\nmethod = \"lookahead\"\n", "speculation.method = 'lookahead' is not allowed"),
    ("[speculation]\nnum_speculative_tokens = -1\n", "must be from 0 to 32"),
    ("[speculation]\nnum_speculative_tokens = 33\n", "must be from 0 to 32"),
    ("[speculation]\nmin_ngram = 4\n", "min_ngram <= max_ngram"),
    ("[speculation]\ndraft_confidence = 1.0\n", "draft_confidence must be in [0, 1)"),
    ("[speculation]\ndraft_window = -1\n", "draft_window must be 0 (the draft reads the whole"),
    ("[speculation]\ndraft_window = 8\n", "or at least 16 tokens, got 8"),
    ("[speculation]\ndraft_window = 1.5\n", "draft_window must be an integer"),
    ("[generation]\ntop_p = 1.5\n", "top_p must be in (0, 1]"),
    ("[generation]\nmax_new_tokens = 0\n", "max_new_tokens must be >= 1"),
])
def test_bad_values(tmp_path, extra, expected):
    assert expected in error_of(MINIMAL + extra, tmp_path)


def test_draft_model_method_needs_a_draft(tmp_path):
    text = '[target]\nmodel = "org/big"\n[speculation]\nmethod = "draft-model"\n'
    assert "needs a [draft] model" in error_of(text, tmp_path)
    # hybrid without a draft model is lookup, then the target itself (method self)
    text = '[target]\nmodel = "org/big"\n[speculation]\nmethod = "hybrid"\n'
    assert load_profile(str(write(tmp_path, "hybrid", text))).speculation.method == "hybrid"


def test_the_default_method_is_the_hybrid_with_a_draft_and_prompt_lookup_without(tmp_path):
    assert load_profile(str(write(tmp_path, "pair", MINIMAL))).speculation.method == "hybrid"
    alone = load_profile(str(write(tmp_path, "alone", '[target]\nmodel = "org/big"\n')))
    assert alone.draft is None and alone.speculation.method == "prompt-lookup"
    again = with_overrides(alone, temperature=0.5)  # a resolved default survives overrides
    assert again.speculation.method == "prompt-lookup"


def test_model_entry_needs_model(tmp_path):
    assert "[draft] needs a 'model'" in error_of(MINIMAL.replace('model = "org/small"', 'dtype = "auto"'), tmp_path)


GGUF_DRAFT = MINIMAL.replace('model = "org/small"', 'model = "small.gguf"\nruntime = "llama.cpp"')


def test_a_gguf_draft_may_run_in_llama_cpp(tmp_path):
    p = load_profile(str(write(tmp_path, "l", GGUF_DRAFT)))
    assert p.draft.runtime == "llama.cpp" and p.target.runtime == "transformers"
    in_repo = MINIMAL.replace('model = "org/small"', 'model = "org/small-GGUF"\n'
                              'gguf_file = "small-q4_k_m.gguf"\nruntime = "llama.cpp"')
    assert load_profile(str(write(tmp_path, "r", in_repo))).draft.runtime == "llama.cpp"


@pytest.mark.parametrize("text, expected", [
    (MINIMAL.replace('model = "org/small"', 'model = "org/small"\nruntime = "llama.cpp"'),
     "draft.runtime = \"llama.cpp\" runs a GGUF file, but draft.model = 'org/small' names none"),
    (MINIMAL.replace('model = "org/big"', 'model = "big.gguf"\nruntime = "llama.cpp"'),
     "target.runtime = \"llama.cpp\" is not allowed"),
    (GGUF_DRAFT.replace('runtime = "llama.cpp"', 'runtime = "llama.cpp"\ndevice = "cuda"'),
     "a llama.cpp draft runs on the CPU, but draft.device = 'cuda'"),
    (GGUF_DRAFT + "[speculation]\ndraft_vocab = 32000\n",
     "a llama.cpp draft always drafts over its whole vocabulary"),
    (MINIMAL.replace('model = "org/small"', 'model = "org/small"\nruntime = "llamacpp"'),
     "draft.runtime = 'llamacpp' is not allowed. Did you mean 'llama.cpp'?"),
])
def test_bad_runtimes(tmp_path, text, expected):
    assert expected in error_of(text, tmp_path)


def test_device_override_leaves_a_llama_cpp_draft_on_the_cpu(tmp_path):
    p = load_profile(str(write(tmp_path, "l", GGUF_DRAFT)))
    moved = with_overrides(p, device="cuda")
    assert moved.target.device == "cuda" and moved.draft.device == "cpu"
    assert with_overrides(load_profile("llama3-8b"), draft_runtime=None).draft.runtime == "transformers"
    with pytest.raises(ConfigError, match="names none"):  # a hub draft that is not a GGUF file
        with_overrides(load_profile("llama3-8b"), draft_runtime="llama.cpp")


def test_the_default_cuts_its_drafts_vocabulary_but_not_when_llama_cpp_drafts():
    """The default drafts over part of the vocabulary; its llama.cpp-draft variants, and
    --draft-runtime llama.cpp on the command line, draft over all of it (llama.cpp's draft
    cannot be cut) instead of refusing a cut the user never wrote."""
    default = load_profile("qwen-coder-demo")
    assert default.speculation.draft_vocab > 0
    assert load_profile("qwen-coder-demo-llamacpp").speculation.draft_vocab == 0
    assert load_profile("qwen-coder-demo-int8-llamacpp").speculation.draft_vocab == 0
    switched = with_overrides(default, draft_runtime="llama.cpp")
    assert switched.draft.runtime == "llama.cpp" and switched.speculation.draft_vocab == 0


# --- overrides ---------------------------------------------------------------------------------------

def test_overrides_apply_and_none_is_ignored():
    p = with_overrides(load_profile("llama3-8b"), temperature=0.8, top_k=None, device="cpu",
                       target_quantization="nf4", num_speculative_tokens=2, method="hybrid",
                       chat_template=False)
    assert p.generation.temperature == 0.8 and p.generation.top_k == 0
    assert p.target.device == p.draft.device == "cpu"
    assert p.target.quantization == "nf4" and p.draft.quantization == "none"
    assert p.speculation.num_speculative_tokens == 2 and p.speculation.method == "hybrid"
    assert not p.generation.chat_template
    assert p.name == "llama3-8b"


def test_overrides_are_validated():
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        with_overrides(load_profile("llama3-8b"), temperature=-1.0)
    with pytest.raises(ConfigError, match="draft_quantization = 'q4' is not allowed|draft.quantization = 'q4'"):
        with_overrides(load_profile("llama3-8b"), draft_quantization="q4")
    with pytest.raises(ConfigError, match="Did you mean 'temperature'"):
        with_overrides(load_profile("llama3-8b"), temprature=0.5)


def test_override_draft_on_a_profile_without_draft(tmp_path):
    p = load_profile(str(write(tmp_path, "pl", '[target]\nmodel = "org/big"\n'
                                               '[speculation]\nmethod = "prompt-lookup"\n')))
    assert with_overrides(p, device="cpu").target.device == "cpu"
    with pytest.raises(ConfigError, match="has no \\[draft\\]"):
        with_overrides(p, draft_quantization="nf4")


# --- the commands -----------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_list_shows_every_profile(user_dir):
    write(user_dir, "mine", MINIMAL)
    result = runner.invoke(app, ["profiles", "list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in [*BUNDLED, "mine"]:
        assert name in result.output
    assert "nf4" in result.output and "GB" in result.output


def test_cli_show_prints_resolved_toml():
    result = runner.invoke(app, ["profiles", "show", "qwen2.5-32b"])
    assert result.exit_code == 0, result.output
    assert 'model = "Qwen/Qwen2.5-32B-Instruct"' in result.output
    assert 'quantization = "nf4"' in result.output
    assert "max_new_tokens = 512" in result.output


def test_cli_validate_ok(tmp_path):
    result = runner.invoke(app, ["profiles", "validate", str(write(tmp_path, "good", MINIMAL))])
    assert result.exit_code == 0 and "ok:" in result.output


@pytest.mark.parametrize("args_text, expected", [
    (None, "No profile named 'qwen-coder'. Did you mean 'qwen-coder-demo'?"),
    ('[target\nmodel = "x"\n', "TOML syntax error"),
    (MINIMAL + "[generation]\ntop_kk = 3\n", "Did you mean 'top_k'?"),
    (MINIMAL + "[generation]\nmax_new_tokens = 1.5\n", "must be an integer"),
    (MINIMAL.replace('model = "org/big"', 'model = "org/big"\nquantization = "int3"'), "is not allowed"),
    (MINIMAL.replace('model = "org/big"', 'model = "org/big"\ndtype = "half"'), "target.dtype = 'half'"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, args_text, expected):
    if args_text is None:
        args = ["profiles", "show", "qwen-coder"]
    else:
        args = ["profiles", "validate", str(write(tmp_path, "bad", args_text))]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
    assert result.output.strip().startswith("error:")
    assert result.exception is None or isinstance(result.exception, SystemExit)
