import os

# Tests never reach a model hub: everything runs on models built or shipped locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Without a GPU, specgen's Triton kernels (kernels/gpu) run in Triton's interpreter on CPU
# tensors. Set before anything imports Triton (torch may): the interpreter is chosen then.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        import triton  # noqa: F401
    except ImportError:  # the GPU tests skip themselves
        pass
    else:
        from support import interpreter

        interpreter.install()

# Tiny models gain nothing from threads, and several OpenMP threads per process thrash a
# small shared machine (spin-waiting): one thread keeps the suite fast and steady.
torch.set_num_threads(1)


import sys  # noqa: E402

import pytest  # noqa: E402

# The helpers live in a package of their own that test modules never import: they reach the
# tests through the fixtures below (tests/test_layout.py checks it).
from support import (distribution as _distribution, graphs as _graphs,  # noqa: E402
                     heads as _heads, llamacpp_tools as _llamacpp_tools, syncs as _syncs,
                     tiny as _tiny)


@pytest.fixture(autouse=True)
def garbage_collector_as_found():
    """A command run in this process pauses the garbage collector while it loads and freezes
    what it loaded (cli.options.pause_gc, resume_gc): each test starts with it on, nothing
    frozen."""
    import gc

    yield
    gc.unfreeze()
    gc.enable()


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


# --- helpers handed out as they are --------------------------------------------------------

def _hand_out(helper, name: str):
    """A session fixture `name` whose value is `helper` itself (a factory function, or a module
    of them): fixtures of every scope may take it, and `pytest --fixtures` shows its docstring."""
    def fixture():
        return helper

    fixture.__doc__ = helper.__doc__
    return pytest.fixture(scope="session", name=name)(fixture)


# Factories of tiny models, tokenizers and files. tiny_pair's models are cached per process
# (lru_cache), shared by every test: a test must not modify them (it copies them first).
tiny_model = _hand_out(_tiny.tiny_model, "tiny_model")
tiny_pair = _hand_out(_tiny.tiny_pair, "tiny_pair")
sharpen = _hand_out(_tiny.sharpen, "sharpen")
save_tiny = _hand_out(_tiny.save_tiny, "save_tiny")
tiny_gguf = _hand_out(_tiny.write_tiny_gguf, "tiny_gguf")
tiny_tokenizer = _hand_out(_tiny.tiny_tokenizer, "tiny_tokenizer")
word_tokenizer = _hand_out(_tiny.word_tokenizer, "word_tokenizer")
chat_greedy = _hand_out(_tiny.chat_greedy, "chat_greedy")

# CUDA graph capture stood in for on a CPU (the decoder's capture seam), failing on request.
fake_graphs = _hand_out(_graphs.fake_graphs, "fake_graphs")
fake_head_graphs = _hand_out(_graphs.fake_head_graphs, "fake_head_graphs")


@pytest.fixture
def host_reads(monkeypatch):
    """Every host read of a tensor's value counted, step by step, for the rest of the test
    (support.syncs: `.per_step()`)."""
    return _syncs.count_host_reads(monkeypatch)

# The distribution tests' helpers, as one namespace: distribution.VOCAB, .PROMPT, .SAMPLES,
# .ALPHA, .tiny_pair (cached: do not modify), .target_joint, .chi_square_pvalue, .draw, .StopAt.
distribution = _hand_out(_distribution, "distribution")

# Draft heads: fitted_head's (target, head) pairs are cached per process: do not modify them.
fitted_head = _hand_out(_heads.fitted, "fitted_head")
eagle3_head = _hand_out(_heads.eagle3_head, "eagle3_head")
reference_state = _hand_out(_heads.reference_state, "reference_state")
reference_config = _hand_out(_heads.reference_config, "reference_config")
save_reference = _hand_out(_heads.save_reference, "save_reference")


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A cache and profile folder of the test's own, and no CUDA (loading tests)."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(tmp_path / "user-profiles"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_llama(monkeypatch):
    """FakeLlama, llama_cpp.Llama over a tiny transformers model; for the test, `llama_cpp`
    imports as its stand-in (machines without llama-cpp-python)."""
    monkeypatch.setitem(sys.modules, "llama_cpp", _tiny.fake_llama_cpp())
    return _tiny.FakeLlama


@pytest.fixture
def fake_llamacpp_tools(tmp_path, monkeypatch):
    """llama.cpp's tools as `make llamacpp` leaves them, in a cache of the test's own: a fake
    llama-speculative-simple (support.llamacpp_tools.FakeTools: `configure(...)`, `calls()`)
    printing what the real one prints. $SPECGEN_LLAMACPP_BIN is unset: the finder looks in the
    cache."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECGEN_LLAMACPP_BIN", raising=False)
    return _llamacpp_tools.fake_tools_in_cache()


# The fake's source and a real run's output, for tests that build their own tool folders.
llamacpp_tools_support = _hand_out(_llamacpp_tools, "llamacpp_tools_support")
