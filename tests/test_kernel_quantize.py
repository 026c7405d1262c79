import pytest
import torch
from torch import nn

from specgen.kernels import build, int4, int8, quantize
from specgen.choices import CPU_SCHEMES
from specgen.errors import ConfigError, ResourceError
from specgen.kernels.quantize import QuantLinear, dequantize_int4, dequantize_int8, quantize_int4, quantize_int8


def reference(linear: nn.Linear, scheme: str) -> torch.Tensor:
    """The dequantized fp32 weight the quantized layer should compute with."""
    w = linear.weight.detach()
    if scheme == "int4-dyn":
        return int4.dequantize(*int4.quantize(w))
    group = quantize.int4_group_size(w.shape[1], w.shape[0]) if scheme == "int4-wo" else None
    if group is None:
        return dequantize_int8(*quantize_int8(w))
    return dequantize_int4(*quantize_int4(w, group), group)


def test_int8_math_round_trips_within_half_a_step():
    w = torch.randn(48, 64)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    err = (dequantize_int8(q, scale) - w).abs()
    assert (err <= 0.5 * scale.float()[:, None] + 1e-6).all()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_math_round_trips_within_half_a_step(group):
    w = torch.randn(32, 256)
    q, sz = quantize_int4(w, group)
    assert q.min() >= 0 and q.max() <= 15 and sz.shape == (256 // group, 32, 2)
    scale = sz[..., 0].float().t().repeat_interleave(group, dim=1)
    err = (dequantize_int4(q, sz, group) - w).abs()
    # half a step, plus the bf16 rounding of the stored zero point
    assert (err <= 0.5 * scale + 0.01 * w.abs().amax()).all()


@pytest.mark.parametrize("scheme", CPU_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_quantized_linear_matches_dequantized_reference(scheme, dtype, bias):
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=bias)
    ref_w = reference(linear, scheme)
    layer = QuantLinear.from_linear(linear, scheme)
    assert layer.kind == {"int8-wo": "int8", "int4-wo": "int4", "int8-dyn": "int8-dyn",
                          "int4-dyn": "int4-dyn"}[scheme]
    for m in range(1, 10):  # 1..9 covers one call (<= 4 rows) and the split path
        x = torch.randn(2, m, 256).to(dtype)
        y = layer(x)
        assert y.shape == (2, m, 96) and y.dtype == dtype
        want = x.float() @ ref_w.t() + (linear.bias.detach() if bias else 0)
        # the kernels compute in bf16 activations with fp32 accumulation, or (int8-dyn,
        # int4-dyn) in 7- or 8-bit activations with exact integer accumulation
        assert torch.allclose(y.float(), want, rtol=0.02, atol=0.02 * want.abs().max().item())


def test_quantized_output_is_close_to_the_float_layer():
    torch.manual_seed(0)
    linear = nn.Linear(512, 256, bias=False)
    x = torch.randn(5, 512)
    want = linear(x)
    for scheme, bound in (("int8-wo", 0.02), ("int4-wo", 0.15), ("int8-dyn", 0.04),
                          ("int4-dyn", 0.15)):
        y = QuantLinear.from_linear(linear, scheme)(x)
        assert ((y - want).norm() / want.norm()).item() < bound


def test_int4_falls_back_to_int8_where_the_kernel_cannot_pack():
    torch.manual_seed(0)
    odd_in = QuantLinear.from_linear(nn.Linear(40, 32), "int4-wo")  # 40 has no group of 32/64/128
    odd_out = QuantLinear.from_linear(nn.Linear(64, 24), "int4-wo")  # 24 rows: not a multiple of 16
    group64 = QuantLinear.from_linear(nn.Linear(192, 32), "int4-wo")
    assert odd_in.kind == "int8" and odd_out.kind == "int8"
    assert group64.kind == "int4" and group64.group_size == 64
    assert "kind=int8" in repr(odd_in)
    x = torch.randn(3, 40)
    assert odd_in(x).shape == (3, 32)


@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_apply_replaces_every_linear_and_the_model_still_generates(scheme, tiny_model):
    model = tiny_model("qwen2", vocab=64, hidden=64)
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(ids).logits
    assert quantize.apply(model, scheme) is model
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == n_linear
    assert isinstance(model.lm_head, QuantLinear)
    with torch.no_grad():
        after = model(ids).logits
    assert ((after - before).norm() / before.norm()).item() < (0.3 if "int4" in scheme else 0.05)
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape == (1, 12)


def test_unknown_scheme_is_a_config_error(tiny_model):
    with pytest.raises(ConfigError, match="int8-wo, int4-wo"):
        quantize.apply(tiny_model(), "int3")


@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_each_row_is_computed_the_same_whatever_the_batch(scheme):
    # Verification runs K+1 rows at once while plain decoding runs one: the quantized linear
    # gives each row bit-identical results either way (bf16 MKL matmuls do not promise this).
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(nn.Linear(256, 128, bias=False), scheme)
    x = torch.randn(9, 256).bfloat16()
    full = layer(x)
    for i in range(9):
        assert torch.equal(layer(x[i:i + 1]), full[i:i + 1])


def test_int8_dyn_draft_layers_let_fbgemm_scale_the_activations(tiny_model):
    # Only a verifier's layers need the anchor row (batch invariance); a draft's skip its ops.
    torch.manual_seed(0)
    draft = quantize.apply(tiny_model("qwen2", hidden=64), "int8-dyn", verifier=False)
    x = torch.randn(3, 64)
    head = draft.lm_head
    fbgemm = quantize.prepack_int8(head.weight, head.scales)[0]
    assert torch.equal(head(x), torch.ops.quantized.linear_dynamic(x, fbgemm, True))
    target = quantize.apply(tiny_model("qwen2", hidden=64), "int8-dyn")
    layers = [m for m in target.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.batch_invariant for m in layers)
    assert torch.equal(target.lm_head(x)[1:2], target.lm_head(x[1:2]))


def test_int8_dyn_leaves_the_global_engine_alone():
    engine = torch.backends.quantized.engine
    QuantLinear.from_linear(nn.Linear(64, 32), "int8-dyn")
    assert torch.backends.quantized.engine == engine


def test_int8_dyn_without_its_kernel_or_fbgemm_says_what_to_use(monkeypatch, tiny_model):
    from specgen.errors import ResourceError

    monkeypatch.setattr(quantize, "supported_engines", lambda: ["qnnpack"])
    quantize.apply(tiny_model("qwen2", hidden=64), "int8-dyn")  # its own kernel needs no fbgemm
    with build.swapped("int8", None, int8.FUNCTIONS):  # and without that kernel
        with pytest.raises(ResourceError, match="int8-dyn needs specgen's int8 kernel.*or fbgemm"
                                                ".*use int8-wo"):
            quantize.apply(tiny_model("qwen2", hidden=64), "int8-dyn")


# --- int4-dyn: specgen's own kernel -----------------------------------------------------


def test_int4_dyn_math_round_trips_within_half_a_step():
    """Blocks of 32 inputs on a 16-step grid from the block's minimum to its maximum, the
    step and minimum in fp16."""
    torch.manual_seed(0)
    w = torch.randn(24, 96)
    packed, scales = int4.quantize(w)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 3, 16)
    assert scales.dtype == torch.float16 and scales.shape == (2, 24, 3)
    back = int4.dequantize(packed, scales)
    step = scales[0].float().repeat_interleave(32, dim=1)
    assert ((back - w).abs() <= 0.5 * step + 2e-3).all()  # fp16 minima: about 1e-3 off
    blocks, back_blocks = w.reshape(24, 3, 32), back.reshape(24, 3, 32)
    assert torch.allclose(back_blocks.amin(-1), blocks.amin(-1), atol=2e-3)
    assert torch.allclose(back_blocks.amax(-1), blocks.amax(-1), atol=2e-2)
    flat = torch.full((2, 32), 0.25)  # a constant block: no step at all
    assert torch.equal(int4.dequantize(*int4.quantize(flat)), flat)


