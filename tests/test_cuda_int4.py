"""int4-gpu: the quantization and packing logic on the CPU (through PyTorch's CPU int4 kernel,
which takes the same scales and zeros), the tensor-by-tensor loader, the refusals, and (where a
GPU is present) the CUDA kernel itself."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from specgen.choices import GPU_SCHEMES, QUANTIZATIONS
from specgen.cli import app
from specgen.decoding.cuda import CudaDecoder
from specgen.errors import ConfigError, ModelError, ResourceError
from specgen.kernels import cuda_int4
from specgen.kernels.cuda_int4 import GROUP, Int4Linear
from specgen.loading import streamed
from specgen.loading.memory import estimate_bytes
from specgen.profiles import load_profile

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def linear(n: int = 64, k: int = 256, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)


def reference(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """float64 product with the dequantized weight: what the kernel approximates."""
    w = cuda_int4.dequantized(layer.weight).double()
    y = x.to(torch.bfloat16).double() @ w.T
    return y + layer.bias.double() if layer.bias is not None else y


def test_int4_gpu_is_a_declared_scheme():
    assert "int4-gpu" in GPU_SCHEMES and "int4-gpu" in QUANTIZATIONS


def test_nibble_packing_round_trips():
    q = torch.randint(0, 16, (24, 256), generator=torch.Generator().manual_seed(0))
    packed = cuda_int4.pack_nibbles(q)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 128)
    assert int(packed[0, 0]) == int(q[0, 0]) * 16 + int(q[0, 1])  # the even input is the high nibble
    assert torch.equal(cuda_int4.unpack_nibbles(packed), q.int())


def test_quantization_error_is_that_of_4_bit_groups():
    layer = linear()
    w = layer.weight.float()
    err = (cuda_int4.dequantized(layer.weight) - w).abs()
    step = (w.reshape(64, -1, GROUP).amax(-1) - w.reshape(64, -1, GROUP).amin(-1)) / 15
    assert torch.all(err.reshape(64, -1, GROUP) <= step[..., None] * 0.5 + 1e-2 * step[..., None])


@pytest.mark.parametrize("bias", [True, False])
def test_int4_linear_computes_the_dequantized_product(bias):
    layer = linear(bias=bias)
    q = Int4Linear.from_linear(layer)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    got = q(x)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 64)
    ref = reference(layer, x)
    assert ((got.double() - ref).norm() / ref.norm()) < 1e-2  # bf16 output rounding
    assert q(x.float()).dtype == torch.float32  # the input's dtype comes back


def test_each_row_of_a_pass_gets_the_bits_of_a_one_row_pass():
    q = Int4Linear.from_linear(linear())
    x = torch.randn(9, 256, dtype=torch.bfloat16)
    together = q(x)
    assert all(torch.equal(q(x[i : i + 1]), together[i : i + 1]) for i in range(9))


def test_targets_keep_the_head_and_layers_the_kernel_cannot_take(tiny_model):
    model = tiny_model("qwen2", vocab=64, hidden=128, layers=1)
    names = set(cuda_int4.targets(model))
    assert "lm_head" not in names and "model.layers.0.self_attn.q_proj" in names
    assert not cuda_int4.fits(torch.nn.Linear(100, 64)) and not cuda_int4.fits(torch.nn.Linear(128, 60))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model):
    """Tiny bf16 models saved as safetensors: Qwen2 (q/k/v biases) and a Llama with tied
    embeddings."""
    root = tmp_path_factory.mktemp("int4")
    paths = {}
    for family, tied in (("qwen2", False), ("llama", True)):
        model = tiny_model(family, vocab=64, hidden=128, layers=2)
        if tied:
            model.config.tie_word_embeddings = True
            model.lm_head.weight = model.model.embed_tokens.weight
        model.to(torch.bfloat16).save_pretrained(root / family)
        paths[family] = root / family
    return paths


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_streamed_load_equals_loading_then_quantizing(saved, family):
    path = saved[family]
    whole = cuda_int4.apply(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16))
    config = whole.config
    streamed_model = streamed.load_int4(path, config, torch.bfloat16, torch.device("cpu"))
    assert isinstance(streamed_model.model.layers[1].mlp.down_proj, Int4Linear)
    assert type(streamed_model.lm_head) is torch.nn.Linear
    assert (streamed_model.lm_head.weight is streamed_model.model.embed_tokens.weight) == (family == "llama")
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(streamed_model(ids).logits, whole(ids).logits)


def test_greedy_speculation_on_an_int4_target_equals_its_generate(saved, tiny_model):
    """Through the CUDA decoder's code (eager, on the CPU): the int4 kernel gives each row of
    a verify pass its one-token bits, so speculation reproduces the int4 target's own greedy
    output."""
    from specgen.core.drafters import ModelDrafter
    from specgen.core.engine import SpeculativeGenerator

    target = streamed.load_int4(saved["qwen2"], AutoModelForCausalLM.from_pretrained(
        saved["qwen2"]).config, torch.bfloat16, torch.device("cpu"))
    draft = tiny_model("qwen2", vocab=64, hidden=32, layers=1, seed=3).to(torch.bfloat16)
    prompt = torch.tensor([[5, 9, 2, 33]])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=24)[0, 4:].tolist()
    gen = SpeculativeGenerator(target, ModelDrafter(draft, 64), 3, adaptive=False)
    gen._decoder = CudaDecoder(target)
    assert gen.generate(prompt[0], max_new_tokens=24).token_ids == expected


def test_a_checkpoint_missing_tensors_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    (file,) = saved["qwen2"].glob("*.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    config = AutoModelForCausalLM.from_pretrained(saved["qwen2"]).config
    with pytest.raises(ModelError, match="lacks 1 tensors .*up_proj"):
        streamed.load_int4(tmp_path, config, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ModelError, match="no .safetensors"):
        streamed.load_int4(tmp_path / "nothing", config, torch.bfloat16, torch.device("cpu"))


def test_load_role_takes_the_streamed_path(saved, monkeypatch):
    """The loader's int4-gpu runtime, with the device check lifted so that it runs here."""
    from specgen.loading import load
    from specgen.loading.plan import RolePlan
    from specgen.loading.sources import ModelFiles
    from specgen.profiles import ModelSpec

    checked = []
    monkeypatch.setattr(cuda_int4, "check_device", lambda device, dtype: checked.append(device))
    spec = ModelSpec(model=str(saved["qwen2"]), quantization="int4-gpu")
    plan = RolePlan("target", spec, "int4-gpu", "cpu", torch.bfloat16,
                    ModelFiles(name="tiny", path=saved["qwen2"]))
    model = load.load_role(plan)
    assert checked == [torch.device("cpu")]
    assert isinstance(model.model.layers[0].self_attn.q_proj, Int4Linear)


