"""The model cache (loading/cache.py, loading/mapped.py): packed models mapped onto a meta
skeleton with no unquantized weights built, entries keyed by content, checks on load (damaged
copies rebuilt or refused), `specgen cache list / prune / verify`, and conversions that
leave nothing behind when interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from specgen.choices import CPU_SCHEMES
from specgen.cli import app
from specgen.kernels import build, int8, quantize
from specgen.kernels.quantize import QuantLinear
from specgen.loading import cache, cache_listing, demo, mapped
from specgen.loading.load import load_pair
from specgen.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated(isolated_cache):
    """Every test here on its own cache and profile folder."""


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, tiny_gguf) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", hidden=64, ff=128)


def mapped_from(t: torch.Tensor, name: str) -> bool:
    """Whether the tensor's memory lies in a mapping of a file called `name`."""
    ptr = t.untyped_storage().data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= ptr < hi:
            return rest[-1].endswith(name)
    return False


def write_profile(tmp_path: Path, target: str, name: str = "p.toml") -> Path:
    """A profile whose target is cached: converted to float32 unless it names a scheme (a
    GGUF named without one would run as stored, with nothing in the cache)."""
    if "quantization" not in target:
        target += '\nquantization = "none"'
    path = tmp_path / name
    path.write_text(f'[target]\n{target}\ndtype = "float32"\n[speculation]\nmethod = "prompt-lookup"\n')
    return path


def no_unquantized_model(monkeypatch):
    """From here on, building a model with real weights, or quantizing one, fails."""
    from transformers import AutoModelForCausalLM

    def refuse(*a, **k):
        raise AssertionError("the unquantized model was built")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(QuantLinear, "from_linear", refuse)
    init = nn.Linear.reset_parameters

    def meta_only(self):  # a skeleton's layers are on the meta device: nothing is allocated
        if not self.weight.is_meta:
            refuse()
        init(self)
    monkeypatch.setattr(nn.Linear, "reset_parameters", meta_only)


