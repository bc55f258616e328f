"""bitsandbytes' 4-bit Linear (QLoRA's base layers), as far as memory goes, for the traced engine.

bitsandbytes is not needed (nor installable on a CPU-only machine in every version): each quantised nn.Linear is
replaced on the meta device by `Linear4bitStandIn`, which holds what `bnb.nn.Linear4bit` holds and allocates what
its matmul allocates, so that MemTracker measures a QLoRA step as bitsandbytes would run it:

- the weight: packed uint8, ⌈n/2⌉ bytes (two 4-bit codes a byte), frozen;
- the quantisation state: one absmax per block of 64 (fp32, or with double quantisation uint8 plus one fp32 per
  256 blocks and an offset) and the 16-entry code book (cost/quantization.py gives the same bytes for `memory`);
- `MatMul4Bit.forward` (bitsandbytes 0.45): dequantise the whole weight to the input's dtype, `linear`, and save
  only the packed weight for backward (the input is not saved: the weight does not train);
- `MatMul4Bit.backward`: dequantise again and multiply, for the input's gradient only.
"""

from __future__ import annotations

from typing import Any

from ..memory.quantization import WeightFormat


def linear4bit_class():
    """Built lazily: importing this module must not import torch."""
    import torch

    class MatMul4BitStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inputs, packed, bias, shape):  # noqa: D401 - torch's signature
            weight = torch.empty(shape, dtype=inputs.dtype, device=inputs.device)  # F.dequantize_4bit(…)
            out = torch.nn.functional.linear(inputs, weight, bias)
            ctx.shape = shape
            ctx.save_for_backward(packed)
            ctx.has_bias = bias is not None
            return out

        @staticmethod
        def backward(ctx, grad_output):
            weight = torch.empty(ctx.shape, dtype=grad_output.dtype, device=grad_output.device)
            grad_input = grad_output @ weight
            return grad_input, None, None, None

    class Linear4bitStandIn(torch.nn.Module):
        """bnb.nn.Linear4bit's tensors and matmul, with no data."""

        def __init__(self, linear: Any, fmt: WeightFormat):
            super().__init__()
            out_features, in_features = linear.weight.shape
            if type(linear).__name__ == "Conv1D":  # GPT-2's transposed Linear: weight [in, out]
                in_features, out_features = out_features, in_features
            numel = out_features * in_features
            self.in_features, self.out_features = in_features, out_features
            self.shape = (out_features, in_features)
            device = linear.weight.device
            self.weight = torch.nn.Parameter(torch.empty((-(-numel // 2), 1), dtype=torch.uint8, device=device),
                                             requires_grad=False)
            self.bias = linear.bias
            blocks = -(-numel // 64)
            if fmt.double_quant:
                self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
                self.register_buffer("nested_absmax", torch.empty(-(-blocks // 256), dtype=torch.float32,
                                                                  device=device))
                self.register_buffer("nested_code", torch.empty(256, dtype=torch.float32, device=device))
                self.register_buffer("offset", torch.empty((), dtype=torch.float32, device=device))
            else:
                self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=device))
            self.register_buffer("code", torch.empty(16, dtype=torch.float32, device=device))
            self.compute_dtype = getattr(torch, fmt.compute_dtype)

        def forward(self, x):  # Linear4bit.forward: compute in compute_dtype, answer in the input's dtype
            dtype = x.dtype
            bias = None if self.bias is None else self.bias.to(self.compute_dtype)
            return MatMul4BitStandIn.apply(x.to(self.compute_dtype), self.weight, bias, self.shape).to(dtype)

    return Linear4bitStandIn


def quantize_base(model: Any, weights: set[int], fmt: WeightFormat) -> dict[str, Any]:
    """Replace, in place, every nn.Linear of `model` whose weight object is in `weights` (ids) by the stand-in;
    returns each replaced module by its path (what logical_copy puts back: kept out of the module, whose traces
    convert only its own tensors)."""
    import torch

    stand_in = linear4bit_class()
    replaced: dict[str, Any] = {}
    for path, parent in list(model.named_modules()):
        for attr, child in list(parent._modules.items()):
            # exactly nn.Linear (or transformers' Conv1D, which the quantiser converts too): PEFT's lora.Linear
            # wraps one (as base_layer) and is not replaced itself
            if (type(child) is torch.nn.Linear or _is_conv1d(child)) and id(child.weight) in weights:
                parent._modules[attr] = stand_in(child, fmt)
                replaced[f"{path}.{attr}" if path else attr] = child
    return replaced


def _is_conv1d(module: Any) -> bool:
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers.")


def logical_copy(model: Any, replaced: dict[str, Any]) -> Any:
    """A copy of `model` with every stand-in back as the module it replaced (`replaced`, by path, as quantize_base
    gives it): what a count of parameters shows, logical weights rather than packed bytes (a QLoRA plan's tree
    and treemaps, as PEFT counts it). The stand-ins' other tensors (the bias) stay shared, as they were."""
    import copy

    copied = copy.deepcopy(model)
    for path, original in replaced.items():
        parent_path, _, attr = path.rpartition(".")
        parent = copied.get_submodule(parent_path) if parent_path else copied
        parent._modules[attr] = original
    return copied