def test_the_kernel_is_refused_off_cuda():
    with pytest.raises(ResourceError, match="runs PyTorch's CUDA int4 kernel, but the model is on cpu"):
        cuda_int4.check_device(torch.device("cpu"), torch.bfloat16)


def test_memory_estimate_counts_four_bits_a_weight(tiny_model):
    config = tiny_model("llama", vocab=64, hidden=128).config
    assert estimate_bytes(config, torch.bfloat16, "int4-gpu") < 0.5 * estimate_bytes(
        config, torch.bfloat16, "none")


def test_a_profile_asking_int4_gpu_on_the_cpu_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[target]\nmodel = "x"\nquantization = "int4-gpu"\ndevice = "cpu"\n'
                    '[speculation]\nmethod = "prompt-lookup"\n')
    with pytest.raises(ConfigError, match="runs on a CUDA GPU, but target.device"):
        load_profile(str(path))


@pytest.mark.parametrize("extra", [[], ["--device", "auto"]])
def test_cli_int4_gpu_without_cuda_is_one_clear_line(tiny_profile, monkeypatch, tmp_path, extra):
    """From the profile's device ("cpu": refused by validation) or from "auto" on a machine
    without CUDA (refused before anything loads)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "h.sqlite3"))
    result = CliRunner().invoke(app, ["run", "-p", str(tiny_profile), *extra,
                                      "--target-quantization", "int4-gpu", "hi"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error:") and "Traceback" not in result.output
    assert "CUDA GPU" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- on a GPU ----------------------------------------------------------------------------------

@cuda
def test_the_cuda_kernel_computes_the_dequantized_product():
    layer = linear(n=256, k=512).cuda()
    q = Int4Linear.from_linear(layer)
    assert q.packed.dtype == torch.int32 and q.packed.dim() == 4  # tinygemm's tile layout
    x = torch.randn(7, 512, dtype=torch.bfloat16, device="cuda")
    ref = reference(layer, x)
    assert ((q(x).double() - ref).norm() / ref.norm()) < 1e-2


@cuda
def test_on_the_gpu_rows_of_a_pass_up_to_16_get_one_row_bits():
    """tinygemm multiplies 16-row tiles with no split over the inputs: a verify pass gives
    each token the bits of its one-token pass."""
    q = Int4Linear.from_linear(linear(n=512, k=1024).cuda())
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    for m in (2, 5, 9, 16):
        together = q(x[:m])
        assert all(torch.equal(q(x[i : i + 1]), together[i : i + 1]) for i in range(m))


@cuda
def test_streamed_load_onto_the_gpu(saved):
    config = AutoModelForCausalLM.from_pretrained(saved["llama"]).config
    model = streamed.load_int4(saved["llama"], config, torch.bfloat16, torch.device("cuda"))
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert all(b.device.type == "cuda" for b in model.buffers())
    ids = torch.randint(0, 64, (1, 12), device="cuda")
    assert torch.isfinite(model(ids).logits).all()
