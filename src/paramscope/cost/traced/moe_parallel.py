"""Tensor parallelism for transformers' packed MoE experts, as a torch ParallelStyle (Megatron's expert TP).

transformers 5 keeps a layer's routed experts in one module with 3-D parameters, gate_up_proj [E, 2I, h] (each
expert's gate rows, then its up rows) and down_proj [E, h, I], and its tp_plan names them with styles of its own
(`packed_colwise`, `moe_tp_experts`) that torch has no ParallelStyle for. PackedExpertsParallel is that style, cut as
Megatron cuts each expert's MLP:

- gate and up column-wise on the intermediate dim: the packed rows are regrouped so that rank r's Shard(1) holds
  rows [r·I/t, (r+1)·I/t) of the gate and the same rows of the up (what a plain Shard(1) of the packed tensor would
  not give), so the class's own `chunk(2, dim=-1)` splits each rank's product into its gate and up halves;
- down row-wise: Shard(2), its input features;
- the router and anything else in the MoE block are left to the caller (replicated);
- the module's input is the whole token set on every rank (Replicate), its gradient all-reduced in backward
  (Megatron's f: identity forward, all-reduce backward), as ColwiseParallel does for a projection's input;
- each rank's output is its experts' partial sum: all-reduced (Replicate), or, under sequence parallel, handed on as
  a Partial DTensor for the MoE block's output to reduce-scatter on the sequence (the block reshapes the experts'
  flat [B·S, h] tokens back to [B, S, h] first, so the scatter cannot happen inside the experts module).

The class's forward indexes and multiplies its parameters directly (self.gate_up_proj[e]) and mixes them with plain
tensors, which DTensor refuses; so for the length of its forward the module sees each parameter's local shard
(DTensor.to_local, differentiable: the gradient lands on the DTensor parameter as the same Shard), as torchtitan's
GroupedExperts does with `w.to_local()` in its own forward.
"""

from __future__ import annotations

from typing import Any

from ...errors import OptionError, UnsupportedError

PACKED_STYLES = {"gate_up_proj": "packed_colwise", "down_proj": "rowwise"}  # transformers' parameter-level entries
EXPERTS_STYLE = "moe_tp_experts"  # transformers' module-level entry
# paramscope's styles for a shared expert under sequence parallel (see shared_expert_styles)
SHARED_DOWN_STYLE = "rowwise_partial_output"
SHARED_GATE_STYLE = "replicated_dtensor_output"


def _torch_parallel_style() -> type:
    from torch.distributed.tensor.parallel import ParallelStyle

    return ParallelStyle


def packed_experts_style(sequence_parallel: bool) -> Any:
    """A PackedExpertsParallel (built lazily: torch.distributed is imported only when a trace runs)."""
    return _style_class()(sequence_parallel=sequence_parallel)


_STYLE: type | None = None


def _style_class() -> type:
    global _STYLE
    if _STYLE is None:
        _STYLE = _make_style_class()
    return _STYLE


def check_packed_experts(module: Any, name: str, tp: int) -> None:
    """One line for an experts module this style does not cut: other parameters, another layout of the packed
    weights, or an intermediate width tp does not divide."""
    params = dict(module.named_parameters(recurse=False))
    if set(params) != set(PACKED_STYLES) or any(True for child in module.children() for _ in child.parameters()):
        raise UnsupportedError(f"tensor parallel over {name}: its experts hold {', '.join(sorted(params))}; the "
                               "packed-experts style cuts gate_up_proj and down_proj only")
    if (getattr(module, "is_transposed", False) or not getattr(module, "is_concatenated", True)
            or getattr(module, "has_bias", False) or not getattr(module, "has_gate", True)):
        raise UnsupportedError(f"tensor parallel over {name}: its experts store gate and up transposed, "
                               "interleaved or with biases; the packed-experts style takes [E, 2I, h] gate-then-up")
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0] \
            or gate_up.shape[1] != 2 * down.shape[2] or gate_up.shape[2] != down.shape[1]:
        raise UnsupportedError(f"tensor parallel over {name}: gate_up_proj {tuple(gate_up.shape)} and down_proj "
                               f"{tuple(down.shape)} are not [E, 2I, h] and [E, h, I]")
    intermediate = down.shape[2]
    if intermediate % tp:
        raise OptionError("tp {tp} does not divide the experts' intermediate size {size:,} of {name}", tp=tp,
                          size=intermediate, name=name)