# --- packed models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_packed_round_trip_is_bit_identical_and_mapped(tmp_path, monkeypatch, scheme, tiny_model):
    model = quantize.apply(tiny_model("qwen2", hidden=64), scheme)
    model.config.save_pretrained(tmp_path)
    mapped.save_packed(model, tmp_path)
    no_unquantized_model(monkeypatch)
    again = mapped.load_packed(tmp_path, torch.float32, verifier=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert not any(t.is_meta for t in [*again.parameters(), *again.buffers()])
    # the weights it runs with are the file's pages, not a copy
    assert mapped_from(again.model.embed_tokens.weight, mapped.PACKED_WEIGHTS)
    q = again.model.layers[0].self_attn.q_proj
    if scheme == "int4-dyn":
        assert q.joined is not None and mapped_from(q.joined.packed, mapped.PACKED_WEIGHTS)
    else:
        assert mapped_from(q.weight, mapped.PACKED_WEIGHTS) and getattr(q, "packed", None) is None


def refuse_fbgemm(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a weight was packed for fbgemm")
    monkeypatch.setattr(quantize, "prepack_int8", refuse)


@pytest.mark.parametrize("verifier", [True, False])
def test_an_int8_dyn_load_packs_nothing_and_computes_fbgemms_bits(tmp_path, monkeypatch,
                                                                  verifier, tiny_model):
    """int8-dyn's own kernel computes from the weights as stored (mapped from the file): a
    load packs no weight for fbgemm, and the model computes what fbgemm computed, bit for bit
    (the fallback where the kernel cannot be built)."""
    model = quantize.apply(tiny_model("qwen2", hidden=64, layers=2), "int8-dyn", verifier=verifier)
    model.config.save_pretrained(tmp_path)
    mapped.save_packed(model, tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        refuse_fbgemm(patch)
        again = mapped.load_packed(tmp_path, torch.float32, verifier=verifier)
        ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
        with torch.no_grad():
            own = again(ids).logits
    with build.swapped("int8", None, int8.FUNCTIONS), torch.no_grad():
        fbgemm = model(ids).logits
    assert torch.equal(own, fbgemm)
    assert all(m.packed is not None for m in model.modules()
               if isinstance(m, quantize.QuantLinear))  # it did go through fbgemm


def test_an_int8_dyn_draft_joins_its_projections_without_packing(tmp_path, monkeypatch, tiny_model):
    """A draft's q/k/v and gate/up projections, which its lean decoder calls joined, are
    joined from the stored weights (no fbgemm packing), and the draft computes what one
    packed for fbgemm layer by layer computes, bit for bit."""
    from specgen.decoding import make_decoder
    from specgen.decoding.lean import layer_projections
    from specgen.kernels import prepare

    model = quantize.apply(tiny_model("qwen2", hidden=64, layers=2), "int8-dyn")
    model.config.save_pretrained(tmp_path)
    mapped.save_packed(model, tmp_path)
    refuse_fbgemm(monkeypatch)
    draft = mapped.load_packed(tmp_path, torch.float32, verifier=False, lean="int8-dyn")
    prepare(draft, "draft", "int8-dyn")
    qkv = layer_projections(draft)[0][0]
    assert qkv.joined and qkv.layer.out_features == sum(qkv.sizes)
    monkeypatch.undo()
    eager = mapped.load_packed(tmp_path, torch.float32, verifier=False)  # transformers' skeleton
    for m in eager.modules():
        if isinstance(m, quantize.QuantLinear):
            m.fbgemm_weight()  # every layer packed alone, as before
    prepare(eager, "draft", "int8-dyn")
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3))
    lean, plain = make_decoder(draft), make_decoder(eager)
    with torch.inference_mode():
        assert torch.equal(lean.logits(ids[:30], 1), plain.logits(ids[:30], 1))
        assert torch.equal(lean.logits(ids[30:34], 4), plain.logits(ids[30:34], 4))


@pytest.mark.parametrize("scheme", ["int8-dyn", "int4-dyn"])
def test_quantized_profile_loads_from_its_cache_without_the_unquantized_weights(
        tmp_path, monkeypatch, scheme, tiny_model, save_tiny, word_tokenizer):
    folder = tmp_path / "model"
    save_tiny(tiny_model("qwen2", vocab=64, hidden=64, eos=1), folder)
    word_tokenizer().save_pretrained(folder)
    path = write_profile(tmp_path, f'model = "{folder}"\nquantization = "{scheme}"')
    first = load_pair(load_profile(str(path)))
    (entry,) = (tmp_path / "cache" / "quantized").iterdir()
    assert cache.check(entry) is None
    assert not (tmp_path / "cache" / "converted").exists()  # no unquantized copy kept

    no_unquantized_model(monkeypatch)
    seen = []
    second = load_pair(load_profile(str(path)), seen.append)
    assert any(f"in {scheme} on cpu" in m for m in seen)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(first.target(ids).logits, second.target(ids).logits)


def test_an_entry_is_keyed_by_content_so_every_copy_shares_it(tmp_path, tiny_model, save_tiny, word_tokenizer):
    model = tiny_model("qwen2", vocab=64, hidden=64, eos=1)
    for where in ("a", "b"):
        save_tiny(model, tmp_path / where)
        word_tokenizer().save_pretrained(tmp_path / where)
        load_pair(load_profile(str(write_profile(
            tmp_path, f'model = "{tmp_path / where}"\nquantization = "int8-wo"', f"{where}.toml"))))
    assert len(list((tmp_path / "cache" / "quantized").iterdir())) == 1
    manifest = cache.read_manifest(next((tmp_path / "cache" / "quantized").iterdir()))
    assert manifest["scheme"] == "int8-wo" and len(manifest["sha256"]) == 64


def test_a_gguf_target_quantized_from_the_file_keeps_no_converted_copy(tmp_path, gguf_file):
    path = write_profile(tmp_path, f'model = "{gguf_file}"\nquantization = "int4-dyn"')
    first = load_pair(load_profile(str(path)))
    assert not (tmp_path / "cache" / "converted").exists()
    (entry,) = (tmp_path / "cache" / "quantized").iterdir()
    assert cache.read_manifest(entry)["sha256"] == demo.sha256_file(gguf_file)
    second = load_pair(load_profile(str(path)))
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(first.target(ids).logits, second.target(ids).logits)


# --- damaged entries ------------------------------------------------------------------------------

def converted_once(tmp_path: Path, gguf: Path, sha: bool = False):
    extra = f'\nsha256 = "{demo.sha256_file(gguf)}"' if sha else ""
    path = write_profile(tmp_path, f'model = "{gguf}"{extra}')
    pair = load_pair(load_profile(str(path)))
    (entry,) = (tmp_path / "cache" / "converted").iterdir()
    return path, pair, entry


def logits(pair):
    with torch.no_grad():
        return pair.target(torch.tensor([[3, 4, 5]])).logits


@pytest.mark.parametrize("damage", ["overwrite", "truncate"])
def test_a_damaged_converted_copy_is_detected_and_rebuilt(tmp_path, gguf_file, damage):
    path, pair, entry = converted_once(tmp_path, gguf_file)
    expected = logits(pair)  # before the damage: the loaded model maps the file
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        if damage == "overwrite":  # the same size, other bytes
            f.seek(size // 2)
            f.write(b"\x7f" * 4096)
        else:
            f.truncate(size - 1000)
    assert cache.check(entry) is not None
    seen = []
    again = load_pair(load_profile(str(path)), seen.append)
    assert any(f"The cached model in {entry} is damaged" in m and "rebuilding" in m for m in seen)
    assert cache.check(entry) is None and weights.stat().st_size == size
    assert torch.equal(expected, logits(again))


def test_a_damaged_copy_whose_source_is_gone_is_refused_in_one_line(tmp_path, gguf_file):
    import shutil

    gguf = tmp_path / "m" / "x.gguf"
    gguf.parent.mkdir()
    shutil.copy(gguf_file, gguf)
    path, _, entry = converted_once(tmp_path, gguf, sha=True)
    gguf.unlink()
    with (entry / "model.safetensors").open("r+b") as f:
        f.truncate(100)
    with pytest.raises(cache.DamagedCache) as e:
        load_pair(load_profile(str(path)))
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and "is damaged" in msg and "Delete that folder" in msg
    result = CliRunner().invoke(app, ["run", "-p", str(path), "hi"])
    assert result.exit_code == 2 and str(entry) in result.output.replace("\n", "")


def test_a_damaged_packed_model_is_rebuilt(tmp_path, gguf_file):
    path = write_profile(tmp_path, f'model = "{gguf_file}"\nquantization = "int8-wo"')
    expected = logits(load_pair(load_profile(str(path))))
    (entry,) = (tmp_path / "cache" / "quantized").iterdir()
    with (entry / mapped.PACKED_WEIGHTS).open("r+b") as f:
        f.seek(200)
        f.write(b"\x00" * 64)
    seen = []
    again = load_pair(load_profile(str(path)), seen.append)
    assert any("is damaged" in m for m in seen) and cache.check(entry) is None
    assert torch.equal(expected, logits(again))


def test_the_sampled_check_sees_a_long_overwrite_and_verify_sees_every_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "SMALL", 1 << 12)
    monkeypatch.setattr(cache, "SAMPLE_BYTES", 256)
    folder = tmp_path / "cache" / "converted" / "abc-float32"
    folder.mkdir(parents=True)
    data = os.urandom(1 << 20)
    (folder / "model.safetensors").write_bytes(data)
    cache.finish(folder, kind="converted", sha256="ab" * 32, dtype="float32", source="x.gguf", model="x")
    assert cache.check(folder) is None
    with (folder / "model.safetensors").open("r+b") as f:  # a stretch longer than 1/63 of it
        f.seek(300_000)
        f.write(b"\x00" * 20_000)
    assert "changed" in cache.check(folder)
    (folder / "model.safetensors").write_bytes(data)
    with (folder / "model.safetensors").open("r+b") as f:  # one byte between two samples
        f.seek(5000)
        f.write(bytes([data[5000] ^ 1]))
    assert cache.check(folder) is None
    assert "changed" in cache.check(folder, full=True)

    runner = CliRunner()
    result = runner.invoke(app, ["cache", "verify"])
    assert result.exit_code == 2, result.output
    assert "damaged" in result.output and "specgen cache verify --delete" in result.output
    result = runner.invoke(app, ["cache", "verify", "--delete"])
    assert result.exit_code == 0 and not folder.exists()


# --- list and prune ---------------------------------------------------------------------------------

def fake_entry(root: Path, folder: str, name: str, size: int = 1000, **manifest) -> Path:
    path = root / folder / name
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * size)
    cache.finish(path, **manifest)
    return path


