import os

# Tests never reach a model hub: everything runs on models built or shipped locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Tiny models gain nothing from threads, and several OpenMP threads per process thrash a
# small shared machine (spin-waiting): one thread keeps the suite fast and steady.
torch.set_num_threads(1)


import sys  # noqa: E402

import pytest  # noqa: E402

# The helpers live in a package of their own that test modules never import: they reach the
# tests through the fixtures below (tests/test_layout.py checks it).
from support import distribution as _distribution, heads as _heads, tiny as _tiny  # noqa: E402


@pytest.fixture
def without_kernel(monkeypatch):
    """`without_kernel("rows")`: for the rest of the test that C kernel is unavailable, as on
    a machine where it cannot be built, and its callers keep PyTorch's ops."""
    from specgen.kernels import build

    return lambda stem: monkeypatch.setitem(build._loaded, stem, None)


@pytest.fixture
def fresh_kernels(monkeypatch):
    """No kernel loaded yet in this process: the next use builds (or fails to build) again."""
    from specgen.kernels import build

    monkeypatch.setattr(build, "_loaded", {})


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """A profile file naming a tiny local Llama pair (support.tiny.write_tiny_pair), one per module."""
    return _tiny.write_tiny_profile(tmp_path_factory.mktemp("tiny"))


# --- tiny models: factories (plain functions, so that fixtures of any scope can use them) -----

@pytest.fixture(scope="session")
def tiny_model():
    """`tiny_model(family="llama", *, vocab=64, hidden=32, layers=2, seed=0, eos=None, **config)`:
    a new random fp32 causal LM, small enough to run thousands of steps in seconds."""
    return _tiny.tiny_model


@pytest.fixture(scope="session")
def tiny_pair():
    """`tiny_pair(family="llama", vocab=64, seed=0)`: (target, distilled draft), cached per
    process: do not modify them (deepcopy first)."""
    return _tiny.tiny_pair


@pytest.fixture(scope="session")
def sharpen():
    """`sharpen(model, scale)`: scale a model's output head in place (less flat distributions)."""
    return _tiny.sharpen


@pytest.fixture(scope="session")
def save_tiny():
    """`save_tiny(model, path) -> path`: the model saved as a local model directory."""
    return _tiny.save_tiny


@pytest.fixture(scope="session")
def tiny_gguf():
    """`tiny_gguf(path, vocab=64, hidden=32, layers=2, ..., seed=0, merges=()) -> path`: a real
    F32 llama GGUF file with a byte-level tokenizer (llama.cpp itself wants one merge)."""
    return _tiny.write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """`tiny_tokenizer()`: a byte-level tokenizer (259 ids, EOS <|im_end|> = 258, a chat template)."""
    return _tiny.tiny_tokenizer


@pytest.fixture(scope="session")
def word_tokenizer():
    """`word_tokenizer(vocab=64, eos="t1", shuffle=False)`: a word-level tokenizer t0, t1, ..."""
    return _tiny.word_tokenizer


@pytest.fixture
def fake_llama(monkeypatch):
    """FakeLlama, llama_cpp.Llama over a tiny transformers model; for the test, `llama_cpp`
    imports as its stand-in (machines without llama-cpp-python)."""
    monkeypatch.setitem(sys.modules, "llama_cpp", _tiny.fake_llama_cpp())
    return _tiny.FakeLlama


# --- the distribution tests -------------------------------------------------------------------

@pytest.fixture(scope="session")
def distribution():
    """The distribution tests' helpers: VOCAB, PROMPT, SAMPLES, ALPHA; tiny_pair(family) (a
    target and a clearly different draft, cached: do not modify them), target_joint (the exact
    joint by enumeration), chi_square_pvalue, draw (seeded speculative generations), StopAt."""
    return _distribution


# --- draft heads ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fitted_head():
    """`fitted_head(kind, family="llama", vocab=64, draft_vocab=None, layers=8, ...)`: (target,
    head) fitted to it, cached per process: do not modify them."""
    return _heads.fitted


@pytest.fixture(scope="session")
def eagle3_head():
    """`eagle3_head(target, draft_vocab=None, seed=0)`: an unfitted EAGLE-3 head for `target`."""
    return _heads.eagle3_head


@pytest.fixture(scope="session")
def reference_state():
    """`reference_state(head)`: the head's tensors under the reference checkpoint's key names."""
    return _heads.reference_state


@pytest.fixture(scope="session")
def reference_config():
    """`reference_config(head, target)`: the config.json the reference implementation writes."""
    return _heads.reference_config


@pytest.fixture(scope="session")
def save_reference():
    """`save_reference(head, target, folder, file, state=None, config=None) -> folder`: the head
    as the reference implementation publishes it."""
    return _heads.save_reference
