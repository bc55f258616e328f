"""FLOPs, traced: torch's FlopCounterMode over the real class on fake tensors, with the holes it has filled.

    module → fake copy (traced/step.py) → forward (and backward) under FlopCounterMode → FLOPs per module → by role

FlopCounterMode counts matmuls, convolutions and attention kernels with a matmul of m×k by k×n costing 2mnk,
attention in full (no causal halving) and elementwise ops not at all. Two of its holes are filled here:
- CPU sdpa runs `_scaled_dot_product_flash_attention_for_cpu` (and its backward), which it does not know and
  counts as 0 (pytorch #195460); they get torch's own sdpa formulas.
- transformers 5's default MoE experts run `_grouped_mm` (or transformers' fallback op for non-bf16 weights),
  which it does not know; they get 2 × rows × k × n. Routing then costs what the model's routing costs: every
  token passes exactly its top-k experts, since the grouped kernels take the tokens sorted by expert, k rows each,
  whatever the router picked (fake tensors pick arbitrarily, but always k).

Each op is attributed to the innermost module running it; a module's role is its weight's role (a projection's,
the experts', the lm_head's), and attention kernels run by an attention module are "attention.scores".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ... import progress
from ...frozen import FrozenDict, freeze_fields
from .step import (
    StepSettings, assumed_values, autocast_for, enable_checkpointing, fake_mode, loss_of, running, training_inputs, working_copy,
)


@dataclass(frozen=True)
class TracedFlops:
    forward: int
    backward: int | None  # training only, as counted: the recomputations included (hardware FLOPs)
    forward_by_module: FrozenDict[str, int]  # innermost module path → its own forward FLOPs
    backward_by_module: FrozenDict[str, int]
    fused_attention_forward: int  # FLOPs of fused attention kernels (flash, memory-efficient) in the forward
    fused_attention_backward: int  # … in the backward: 2 × the forward + the scores' recomputation
    backward_without_checkpointing: int | None = None  # with checkpointing: the same backward without it

    def __post_init__(self) -> None:
        freeze_fields(self, "forward_by_module", "backward_by_module")

    @property
    def model_backward(self) -> int | None:
        """The backward's model FLOPs: without checkpointing's reruns or the fused kernels' recomputed scores."""
        if self.backward is None:
            return None
        plain = self.backward if self.backward_without_checkpointing is None else self.backward_without_checkpointing
        return plain - max(self.fused_attention_backward - 2 * self.fused_attention_forward, 0)

    @property
    def recompute(self) -> int | None:
        """Hardware FLOPs beyond the model's: the recomputed scores, and checkpointed layers' reruns."""
        return None if self.backward is None else self.backward - self.model_backward


def count_flops(module: Any, settings: StepSettings, *, training: bool,
                plain: TracedFlops | None = None) -> TracedFlops:
    """Count one forward (and, for training, the backward) of `module` on fake tensors.

    With gradient checkpointing the step is counted twice, with and without it: the difference is the reruns
    (non-reentrant checkpointing stops rerunning a layer once backward has what it needs, so they are less
    than the layers' forward). `plain`: the step without checkpointing (these settings, training), where the caller
    has counted it already (not counted again)."""
    with progress.status(f"counting {type(module).__name__}'s FLOPs on fake tensors (FlopCounterMode)"):
        return _count_flops(module, settings, training=training, plain=plain)


def _count_flops(module: Any, settings: StepSettings, *, training: bool,
                 plain: TracedFlops | None = None) -> TracedFlops:
    import dataclasses

    counted = _count(module, settings, training=training)
    if training and settings.grad_checkpointing:
        if plain is None:
            plain = _count(module, dataclasses.replace(settings, grad_checkpointing=False), training=True)
        counted = dataclasses.replace(counted, fused_attention_backward=plain.fused_attention_backward,
                                      backward_without_checkpointing=plain.backward)
    return counted


def _count(module: Any, settings: StepSettings, *, training: bool) -> TracedFlops:
    from torch.utils.flop_counter import FlopCounterMode

    with fake_mode(True) as mode, assumed_values(True):
        model = working_copy(module, mode, settings.attention)
        model.train(training)
        for name, param in model.named_parameters():
            if name in settings.frozen:
                param.requires_grad_(False)
        if training and settings.grad_checkpointing:
            enable_checkpointing(model)
        import torch

        inputs = training_inputs(model, settings)
        if not training:
            inputs.pop("labels", None)
            if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
                inputs["decoder_input_ids"] = torch.zeros((settings.batch, settings.seq), dtype=torch.long)

        with running(model):
            counter = FlopCounterMode(display=False, depth=None, custom_mapping=_missing_formulas())
            with counter, torch.set_grad_enabled(training), autocast_for(settings.precision):
                output = model(**inputs)
                loss = loss_of(output) if training else None
            forward = counter.get_flop_counts()
            backward = None
            if training:
                counter = FlopCounterMode(display=False, depth=None, custom_mapping=_missing_formulas())
                with counter:
                    loss.backward()
                backward = counter.get_flop_counts()
    root = type(model).__name__
    forward_own = _own(forward, root)
    backward_own = _own(backward, root) if backward is not None else {}
    fused_forward = _fused_attention(forward.get("Global", {}))
    fused_backward = _fused_attention((backward or {}).get("Global", {}))
    return TracedFlops(sum(forward_own.values()), sum(backward_own.values()) if backward is not None else None,
                       forward_own, backward_own, fused_forward, fused_backward)


