"""The MoE experts' offsets a training step still holds at its optimizer step.

transformers' packed experts (grouped_mm_experts_forward) make one int32 offsets tensor a MoE layer, one entry per
expert the layer holds, and pass it to both grouped matmuls. Where the experts' weights are not bf16, the traced step
runs transformers' grouped-mm fallback (torch's fake grouped_mm kernel takes bf16 only, the CUDA kernel's rule), an
autograd Function that keeps the offsets as an attribute of its node (ctx.offs), not as a saved tensor: the backward
frees the saved tensors but not the node's attributes, and the loss, kept to the step's end, keeps the graph and so
the offsets. Under bf16 weights torch's own grouped_mm runs, whose node keeps nothing past the backward.

One rule for every engine that prices the optimizer step: one device's (memory/training.py) and a layout's rank
(parallel/estimate.py, where each layer holds its E / ep experts)."""

from __future__ import annotations

from typing import Any, Iterable

from .states import trained_dtype


def expert_offsets(params: Iterable[Any], precision: str, own: frozenset[str] = frozenset(), *,
                   config: Any = None, local: bool = False) -> tuple[int, str]:
    """(bytes, words) of the offsets held at the optimizer step: 4 B × the experts each MoE layer holds, over the MoE
    layers whose packed experts ([E, …] parameters of role moe.experts) train in a dtype other than bf16. `params`:
    ParameterInfo (one device) or Placement (a rank, `local`: its local shape, E / ep experts a layer). `config`: the
    class's, whose experts implementation other than grouped_mm (eager, batched_mm) makes no offsets."""
    implementation = getattr(config, "_experts_implementation", None) if config is not None else None
    if implementation not in (None, "grouped_mm"):
        return 0, ""
    experts: dict[str, int] = {}
    for p in params:
        shape = p.local_shape if local else p.shape
        if p.role == "moe.experts" and len(shape) == 3 and trained_dtype(p, precision, own) != "bfloat16":
            experts[p.name.rsplit(".", 1)[0]] = shape[0]
    if not experts:
        return 0, ""
    held = 4 * sum(experts.values())
    counts = "/".join(str(n) for n in sorted(set(experts.values())))
    return held, (f"each MoE layer's expert offsets, {len(experts)} × {counts} experts × 4 B = {held:,} B "
                  "(transformers' grouped-mm fallback keeps them on its autograd node)")
