"""FLOPs, traced, on one tensor-parallel rank: FlopCounterMode over the real class with DTensor TP on a fake group.

    module (meta) → parallel.py's parallel_copy (torch's parallelize_module on a fake process group) → one rank's
    forward and backward under FlopCounterMode, each op counted at the shapes of the rank's local tensors

FlopCounterMode is a dispatch mode: it sees a DTensor op before DTensor splits it into the rank's local op, so its
formulas would read the DTensors' global shapes (a column-parallel matmul counted whole). Here every formula reads
the local tensors instead (`_local_tensor`), which is what the rank computes; ops on plain tensors (attention on the
rank's own heads, after ColwiseParallel's local outputs) are counted as they are. The check of the analytic per-device
count (parallel/flops.py) for tensor parallelism.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .step import StepSettings


@dataclass(frozen=True)
class RankFlops:
    forward: int
    backward: int | None  # as counted: model FLOPs plus the fused attention's recomputed scores


def count_rank_flops(module: Any, settings: StepSettings, *, tp: int = 1, sp: bool = False, rank: int = 0,
                     training: bool = True, ep: int = 1, load: float = 1) -> RankFlops:
    """One forward (and backward) of tp rank `rank` of `module` (meta-built, not modified), at `settings.batch`
    sequences of `settings.seq` tokens; or, with `ep`, expert-parallel rank `rank` over ep data-parallel ranks
    (torchtitan's ExpertParallel, traced/expert_parallel.py), rank 0 the busiest under a `load` above 1."""
    from torch.utils.flop_counter import FlopCounterMode

    from .parallel import check_layout, parallel_copy
    from .step import loss_of, running, training_inputs

    layout = check_layout(ep, "none", tp, sp, rank, ep, 1, load)
    settings = dataclasses.replace(settings, grad_checkpointing=False)
    with parallel_copy(module, settings, layout) as (model, _notes, _assumed):
        model.train(training)
        inputs = training_inputs(model, settings)
        if not training:
            inputs.pop("labels", None)
        import torch

        with running(model):
            counter = FlopCounterMode(display=False, depth=None, custom_mapping=local_formulas())
            with counter, torch.set_grad_enabled(training):
                output = model(**inputs)
                loss = loss_of(output) if training else None
            forward = counter.get_total_flops()
            backward = None
            if training:
                counter = FlopCounterMode(display=False, depth=None, custom_mapping=local_formulas())
                with counter:
                    loss.backward()
                backward = counter.get_total_flops()
    return RankFlops(forward, backward)


def local_formulas() -> dict[Any, Any]:
    """torch's FLOP formulas (and flops.py's for the ops it lacks), each reading DTensors' local tensors."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    from .flops import missing_formulas

    def local(value: Any) -> Any:
        return value._local_tensor if isinstance(value, DTensor) else value

    formulas = {op: formula for op, formula in flop_registry.items()}  # already shape-wrapped
    formulas.update({op: shape_wrapper(formula) for op, formula in missing_formulas().items()})
    out = {}
    for op, formula in formulas.items():
        def on_local(*args: Any, out_val: Any = None, _formula: Any = formula, **kwargs: Any) -> int:
            args, kwargs, out_val = tree_map(local, (args, kwargs, out_val))
            return _formula(*args, out_val=out_val, **kwargs)

        on_local._get_raw = True  # FlopCounterMode passes the tensors themselves, not their shapes
        out[op] = on_local
    return out
