"""Loading a model straight into int4-gpu, tensor by tensor: the float model never exists whole.

A 70B model is about 140 GB in bf16 and 37 GB in int4: quantizing after a normal load would need
the former on the GPU (or in RAM). Here the model is built on the meta device (`empty`), and each
tensor of the safetensors files is read, moved to the device and either placed as it is or, for a
linear layer int4-gpu quantizes, quantized there and packed (`place`): the peak is the quantized
model plus one float tensor. `finish` ties the embeddings, checks nothing is missing and moves the
buffers (rotary angles, computed at construction) to the device.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from specgen.errors import ModelError
from specgen.kernels import cuda_int4


def empty(config: PretrainedConfig, dtype: torch.dtype, trust_remote_code: bool = False
          ) -> PreTrainedModel:
    """The model with its parameters on the meta device (its buffers real, on the CPU)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                trust_remote_code=trust_remote_code)


def quantized_weights(model: PreTrainedModel) -> set[str]:
    """Names of the weights int4-gpu quantizes (cuda_int4.targets)."""
    return {f"{name}.weight" for name in cuda_int4.targets(model)}


def place(model: PreTrainedModel, name: str, tensor: torch.Tensor, quantize: bool) -> None:
    """Put one tensor (already on its device and in its dtype) into the model: a quantized
    layer's weight becomes its Int4Linear (place its bias first), anything else as it is."""
    from accelerate.utils import set_module_tensor_to_device

    if not quantize:
        set_module_tensor_to_device(model, name, tensor.device, value=tensor)
        return
    parent, _, attr = name.removesuffix(".weight").rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    linear = getattr(owner, attr)
    if linear.bias is not None and linear.bias.device.type == "meta":
        raise ModelError(f"The checkpoint has {name} but not its layer's bias.")
    setattr(owner, attr, cuda_int4.Int4Linear.from_weight(tensor, linear.bias))


def finish(model: PreTrainedModel, config: PretrainedConfig, device: torch.device,
           source: object) -> PreTrainedModel:
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    missing += [name for name, b in model.named_buffers() if b.device.type == "meta"]
    if missing:
        raise ModelError(f"{source}: the checkpoint lacks {len(missing)} tensors the model needs "
                         f"(first: {missing[0]}). Is it a complete {config.model_type} model?")
    return model.to(device).eval()  # the buffers; parameters are already there


def load_int4(path: Path, config: PretrainedConfig, dtype: torch.dtype, device: torch.device,
              trust_remote_code: bool = False) -> PreTrainedModel:
    """The model in `path` (safetensors) on `device`, its linear layers quantized to int4-gpu
    as they are read (the output head in `dtype`)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path} has no .safetensors files: int4-gpu loads those only. "
                         "Convert the checkpoint (save_pretrained) or use quantization = \"nf4\".")
    device = torch.device(device)
    model = empty(config, dtype, trust_remote_code)
    quantized = quantized_weights(model)
    names = {name for name, _ in model.named_parameters()}
    # Two passes over the files: everything but the quantized weights first (so that a
    # layer's bias is in place when its weight is quantized), then those weights.
    for second in (False, True):
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key in names and (key in quantized) == second:  # skip what the model lacks
                        place(model, key, f.get_tensor(key).to(device, dtype), second)
    return finish(model, config, device, path)