@dataclass(frozen=True)
class TracedGeneration:
    """generate()'s FLOPs as FlopCounterMode counts them: the prefill (logits for the last token only, as generate
    asks) and each decode step after it, one token a sequence with the cache."""

    prefill: int
    steps: tuple[int, ...]  # decode step j (1-based) attends over seq + j keys


def count_generation(module: Any, batch: int, seq: int, steps: int) -> TracedGeneration:
    """Count generate()'s prefill of `seq` tokens and `steps` decode steps of `module` on fake tensors."""
    with progress.status(f"counting {type(module).__name__}'s generation FLOPs on fake tensors (FlopCounterMode)"):
        return _count_generation(module, batch, seq, steps)


def _count_generation(module: Any, batch: int, seq: int, steps: int) -> TracedGeneration:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ...errors import UnsupportedError
    from .step import cache_argument, generation_inputs, output_cache

    with fake_mode(True) as mode, assumed_values(True):
        model = working_copy(module, mode, None)
        model.eval()
        kwargs, step_ids = generation_inputs(model, batch, seq)
        if kwargs is None:
            raise UnsupportedError(f"{type(model).__name__} does not generate")
        counts = []
        with running(model), torch.no_grad():
            counter = FlopCounterMode(display=False, depth=None, custom_mapping=_missing_formulas())
            with counter:
                output = model(**kwargs)
            counts.append(counter.get_total_flops())
            name = cache_argument(model)
            cache = output_cache(output)
            for _ in range(steps):
                counter = FlopCounterMode(display=False, depth=None, custom_mapping=_missing_formulas())
                with counter:
                    output = model(input_ids=step_ids, use_cache=True, **{name: cache})
                counts.append(counter.get_total_flops())
                cache = output_cache(output)
    return TracedGeneration(counts[0], tuple(counts[1:]))


def _fused_attention(ops: dict[Any, int]) -> int:
    return sum(v for op, v in ops.items() if "scaled_dot_product" in str(op))



def _own(counts: dict[str, dict[Any, int]], root: str) -> dict[str, int]:
    """Each module's own FLOPs (its count minus its children's), keyed by its path below the root."""
    totals = {name: sum(ops.values()) for name, ops in counts.items() if name != "Global"}
    own: dict[str, int] = {}
    for name, total in totals.items():
        prefix = name + "."
        children = [c for c in totals if c.startswith(prefix) and "." not in c[len(prefix):]]
        value = total - sum(totals[c] for c in children)
        if value:
            key = name[len(root) + 1:] if name.startswith(root + ".") else ("" if name == root else name)
            own[key] = own.get(key, 0) + value
    rest = sum(counts.get("Global", {}).values()) - sum(own.values())
    if rest:
        own["(outside any module)"] = rest
    return own


def _missing_formulas() -> dict[Any, Any]:
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def cpu_flash(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def cpu_flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    def grouped_mm(mat_a, mat_b, *args, out_shape=None, **kwargs) -> int:
        return _grouped_mm_flops(tuple(mat_a), tuple(mat_b))

    def fallback_backward(input, weight, offs, grad_output, *args, out_shape=None, **kwargs) -> int:
        return 2 * _grouped_mm_flops(tuple(input), tuple(weight))  # the input's gradient and the weights'

    mapping: dict[Any, Any] = {
        aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_backward,
    }
    if hasattr(aten, "_grouped_mm"):
        mapping[aten._grouped_mm] = grouped_mm
    transformers_ops = getattr(torch.ops, "transformers", None)
    for name, formula in (("grouped_mm_fallback", grouped_mm), ("grouped_mm_fallback_backward", fallback_backward)):
        try:
            mapping[getattr(transformers_ops, name)] = formula
        except (AttributeError, RuntimeError):  # transformers without its MoE ops
            pass
    return mapping


def missing_formulas() -> dict[Any, Any]:
    """The formulas FlopCounterMode lacks (CPU flash sdpa and its backward, the MoE grouped matmuls), for another
    counter to build on (parallel_flops.py reads them at a rank's local shapes)."""
    return _missing_formulas()


def _grouped_mm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """2 × rows × k × n for the shapes a grouped matmul takes (the groups split rows or the contraction)."""
    if len(a) == 2 and len(b) == 3:  # tokens (M, K) by experts (E, K, N): each row meets one expert
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 3 and len(b) == 3:  # batched (E, M, K) by (E, K, N)
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 2 and len(b) == 2:  # a weight gradient (K, M) by (M, N), grouped along M
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 2:  # (E, M, K) by (K, N) grouped by experts
        return 2 * a[0] * a[1] * a[2] * b[1]
    return 0


def by_role(own: dict[str, int], roles: dict[str, str]) -> dict[str, int]:
    """Module FLOPs → roles: a module's role is its weight's; attention kernels are "attention.scores".

    `roles` maps a module path to its weight's role (from the counted parameters)."""
    result: dict[str, int] = {}
    for path, value in own.items():
        role = roles.get(path)
        if role is not None and role.startswith("embeddings"):  # lookups cost nothing: a tied head's matmul
            role = "head.lm"
        if role is None:  # a module without weights inside an attention block runs its kernels (BERT's
            # attention.self, Llama's self_attn)
            role = "attention.scores" if re.search(r"attn|attention", path, re.IGNORECASE) else "other"
        result[role] = result.get(role, 0) + value
    return result


def module_roles(params: Any) -> dict[str, str]:
    """Module path → the role of its weight (or of its first parameter), from the counted parameters."""
    roles: dict[str, str] = {}
    for param in params:
        for name in (param.name, *param.aliases):
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" or module not in roles:
                roles[module] = param.role if leaf == "weight" or module not in roles else roles[module]
    return roles