def test_cache_list_and_prune_keep_what_profiles_use(tmp_path, monkeypatch):
    from specgen.loading.devices import cpu_has_bf16

    root = tmp_path / "cache"
    auto = "bfloat16" if cpu_has_bf16() else "float32"
    target_sha = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"  # bundled demo
    used = fake_entry(root, "converted", f"{target_sha[:16]}-{auto}", kind="converted",
                      sha256=target_sha, dtype=auto, source="t.gguf", model="m")
    packed_used = fake_entry(root, "quantized", "int4-dyn-float32-x", kind="quantized",
                             sha256=target_sha, dtype="float32", scheme="int4-dyn", source="t.gguf",
                             model="m")
    mine = tmp_path / "mine"
    (tmp_path / "user-profiles").mkdir()
    (tmp_path / "user-profiles" / "mine.toml").write_text(
        f'[target]\nmodel = "{mine}"\nquantization = "int8-wo"\ndtype = "float32"\n'
        '[speculation]\nmethod = "prompt-lookup"\n')
    user_used = fake_entry(root, "quantized", "int8-wo-float32-y", kind="quantized", sha256="1" * 64,
                           dtype="float32", scheme="int8-wo", source=str(mine), model=str(mine))
    dangling = fake_entry(root, "quantized", "int8-dyn-float32-z", size=5000, kind="quantized",
                          sha256="2" * 64, dtype="float32", scheme="int8-dyn", source="gone.gguf",
                          model="gone")
    other_dtype = fake_entry(root, "converted", f"{target_sha[:16]}-float16", kind="converted",
                             sha256=target_sha, dtype="float16", source="t.gguf", model="m")
    older = root / "quantized" / "int4-dyn-float32-abc.pt"  # an older release's single file
    older.write_bytes(b"\0" * 10)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / "converted" / f".{target_sha[:16]}-float32.tmp-{dead.pid}-abcd"
    stale.mkdir()
    live = root / "converted" / f".{target_sha[:16]}-float32.tmp-{os.getpid()}-beef"
    live.mkdir()

    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "list", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = {Path(r["path"]).name: r for r in json.loads(listed.output)["entries"]}
    assert "qwen-coder-demo" in rows[used.name]["used_by"]
    assert "qwen-coder-demo-int4" in rows[packed_used.name]["used_by"]
    assert rows[user_used.name]["used_by"] == ["mine"]
    assert rows[dangling.name]["used_by"] == [] and rows[dangling.name]["bytes"] > 5000
    assert rows[older.name]["kind"] == "older" and rows[stale.name]["kind"] == "temporary"
    text = runner.invoke(app, ["cache", "list"], env={"COLUMNS": "200"})
    assert text.exit_code == 0 and "nothing (prune removes it)" in text.output

    dry = runner.invoke(app, ["cache", "prune", "--dry-run"])
    assert dry.exit_code == 0 and dangling.exists() and "would remove" in dry.output
    pruned = runner.invoke(app, ["cache", "prune"])
    assert pruned.exit_code == 0, pruned.output
    assert used.exists() and packed_used.exists() and user_used.exists() and live.exists()
    assert not dangling.exists() and not other_dtype.exists() and not older.exists()
    assert not stale.exists()


