"""`specgen export`: the printed command lines use only the field and flag names of the
engines' current releases, pinned here from their sources (not from specgen's code)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.cli import app
from specgen.profiles import load_profile, with_overrides
from specgen.commands.export import Unsupported, llamacpp, vllm

SRC = str(Path(__file__).resolve().parents[1] / "src")

# vLLM: vllm/config/speculative.py (SpeculativeConfig fields and the SpeculativeMethod
# Literal) on main after v0.28, and the engine arguments of vllm/engine/arg_utils.py.
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size",
                  "prompt_lookup_max", "prompt_lookup_min", "quantization", "max_model_len",
                  "revision", "code_revision", "parallel_drafting", "draft_sample_method",
                  "rejection_sample_method", "use_heterogeneous_vocab"}
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class",
                "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark"}
VLLM_FLAGS = {"--port", "--host", "--tensor-parallel-size", "--pipeline-parallel-size", "--dtype",
              "--quantization", "--speculative-config", "--max-model-len", "--tokenizer"}
VLLM_DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}

# llama.cpp: tools/server/README.md at 00dc8057 (the generated help of llama-server).
LLAMA_COMMON = {"-m", "-hf", "--hf-file", "-hfd", "-md", "--host", "--port", "--jinja", "-ngl",
                "-ngld", "-c"}
LLAMA_CURRENT = LLAMA_COMMON | {"--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
                                "--spec-draft-p-min", "--spec-ngram-simple-size-n",
                                "--spec-ngram-simple-size-m", "--spec-ngram-simple-min-hits"}
LLAMA_SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash",
                    "draft-dspark", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                    "ngram-cache"}
# Removed in those builds ("the argument has been removed").
LLAMA_REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min",
                 "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits", "-cd"}
# The builds before the rename (docs/speculative.md at 067318e6 and the README of then).
LLAMA_LEGACY = LLAMA_COMMON | {"--draft-max", "--draft-min", "--draft-p-min", "--spec-type",
                               "--spec-ngram-size-n", "--spec-ngram-size-m"}
LLAMA_LEGACY_SPEC_TYPES = {"none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                           "ngram-mod"}


def parse(text: str) -> tuple[list[str], list[str], dict[str, str | None]]:
    """(comment lines, program words, {flag: value}) of an exported command."""
    notes = [line for line in text.splitlines() if line.startswith("#")]
    command = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    words = shlex.split(command.replace("\\\n", " "))
    i = next(i for i, w in enumerate(words) if w.startswith("-"))
    program, flags = words[:i], {}
    while i < len(words):
        flag = words[i]
        assert flag.startswith("-") and flag not in flags, words
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else None
        flags[flag] = value
        i += 2 if value is not None else 1
    return notes, program, flags


def spec_config(flags: dict) -> dict:
    config = json.loads(flags["--speculative-config"])
    assert set(config) <= VLLM_SPEC_KEYS and config["method"] in VLLM_METHODS
    return config


def method(profile_name: str, name: str, **fields):
    """A bundled profile with another method (eagle heads and `self` come from other
    features: built directly, past validation)."""
    p = load_profile(profile_name)
    return dataclasses.replace(p, speculation=dataclasses.replace(p.speculation, method=name, **fields))


def test_vllm_demo_profile():
    notes, program, flags = parse(vllm(load_profile("qwen-coder-demo")).text())
    assert program == ["vllm", "serve", "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    assert set(flags) <= VLLM_FLAGS and flags["--tensor-parallel-size"] == "1"
    assert spec_config(flags) == {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                  "num_speculative_tokens": 4}
    assert any("adaptive K" in n for n in notes) and any("GGUF" in n for n in notes)


def test_vllm_prompt_lookup_hybrid_and_k0():
    demo = load_profile("qwen-coder-demo")
    _, _, flags = parse(vllm(with_overrides(demo, method="prompt-lookup")).text())
    assert spec_config(flags) == {"method": "ngram", "num_speculative_tokens": 4,
                                  "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    notes, _, flags = parse(vllm(with_overrides(demo, method="hybrid")).text())
    assert spec_config(flags)["method"] == "draft_model" and any("hybrid" in n for n in notes)
    notes, _, flags = parse(vllm(with_overrides(demo, num_speculative_tokens=0)).text())
    assert "--speculative-config" not in flags and any("K = 0" in n for n in notes)


@pytest.mark.parametrize("head", ["eagle", "eagle3", "medusa"])
def test_vllm_heads(head):
    _, _, flags = parse(vllm(method("llama3-8b", head)).text())
    config = spec_config(flags)
    assert config["method"] == head and config["model"] == "meta-llama/Llama-3.2-1B-Instruct"


def test_vllm_tensor_parallel_from_the_memory_estimate():
    big = load_profile("llama3-70b")  # int4-gpu target, bf16 draft
    _, _, flags = parse(vllm(big, gpu_gb=80).text())
    assert flags["--tensor-parallel-size"] == "1" and flags["--quantization"] == "bitsandbytes"
    _, _, flags = parse(vllm(big, gpu_gb=24).text())
    assert flags["--tensor-parallel-size"] == "4"
    assert spec_config(flags)["draft_tensor_parallel_size"] == 1  # 1 or the target's, says vLLM
    full = dataclasses.replace(big, target=dataclasses.replace(big.target, quantization="none"))
    _, _, flags = parse(vllm(full, gpu_gb=24).text())
    assert flags["--tensor-parallel-size"] == "8" and flags["--pipeline-parallel-size"] == "2"
    assert flags.get("--dtype", "auto") in VLLM_DTYPES


@pytest.mark.parametrize("name, engine", [("self", "vllm"), ("wibble", "vllm"), ("self", "current"),
                                           ("eagle", "current"), ("medusa", "current"),
                                           ("eagle3", "legacy"), ("wibble", "legacy")])
def test_no_equivalent_is_one_line_not_a_wrong_config(name, engine):
    profile = method("llama3-8b", name)
    with pytest.raises(Unsupported) as e:
        vllm(profile) if engine == "vllm" else llamacpp(profile, engine)
    assert "No " in str(e.value) and "equivalent" in str(e.value) and "\n" not in str(e.value)


def test_a_local_gguf_has_no_vllm_equivalent(tmp_path):
    p = load_profile("qwen-coder-demo")
    local = dataclasses.replace(p, target=dataclasses.replace(p.target, model=str(tmp_path / "t.gguf"),
                                                              gguf_file=None))
    with pytest.raises(Unsupported, match="original Hugging Face weights"):
        vllm(local)


def test_llamacpp_current_demo_profile():
    notes, program, flags = parse(llamacpp(load_profile("qwen-coder-demo")).text())
    assert program == ["llama-server"] and set(flags) <= LLAMA_CURRENT and not set(flags) & LLAMA_REMOVED
    assert flags["-hf"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert flags["--hf-file"] == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert flags["-hfd"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M"
    # the demo drafts with the hybrid: lookup and the draft model
    assert flags["--spec-type"] == "ngram-simple,draft-simple"
    assert flags["--spec-draft-n-max"] == "4" and flags["--port"] == "8080"
    alone = with_overrides(load_profile("qwen-coder-demo"), method="draft-model")
    _, _, flags = parse(llamacpp(alone).text())
    assert flags["--spec-type"] == "draft-simple"  # a draft model alone no longer turns it on


def test_llamacpp_methods_current_and_legacy():
    demo = load_profile("qwen-coder-demo")
    hybrid = with_overrides(demo, method="hybrid")
    _, _, flags = parse(llamacpp(hybrid).text())
    assert set(flags) <= LLAMA_CURRENT
    assert set(flags["--spec-type"].split(",")) == {"ngram-simple", "draft-simple"} <= LLAMA_SPEC_TYPES
    assert flags["--spec-ngram-simple-size-n"] == "3" and flags["--spec-ngram-simple-size-m"] == "4"
    notes, _, flags = parse(llamacpp(hybrid, "legacy").text())
    assert set(flags) <= LLAMA_LEGACY and "--spec-type" not in flags
    assert flags["--draft-max"] == "4" and flags["--draft-p-min"] == "0.0"
    assert any("draft model alone" in n for n in notes)
    _, _, flags = parse(llamacpp(with_overrides(demo, method="prompt-lookup"), "legacy").text())
    assert flags["--spec-type"] in LLAMA_LEGACY_SPEC_TYPES and flags["--spec-ngram-size-m"] == "4"
    _, _, flags = parse(llamacpp(method("qwen-coder-demo", "eagle3")).text())
    assert flags["--spec-type"] == "draft-eagle3" and "-hfd" in flags
    confident = with_overrides(demo, num_speculative_tokens=8)
    confident = dataclasses.replace(confident, speculation=dataclasses.replace(
        confident.speculation, draft_confidence=0.4))
    _, _, flags = parse(llamacpp(confident).text())
    assert flags["--spec-draft-p-min"] == "0.4" and flags["--spec-draft-n-max"] == "8"


def test_llamacpp_non_gguf_models_are_named_for_conversion():
    notes, _, flags = parse(llamacpp(load_profile("llama3-8b")).text())
    assert flags["-m"] == "Llama-3.1-8B-Instruct.gguf" and flags["-md"] == "Llama-3.2-1B-Instruct.gguf"
    assert sum("convert_hf_to_gguf.py" in n for n in notes) == 2


def test_cli():
    runner = CliRunner()
    ok = runner.invoke(app, ["export", "vllm", "-p", "qwen-coder-demo"])
    assert ok.exit_code == 0 and ok.stdout.splitlines()[-1].startswith("  --speculative-config")
    ok = runner.invoke(app, ["export", "llama.cpp", "-p", "qwen-coder-demo", "--flavor", "legacy"])
    assert ok.exit_code == 0 and "--draft-max 4" in ok.stdout
    bad = runner.invoke(app, ["export", "llama.cpp", "-p", "qwen-coder-demo", "--flavor", "old"])
    assert bad.exit_code == 2 and "--flavor must be" in bad.stderr


def test_export_loads_neither_torch_nor_the_web_stack():
    code = ("import sys; from typer.testing import CliRunner; from specgen.cli import app; "
            "r = CliRunner().invoke(app, ['export', 'llama.cpp', '-p', 'qwen-coder-demo']); "
            "assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('torch', 'starlette', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": SRC})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
