"""Tensor parallelism for transformers' Conv1D (GPT-2's projections), as torch ParallelStyles (Megatron's cut).

Conv1D is a linear layer with its weight stored [in, out] (forward: addmm(bias, x, weight)), which torch's
ColwiseParallel and RowwiseParallel refuse (nn.Linear and nn.Embedding only). The styles here are torch's, with
the partition of a Conv1D's parameters in place of a Linear's; the input and output handling is torch's own:

- column-parallel (GPT-2's attn.c_attn and mlp.c_fc): the weight Shard(1) (its output features), the bias Shard(0);
  the input Replicate (its gradient all-reduced in backward), the output Shard(-1) handed on as the rank's local part;
- the fused attn.c_attn (q | k | v side by side, [h, 3h]) is regrouped first, as Megatron's fused QKV is laid out,
  so that rank r's Shard(1) holds its heads' q columns, then the same heads' k, then v (and the bias alike): the
  class's own `split(split_size, dim=2)` then cuts each rank's output into its q, k and v, once the attention's
  split_size is the rank's width h / t (set here; its head count comes from the `view(..., -1, head_dim)`);
- row-parallel (attn.c_proj and mlp.c_proj): the weight Shard(0) (its input features), the bias Replicate, so DTensor's
  addmm turns it Partial (the whole bias on one rank, zeros on the others) and the all-reduce or reduce-scatter of
  the partial sums adds it once.

The forward runs on DTensors (addmm and view propagate their placements), as torch's styles run nn.Linear's.
"""

from __future__ import annotations

from typing import Any

from ...errors import OptionError, UnsupportedError

CONV1D = "Conv1D"
# paramscope's style names for a Conv1D (Rule.style), beside transformers' colwise / rowwise
COLWISE, COLWISE_QKV, ROWWISE = "conv1d_colwise", "conv1d_colwise_qkv", "conv1d_rowwise"
STYLES = (COLWISE, COLWISE_QKV, ROWWISE)
# Megatron's cut of GPT-2's layer, by the module's name suffix
GPT2_NAMES = ((".attn.c_attn", COLWISE_QKV), (".attn.c_proj", ROWWISE), (".mlp.c_fc", COLWISE),
              (".mlp.c_proj", ROWWISE))


def is_conv1d(module: Any) -> bool:
    return type(module).__name__ == CONV1D and hasattr(module, "nf") and hasattr(module, "nx")


def conv1d_rule(name: str, module: Any) -> str | None:
    """The style of a GPT-2 layer's Conv1D named `name`, or None where Megatron's cut names none."""
    if not is_conv1d(module):
        return None
    return next((style for suffix, style in GPT2_NAMES if name.endswith(suffix)), None)


def sharded_axis(style: str) -> int:
    """The weight's axis a style cuts: Conv1D's weight is [in, out]."""
    return 0 if style == ROWWISE else 1


def grouped_qkv(tensor: Any, tp: int) -> Any:
    """The fused q | k | v columns (the last dim, 3·h wide) regrouped rank by rank, so that Shard on that dim over
    `tp` ranks gives rank r its q columns [r·h/t, (r+1)·h/t), then the same k, then v: [..., 3, t, h/t] →
    [..., t, 3, h/t]."""
    *lead, width = tensor.shape
    return tensor.reshape(*lead, 3, tp, width // 3 // tp).transpose(-3, -2).reshape(*lead, width)


def check_fused_qkv(module: Any, name: str, attention: Any, tp: int) -> None:
    """One line for a fused c_attn this style does not cut: not 3 × the attention's split_size wide, or a head
    count tp does not divide."""
    width, split = module.nf, getattr(attention, "split_size", None)
    heads = getattr(attention, "num_heads", None)
    if split is None or width != 3 * split or not heads:
        raise UnsupportedError(f"tensor parallel over {name}: {width:,} output features are not q, k and v of "
                               f"{split!r} each")
    if heads % tp:
        raise OptionError("tp {tp} does not divide the {heads} attention heads of {name}", tp=tp, heads=heads,
                          name=name)


def localize_attention(attention: Any, tp: int) -> None:
    """The attention module's widths as the rank sees them: split_size (how the class cuts its fused q | k | v
    output) and num_heads become the rank's h / t and heads / t."""
    attention.split_size //= tp
    attention.num_heads //= tp


def conv1d_style(style: str, *, sequence_parallel: bool, tp: int) -> Any:
    """The torch ParallelStyle for a Conv1D of `style` (built lazily: torch.distributed is imported only when a
    trace runs)."""
    from torch.distributed.tensor import Replicate, Shard

    colwise, rowwise = _style_classes()
    if style == ROWWISE:
        return rowwise(output_layouts=Shard(1) if sequence_parallel else Replicate())
    return colwise(fused_qkv_ranks=tp if style == COLWISE_QKV else None)


_CLASSES: tuple[type, type] | None = None


def _style_classes() -> tuple[type, type]:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _make_style_classes()
    return _CLASSES


def _make_style_classes() -> tuple[type, type]:
    from functools import partial

    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def register(module: Any, key: str, tensor: Any, placement: Any, mesh: Any, src: Any) -> None:
        param = module._parameters[key]
        module.register_parameter(key, torch.nn.Parameter(
            distribute_tensor(tensor, mesh, [placement], src_data_rank=src), requires_grad=param.requires_grad))

    class Conv1DColwiseParallel(ColwiseParallel):
        """ColwiseParallel for a Conv1D: weight Shard(1), bias Shard(0); a fused q | k | v regrouped per rank."""

        def __init__(self, *, fused_qkv_ranks: int | None = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.fused_qkv_ranks = fused_qkv_ranks

        def _partition_conv1d_fn(self, _name: str, module: Any, mesh: Any) -> None:
            if module is None or not is_conv1d(module):
                return
            for key, placement in (("weight", Shard(1)), ("bias", Shard(0))):
                param = module._parameters.get(key)
                if param is None:
                    continue
                data = param.detach()
                if self.fused_qkv_ranks:
                    data = grouped_qkv(data, self.fused_qkv_ranks)
                register(module, key, data, placement, mesh, self.src_data_rank)

        def _apply(self, module: Any, device_mesh: Any) -> Any:
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            return distribute_module(
                module, device_mesh, self._partition_conv1d_fn,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    class Conv1DRowwiseParallel(RowwiseParallel):
        """RowwiseParallel for a Conv1D: weight Shard(0), bias Replicate (added once: Partial in the addmm)."""

        def _partition_conv1d_fn(self, _name: str, module: Any, mesh: Any) -> None:
            if module is None or not is_conv1d(module):
                return
            for key, placement in (("weight", Shard(0)), ("bias", Replicate())):
                param = module._parameters.get(key)
                if param is not None:
                    register(module, key, param.detach(), placement, mesh, self.src_data_rank)

        def _apply(self, module: Any, device_mesh: Any) -> Any:
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)  # as RowwiseParallel's Linear: the input split on features
            return distribute_module(
                module, device_mesh, self._partition_conv1d_fn,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    return Conv1DColwiseParallel, Conv1DRowwiseParallel