def test_cache_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from typer.testing import CliRunner; from specgen.cli import app; "
            "r = CliRunner().invoke(app, ['cache', 'list']); assert r.exit_code == 0, r.output; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SPECGEN_CACHE_DIR=str(tmp_path / "c"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


# --- interrupted conversions ---------------------------------------------------------------------

def leftovers(root: Path) -> list[Path]:
    return [p for folder in ("converted", "quantized") if (root / folder).exists()
            for p in (root / folder).iterdir()]


@pytest.mark.parametrize("scheme", ["none", "int8-dyn"])
def test_an_exception_mid_conversion_leaves_nothing(tmp_path, gguf_file, monkeypatch, scheme):
    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cache, "file_records", boom)  # after the weights are written
    path = write_profile(tmp_path, f'model = "{gguf_file}"\nquantization = "{scheme}"')
    with pytest.raises(KeyboardInterrupt):
        load_pair(load_profile(str(path)))
    assert leftovers(tmp_path / "cache") == []


CONVERT = """
import sys, time
from pathlib import Path
import torch
from specgen.loading import cache
from specgen.loading.convert import convert_gguf
from specgen.loading.sources import ModelFiles

def slow(folder):
    Path(sys.argv[2]).write_text("writing")  # the weights are written: now stop us
    time.sleep(60)
cache.file_records = slow
gguf = Path(sys.argv[1])
convert_gguf(ModelFiles("t", gguf.parent, gguf=gguf.name, sha256="ab" * 32, verified=True),
             torch.float32, False, None)
"""