def test_int4_dyn_falls_back_to_int8_dyn_where_the_input_is_not_blocks_of_32():
    layer = QuantLinear.from_linear(nn.Linear(40, 32), "int4-dyn")
    assert layer.kind == "int8-dyn" and layer(torch.randn(3, 40)).shape == (3, 32)
    assert QuantLinear.from_linear(nn.Linear(96, 32), "int4-dyn").kind == "int4-dyn"


def test_int4_dyn_without_a_compiler_or_avx2_says_what_to_do(monkeypatch, tmp_path, fresh_kernels, tiny_model):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))  # nothing compiled there yet
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(ResourceError, match="needs a C compiler.*apt install gcc.*int8-dyn"):
        int4.library()
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    with pytest.raises(ResourceError, match="Compiling the int4-dyn kernel failed"):
        int4.library()
    model = tiny_model("qwen2", hidden=64)
    with pytest.raises(ResourceError, match="Compiling the int4-dyn kernel failed"):
        quantize.apply(model, "int4-dyn")  # before quantizing anything
    assert any(isinstance(m, nn.Linear) for m in model.modules())
    assert not list((tmp_path / "kernels").glob("*.so"))  # no half-built library left
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(ResourceError, match="needs an x86 CPU with AVX2.*int8-wo or int4-wo"):
        int4.library()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_int4_dyn_siblings_on_one_input_are_one_kernel_call_with_the_same_results(family, monkeypatch, tiny_model):
    # q/k/v and gate/up read one input: joined, a decoder layer makes 4 kernel calls, not 7,
    # and every logit is bit-identical to the layers called one by one.
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    joined = quantize.apply(tiny_model(family, hidden=64), "int4-dyn")
    calls = []
    real = int4.linear
    monkeypatch.setattr(int4, "linear", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    with torch.no_grad():
        logits = joined(ids).logits
    assert len(calls) == 2 * 4 + 1  # two layers, and the head
    assert 64 + 2 * 32 in calls  # q (64) with k and v (2 KV heads of 16 each)
    monkeypatch.setattr(quantize, "join_int4_dyn", lambda model: None)
    apart = quantize.apply(tiny_model(family, hidden=64), "int4-dyn")
    calls.clear()
    with torch.no_grad():
        assert torch.equal(apart(ids).logits, logits)
    assert len(calls) == 2 * 7 + 1
    # each layer's own weights come back out of the joined ones (what a cache would save)
    for (name, a), b in zip(joined.named_modules(), apart.modules()):
        if isinstance(a, QuantLinear) and a.joined is not None:
            weight, scales = a.stored()
            assert torch.equal(weight, b.weight) and torch.equal(scales, b.scales), name


def test_a_joined_layer_called_on_another_input_computes_that_input(tiny_model):
    torch.manual_seed(0)
    model = quantize.apply(tiny_model("qwen2", hidden=64), "int4-dyn")
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.joined is attn.q_proj.joined is not None
    x, y = torch.randn(2, 64), torch.randn(2, 64)
    q_x = attn.q_proj(x)
    k_y = attn.k_proj(y)  # not x's pending k
    k_x, v_x = attn.k_proj(x), attn.v_proj(x)
    weight, scales = attn.k_proj.stored()
    own = int4.linear(y, weight, scales, attn.k_proj.bias.float())
    assert torch.equal(k_y, own)
    assert torch.equal(attn.q_proj(x), q_x) and torch.equal(attn.k_proj(x), k_x)
    assert torch.equal(attn.v_proj(x), v_x)


@pytest.mark.parametrize("verifier", [True, False])
def test_an_int8_dyn_weight_packed_in_pieces_gives_the_bits_of_one_call(monkeypatch, verifier):
    """fbgemm packs a weight of many rows slowly, so a large one is packed in pieces: each
    output keeps the bits of the whole weight's call, and the pieces store the same weight."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=True)
    whole = QuantLinear.from_linear(linear, "int8-dyn")
    assert len(whole.fbgemm_weight()) == 1  # packed for fbgemm (where int8.c is not built)
    monkeypatch.setattr(quantize, "PACK_ROWS", 48)
    pieces = QuantLinear.from_linear(linear, "int8-dyn")
    assert len(pieces.fbgemm_weight()) == 5
    for layer in (whole, pieces):
        layer.batch_invariant = verifier
    x = torch.randn(7, 96) * 3
    assert torch.equal(pieces(x), whole(x))
    for a, b in zip(pieces.stored(), whole.stored()):
        assert torch.equal(a, b)