def grouped_gate_up(gate_up: Any, tp: int) -> Any:
    """The packed [E, 2I, h] gate-then-up rows regrouped rank by rank, so that Shard(1) over `tp` ranks gives rank r
    its gate rows [r·I/t, (r+1)·I/t) followed by the same up rows: [E, (gate|up), t, I/t, h] → [E, t, (gate|up),
    I/t, h]."""
    experts, rows, hidden = gate_up.shape
    return gate_up.reshape(experts, 2, tp, rows // 2 // tp, hidden).transpose(1, 2).reshape(experts, rows, hidden)


def _make_style_class() -> type:
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    class PackedExpertsParallel(_torch_parallel_style()):
        """Megatron's expert tensor parallelism on a packed experts module (see the module's docstring)."""

        def __init__(self, *, sequence_parallel: bool = False) -> None:
            super().__init__()
            self.sequence_parallel = sequence_parallel

        def _apply(self, module: Any, device_mesh: Any) -> Any:
            gate_up, down = module.gate_up_proj, module.down_proj
            grouped = grouped_gate_up(gate_up.detach(), device_mesh.size())
            module.register_parameter("gate_up_proj", torch.nn.Parameter(
                distribute_tensor(grouped, device_mesh, [Shard(1)], src_data_rank=self.src_data_rank),
                requires_grad=gate_up.requires_grad))
            module.register_parameter("down_proj", torch.nn.Parameter(
                distribute_tensor(down.detach(), device_mesh, [Shard(2)], src_data_rank=self.src_data_rank),
                requires_grad=down.requires_grad))
            module.register_forward_pre_hook(
                lambda mod, args, kwargs: self._enter(mod, args, kwargs, device_mesh), with_kwargs=True)
            module.register_forward_hook(lambda mod, args, output: self._leave(mod, output, device_mesh))
            return module

        @staticmethod
        def _enter(module: Any, args: tuple, kwargs: dict, mesh: Any) -> tuple[tuple, dict]:
            for key in PACKED_STYLES:  # the local shards for the length of the forward (see the module docstring)
                param = module._parameters[key]
                object.__setattr__(module, key, param.to_local() if isinstance(param, DTensor) else param)

            def whole(x: Any) -> Any:  # Replicate in, its gradient all-reduced (Partial → Replicate) in backward
                if isinstance(x, DTensor):
                    x = x.redistribute(mesh, [Replicate()]).to_local()
                return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(
                    grad_placements=[Partial()])

            if args:
                return (whole(args[0]), *args[1:]), kwargs
            first = next(iter(kwargs))
            return args, {**kwargs, first: whole(kwargs[first])}

        def _leave(self, module: Any, output: Any, mesh: Any) -> Any:
            for key in PACKED_STYLES:
                module.__dict__.pop(key, None)
            partial = DTensor.from_local(output, mesh, [Partial()], run_check=False)
            if self.sequence_parallel:
                return partial  # the MoE block's output reduce-scatters it, once it has its [B, S, h] shape
            return partial.redistribute(mesh, [Replicate()]).to_local()

    return PackedExpertsParallel


def shared_expert_styles(style: str) -> Any:
    """A shared expert beside the packed ones under sequence parallel (Qwen2-MoE's mlp.shared_expert and its
    one-output mlp.shared_expert_gate), cut as torchtitan cuts a shared expert under TP and SP: its input the MoE
    block's gathered tokens, gate and up column-wise, down row-wise with its output left Partial (no all-reduce of
    its own), so that the block adds it to the experts' Partial sums and its output reduce-scatters the one sum.
    The gate (sigmoid(x·w), one number a token) stays whole and runs on every rank's whole token set, its output a
    Replicate DTensor: the product of a Replicate scale and a Partial sum is Partial (linear), so the sum is the
    same; its weight's gradient is Partial (each rank's from its partial sums) until the optimizer step all-reduces
    it, as Megatron all-reduces the gate weight it marks sequence_parallel. Megatron applies the gate after its
    reduce-scatter, on the rank's own tokens; transformers' block applies it before the add, so here it sees the
    whole sequence."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_module
    from torch.distributed.tensor.parallel import RowwiseParallel

    if style == SHARED_DOWN_STYLE:
        return RowwiseParallel(output_layouts=Partial(), use_local_output=False)

    class ReplicatedGate(_torch_parallel_style()):
        def _apply(self, module: Any, device_mesh: Any) -> Any:
            import torch

            def partition(_name: str, sub: Any, mesh: Any) -> None:  # same tensors, no copy (as tensor_parallel.replicate_the_rest)
                for key, param in list(sub.named_parameters(recurse=False)):
                    sub.register_parameter(key, torch.nn.Parameter(
                        DTensor.from_local(param.data, mesh, [Replicate()], run_check=False),
                        requires_grad=param.requires_grad))

            def whole(_module: Any, inputs: tuple, mesh: Any) -> tuple:
                return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                             if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

            return distribute_module(module, device_mesh, partition, input_fn=whole)

    return ReplicatedGate()


def sequence_parallel_block(call: tuple[int, str | None]) -> Any:
    """Under sequence parallel, the MoE block around the experts: its input gathered (Shard(1) → Replicate) as any
    block holding column-parallel projections, and its output, the experts' Partial sum reshaped to [B, S, h],
    reduce-scattered on the sequence (Shard(1)), as a row-parallel output is. `call`: how the block takes its hidden
    states (positional count, or the keyword), as parallel._calls reads it."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    positional, keyword = call
    if keyword is not None:
        inputs = dict(input_kwarg_layouts={keyword: Shard(1)}, desired_input_kwarg_layouts={keyword: Replicate()})
    else:
        rest = (None,) * (positional - 1)
        inputs = dict(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))
    return PrepareModuleInputOutput(**inputs, use_local_input=True, output_layouts=Partial(),
                                    desired_output_layouts=Shard(1), use_local_output=True)