def test_sigterm_mid_conversion_leaves_nothing_and_stale_temporaries_go(tmp_path, gguf_file):
    root = tmp_path / "cache"
    flag = tmp_path / "flag"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}", SPECGEN_CACHE_DIR=str(root),
               OMP_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, "-c", CONVERT, str(gguf_file), str(flag)], env=env)
    deadline = time.time() + 120
    while not flag.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert flag.exists(), "the conversion never got to writing"
    assert any(p.name.startswith(".") for p in leftovers(root))  # its temporary, mid-write
    child.send_signal(signal.SIGTERM)
    assert child.wait(60) == 128 + signal.SIGTERM
    assert leftovers(root) == []

    # A process killed outright (SIGKILL) cannot clean up: the next conversion removes its
    # temporary, and an older release's (no process named) once it is an hour old.
    flag.unlink()
    child = subprocess.Popen([sys.executable, "-c", CONVERT, str(gguf_file), str(flag)], env=env)
    while not flag.exists() and child.poll() is None and time.time() < deadline + 120:
        time.sleep(0.1)
    child.kill()
    child.wait()
    (killed,) = leftovers(root)
    legacy = root / "converted" / ".abababababababab-float32.x1y2z3w4"  # tempfile.mkdtemp's
    legacy.mkdir()
    old = time.time() - 2 * cache.STALE_AFTER
    os.utime(legacy, (old, old))
    path = write_profile(tmp_path, f'model = "{gguf_file}"')
    load_pair(load_profile(str(path)))
    names = [p.name for p in leftovers(root)]
    assert killed.name not in names and legacy.name not in names and len(names) == 1
    assert not names[0].startswith(".")


def test_a_draft_with_the_target_tokenizer_files_reuses_the_target_tokenizer(
        tmp_path, gguf_file, monkeypatch, tiny_gguf):
    from specgen.loading import tokenizer_cache

    other = tiny_gguf(tmp_path / "other.gguf", hidden=64, ff=128, seed=1)
    path = tmp_path / "pair.toml"
    path.write_text(f'[target]\nmodel = "{gguf_file}"\ndtype = "float32"\nquantization = "none"\n'
                    f'[draft]\nmodel = "{other}"\ndtype = "float32"\nquantization = "none"\n')
    load_pair(load_profile(str(path)))  # converts both
    calls = []
    real = tokenizer_cache.load_tokenizer
    monkeypatch.setattr(tokenizer_cache, "load_tokenizer",
                        lambda *a: (calls.append(a[0].name), real(*a))[1])
    pair = load_pair(load_profile(str(path)))
    assert calls == [str(gguf_file)] and pair.draft is not None  # one tokenizer read, not two


def test_prefetch_reads_ahead_the_entries_the_profile_loads(tmp_path, gguf_file):
    path = write_profile(tmp_path, f'model = "{gguf_file}"\nquantization = "int8-wo"')
    other = write_profile(tmp_path, f'model = "{gguf_file}"', "other.toml")
    for p in (path, other):
        load_pair(load_profile(str(p)))
    (entry,) = (tmp_path / "cache" / "quantized").iterdir()
    assert cache_listing.profile_entries(load_profile(str(path))) == [entry]
    thread = cache_listing.prefetch(load_profile(str(path)))
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_a_packed_load_runs_exactly_as_quantizing_the_loaded_model(
        tmp_path, scheme, tiny_model, save_tiny, word_tokenizer):
    """The packed path gives the bits of the path it replaces: transformers' own load of the
    model, quantized and prepared in memory."""
    from transformers import AutoModelForCausalLM

    from specgen.kernels import prepare

    folder = tmp_path / "model"
    save_tiny(tiny_model("qwen2", vocab=64, hidden=64, eos=1), folder)
    word_tokenizer().save_pretrained(folder)
    reference = prepare(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), "target",
                        scheme).eval()
    path = write_profile(tmp_path, f'model = "{folder}"\nquantization = "{scheme}"')
    load_pair(load_profile(str(path)))
    pair = load_pair(load_profile(str(path)))  # the second load: from the entry
    assert pair.target.config._attn_implementation == reference.config._attn_implementation
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(reference(ids).logits, pair.target(ids).logits)


def test_a_files_sha256_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """A demo GGUF is checked against its sha256 on every run that uses it (llama.cpp reads it
    as it is): the hash is computed once and remembered by path, size and time, and computed
    again once the file changes."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    hashed, real = [], cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"weights")
    want = real(f)
    assert cache.remembered_sha256(f) == want and len(hashed) == 1
    assert cache.remembered_sha256(f) == want and len(hashed) == 1  # remembered
    f.write_bytes(b"changed")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert cache.remembered_sha256(f) == real(f) and len(hashed) == 2


def test_a_file_put_in_place_of_a_remembered_one_is_hashed_again(tmp_path, monkeypatch):
    """Another file of the same size renamed over the remembered one, its modification time
    set to the old file's (as `cp -p` or `rsync -t` leave it): hashed again, not trusted."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    hashed, real = [], cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    f, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    f.write_bytes(b"weights")
    assert cache.remembered_sha256(f) == real(f) and len(hashed) == 1
    other.write_bytes(b"damaged")
    before = f.stat()
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, f)
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert cache.remembered_sha256(f) == real(f) and len(hashed) == 2
