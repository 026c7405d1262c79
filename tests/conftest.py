import os

# Tests never reach a model hub: everything runs on models built or shipped locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Tiny models gain nothing from threads, and several OpenMP threads per process thrash a
# small shared machine (spin-waiting): one thread keeps the suite fast and steady.
torch.set_num_threads(1)


import pytest  # noqa: E402


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
    """A profile file naming a tiny local Llama pair (tiny.write_tiny_pair), one per module."""
    from tiny import write_tiny_profile

    return write_tiny_profile(tmp_path_factory.mktemp("tiny"))
