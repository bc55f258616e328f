"""Model states of a training step, exact: weights, gradients, optimizer states and master weights, per device.

The step is the steady one (optimizer states already allocated) of transformers' Trainer defaults:

    loss = model(ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

Precisions (Lightning's names):
- `fp32`: fp32 weights, gradients and optimizer states.
- `bf16-mixed` / `fp16-mixed`: autocast. The fp32 weights are the master copy, gradients are fp32; no separate
  master copy exists (`master_weights` is 0 and says so).
- `bf16-pure`: everything in bf16, optimizer states too (torch creates them like the parameter).
- `bf16-master`: bf16 weights and gradients, an fp32 master copy of every trained weight and the optimizer's states
  on that copy (fp32): DeepSpeed's `"bf16": {"enabled": true}` and the ZeRO paper's mixed precision (2 + 2 + 12 B a
  parameter under Adam). The forward and backward are bf16-pure's (no autocast: the module is bf16); at the optimizer
  step each gradient is cast to fp32 into the master's gradient, the bf16 gradients are freed, the optimizer updates
  the masters, the fp32 gradients are freed and the masters are copied back into the bf16 weights (DeepSpeed's
  runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.step: `flat_grad_partition.to(fp32)`, then
  `free_grad_in_param_list`, `_optimizer_step`, `.grad = None`, `bit16_partitions[...].copy_(fp32_partition)`).
- `bf16-main-grad`: Megatron-LM's default bf16 training (Megatron-Core's DistributedDataParallel with
  `accumulate_allreduce_grads_in_fp32`, its default under bf16): bf16 weights, an fp32 main-gradient buffer of every
  trained weight (4 B, one contiguous buffer the DDP wrapper allocates before the first step and keeps: each bf16
  gradient is added into `param.main_grad` by a hook and freed, so it is resident from the forward on), fp32 masters
  and Adam moments (12 B): 18 B a parameter, 6 + 12/d under the distributed optimizer (ZeRO-1's share; the gradient
  buffer is reduce-scattered in place but held whole), as megatron/training/theoretical_memory_usage.py counts them.
  The step casts nothing: `main_param.grad = model_param.main_grad.float()` is the fp32 buffer itself
  (distrib_optimizer.py's `shard_model_grad.float()`, a view of it), so it holds the masters' update beside the buffer.

Optimizers (torch's, as the Trainer builds them; states take the parameter's dtype):
- `adamw`, `adam`: exp_avg and exp_avg_sq, 2 × n, and a fp32 `step` scalar per tensor (fused, the Trainer's default
  `adamw_torch_fused`, keeps it on the device);
- `sgd`: none; `sgd-momentum`: momentum_buffer, n; `lion`: exp_avg, n;
- `adafactor` (torch.optim.Adafactor): a factored second moment, rows + columns for each matrix (per matrix of a
  stacked tensor), n for a vector, and the step;
- `adamw-8bit` (bitsandbytes): two uint8 states with one fp32 absmax per block of 256 for tensors of 4,096
  elements or more, fp32 states for smaller ones.

ZeRO (DeepSpeed) / FSDP: stage 1 shards optimizer states (and master weights), 2 also gradients, 3 also weights,
each evenly over the devices, rounded up. Under bf16-master the step's fp32 gradient copy is of the master's
partition (DeepSpeed casts only the partition it updates): sharded from stage 1 (master_gradient_copy).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable

from ...count import ParameterInfo
from ...errors import OptionError
from ..dtypes import itemsize

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit", "lion")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-pure", "bf16-master", "bf16-main-grad")
MASTER_PRECISION = "bf16-master"  # 16-bit weights with an fp32 master copy (DeepSpeed's bf16, the ZeRO paper's)
# bf16 weights, a resident fp32 main-gradient buffer, fp32 masters and moments (Megatron-LM's default bf16 training)
MAIN_GRAD_PRECISION = "bf16-main-grad"
# the precisions whose optimizer runs on fp32 masters of bf16 weights
MASTER_COPY_PRECISIONS = (MASTER_PRECISION, MAIN_GRAD_PRECISION)
# the optimizers the traced step runs on fp32 masters (torch's; traced/step.py)
MASTER_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum")
ZERO_ALIASES = {"0": 0, "1": 1, "2": 2, "3": 3, "ddp": 0, "no_shard": 0, "shard_grad_op": 2, "full_shard": 3,
                "hybrid_shard": 3}


@dataclass(frozen=True)
class Term:
    bytes: int
    arithmetic: str


@dataclass(frozen=True)
class ModelStates:
    weights: Term
    gradients: Term
    optimizer: Term
    master_weights: Term
    trainable: int  # parameters
    frozen: int
    precision: str
    optimizer_name: str

    @property
    def bytes(self) -> int:
        return self.weights.bytes + self.gradients.bytes + self.optimizer.bytes + self.master_weights.bytes


def check_optimizer(name: str) -> str:
    key = str(name).strip().lower().replace("_", "-")
    key = {"adamw8bit": "adamw-8bit", "sgdm": "sgd-momentum", "momentum": "sgd-momentum"}.get(key, key)
    if key not in OPTIMIZERS:
        raise OptionError("unknown {0} {name!r}; use one of {choices}", "optimizer", name=str(name)[:40],
                          choices=", ".join(OPTIMIZERS))
    return key


def check_precision(name: str) -> str:
    key = str(name).strip().lower()
    key = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "bf16-true": "bf16-pure", "32": "fp32",
           "fp32-true": "fp32"}.get(key, key)
    if key not in PRECISIONS:
        raise OptionError("unknown {0} {name!r}; use one of {choices}", "precision", name=str(name)[:40],
                          choices=", ".join(PRECISIONS))
    return key


def zero_stage(value: str | int) -> int:
    key = str(value).strip().lower().replace("-", "_")
    if key not in ZERO_ALIASES:
        raise OptionError("unknown {0} {value!r}; use 0, 1, 2, 3 or an FSDP strategy (no_shard, shard_grad_op, "
                          "full_shard)", "zero", value=str(value)[:40])
    return ZERO_ALIASES[key]


def weight_dtype(precision: str) -> str:
    return "bfloat16" if precision in ("bf16-pure", *MASTER_COPY_PRECISIONS) else "float32"


def compute_dtype(precision: str) -> str:
    return {"fp32": "float32", "bf16-mixed": "bfloat16", "fp16-mixed": "float16", "bf16-pure": "bfloat16",
            MASTER_PRECISION: "bfloat16", MAIN_GRAD_PRECISION: "bfloat16"}[precision]


def step_precision(precision: str) -> str:
    """The precision whose forward and backward the step runs: bf16-master's and bf16-main-grad's are bf16-pure's (a
    bf16 module, no autocast: DeepSpeed's engine and Megatron's Float16Module cast it); the master copy changes the
    model states and the optimizer step only."""
    return "bf16-pure" if precision in MASTER_COPY_PRECISIONS else precision


def check_master_optimizer(precision: str, optimizer: str) -> None:
    """bf16-master and bf16-main-grad run torch's optimizers on the fp32 masters; the others are refused in one line."""
    if precision in MASTER_COPY_PRECISIONS and optimizer not in MASTER_OPTIMIZERS:
        raise OptionError("{0} {master} runs torch's optimizers on the fp32 master copy; {1} {name!r} is not one: "
                          "use {choices}", "precision", "optimizer", master=precision, name=optimizer,
                          choices=", ".join(MASTER_OPTIMIZERS))


def check_master_layout(precision: str, layout: Any) -> None:
    """bf16-master is DeepSpeed's ZeRO mixed precision: modelled over data parallelism with ZeRO 0-3, beside tensor,
    context and expert parallelism (Megatron-DeepSpeed's, DeepSpeed-MoE's with ZeRO 0-2) and pipelines (DeepSpeed's
    PipelineEngine, ZeRO 0-1); FSDP2 is refused in one line (its own is --fsdp-mixed-precision policy)."""
    if precision != MASTER_PRECISION or layout is None or layout.trivial:
        return
    if layout.shard in ("zero2", "zero3") and layout.pp > 1:  # DeepSpeed's PipelineEngine asserts stage < 2
        raise OptionError("{0} {master} beside a pipeline is DeepSpeed's PipelineEngine, which runs with ZeRO 0 or 1 "
                          "(ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism, it says)", "precision",
                          master=MASTER_PRECISION)
    if layout.shard == "zero3" and layout.ep > 1:  # DeepSpeed-MoE partitions expert groups under ZeRO 1-2 only
        raise OptionError("{0} {master} beside ep is DeepSpeed-MoE's, which runs with ZeRO 0, 1 or 2 (not ZeRO-3)",
                          "precision", master=MASTER_PRECISION)
    if layout.shard not in ("none", "zero1", "zero2", "zero3"):
        raise OptionError("{0} {master} is modelled over data parallelism with {1} 0, 1, 2 or 3 (DeepSpeed's ZeRO), "
                          "beside tensor, context, expert and pipeline parallelism; not with {value}", "precision",
                          "zero", master=MASTER_PRECISION,
                          value="FSDP2 (bf16-mixed under FSDP2's MixedPrecisionPolicy prices it)")


def check_main_grad_layout(precision: str, layout: Any, *, zero: int = 0, devices: int = 1) -> None:
    """bf16-main-grad is Megatron-LM's bf16 training: plain DDP (ZeRO-0) or its distributed optimizer (ZeRO-1), beside
    its own tensor (and sequence) and pipeline parallelism. What Megatron does not run is refused in one line: FSDP2's
    shards, ZeRO-2/3 (Megatron's DDP holds the whole fp32 gradient buffer on every rank, and its distributed optimizer
    shards the masters and moments alone). Beside context and expert parallelism it is Megatron's too
    (parallel/states.main_grad_states: the distributed optimizer over dp × cp, the experts' over their
    expert-data-parallel group)."""
    if precision != MAIN_GRAD_PRECISION:
        return
    if devices > 1 and zero >= 2:
        raise OptionError("{0} {main} is Megatron-LM's bf16 training, which runs plain DDP or its distributed "
                          "optimizer ({1} 0 or 1; ZeRO-{zero} is not one: Megatron's DDP keeps the whole fp32 "
                          "gradient buffer on every rank)", "precision", "zero", main=MAIN_GRAD_PRECISION, zero=zero)
    if layout is None or layout.trivial:
        return
    if layout.shard not in ("none", "zero1"):
        what = "FSDP2's shards (bf16-mixed under FSDP2's MixedPrecisionPolicy prices them)" \
            if layout.shard in ("fsdp", "hsdp") else f"ZeRO-{layout.zero_stage}"
        raise OptionError("{0} {main} is Megatron-LM's bf16 training, which runs plain DDP or its distributed "
                          "optimizer ({1} 0 or 1, the whole fp32 gradient buffer on every rank); not {what}",
                          "precision", "zero", main=MAIN_GRAD_PRECISION, what=what)


def grad_buffer(states: ModelStates) -> int:
    """Bytes of the fp32 main-gradient buffer bf16-main-grad holds from before the forward to past the step
    (Megatron-Core's contiguous grad buffer: every moment holds it, where the other precisions' gradients are made
    in backward); 0 under the other precisions."""
    return states.gradients.bytes if states.precision == MAIN_GRAD_PRECISION else 0


def master_gradient_copy(states: ModelStates, *, devices: int = 1, zero: int = 0) -> int:
    """Bytes of the fp32 gradients bf16-master's optimizer step holds beside the bf16 ones (one per master element;
    the device's partition from ZeRO stage 1, as DeepSpeed casts only the partition it updates); 0 otherwise."""
    if states.precision != MASTER_PRECISION:
        return 0
    return -(-states.master_weights.bytes // devices) if zero >= 1 else states.master_weights.bytes


def trained_dtype(param: ParameterInfo, precision: str, own: frozenset[str] = frozenset()) -> str:
    """The dtype `param` is stored and trained in: its own where it is no floating point (QLoRA's packed 4-bit
    codes) or is named in `own` (a plan's bf16 adapters), else the precision's weights dtype."""
    if param.name in own or not _floating(param.dtype):
        return param.dtype
    return weight_dtype(precision)


def as_trained(params: Iterable[ParameterInfo], precision: str,
               own: frozenset[str] = frozenset()) -> tuple[ParameterInfo, ...]:
    """`params` with each dtype the one it trains in (trained_dtype)."""
    return tuple(p if p.dtype == (dtype := trained_dtype(p, precision, own)) else dataclasses.replace(p, dtype=dtype)
                 for p in params)


def model_states(params: Iterable[ParameterInfo], *, precision: str, optimizer: str,
                 trainable: frozenset[str] | None = None, own: frozenset[str] = frozenset()) -> ModelStates:
    """Bytes of weights, gradients (trainable parameters only), optimizer states and master weights.

    `trainable` names the parameters that train; None: those whose `trainable` flag is set. Each parameter is
    stored in its trained_dtype; its gradient and (torch's) optimizer states take that dtype too."""
    params = as_trained(params, precision, own)
    is_trainable = (lambda p: p.trainable) if trainable is None else (lambda p: p.name in trainable)
    training = [p for p in params if is_trainable(p)]
    n_all = sum(p.numel for p in params)
    n_train = sum(p.numel for p in training)
    # storage that is no floating point (QLoRA's packed 4-bit codes, uint8) keeps its own size under any precision
    floating = [p for p in params if _floating(p.dtype)]
    packed = [p for p in params if not _floating(p.dtype)]
    n_packed = sum(p.numel for p in packed)
    packed_bytes = sum(p.numel * itemsize(p.dtype) for p in packed)
    weights = Term(_bytes(params), _sized(floating, "parameters") +
                   (f" + {n_packed:,} packed elements in {packed_bytes:,} B" if packed else ""))
    gradients = Term(_bytes(training), _sized(training, "trainable"))
    own_trained = sum(p.numel for p in training if p.name in own and _floating(p.dtype)
                      and p.dtype != weight_dtype(precision))
    if precision in MASTER_COPY_PRECISIONS:  # the optimizer runs on an fp32 copy of each floating trained weight
        copied = [dataclasses.replace(p, dtype="float32") for p in training if _floating(p.dtype)]
        states, text = _optimizer_bytes(copied, optimizer)
        n_copied = sum(p.numel for p in copied)
        whose = "DeepSpeed's bf16" if precision == MASTER_PRECISION else "Megatron-LM's main params"
        master_term = Term(4 * n_copied, f"{n_copied:,} trainable × 4 B: the fp32 master copy the optimizer updates "
                                         f"({whose}; states on it, fp32)")
        if precision == MAIN_GRAD_PRECISION:  # Megatron-Core's DDP: one fp32 main_grad a trained weight, resident
            gradients = Term(4 * n_copied,
                             f"{n_copied:,} trainable × 4 B: the fp32 main-gradient buffer (Megatron-Core's DDP, "
                             "accumulate_allreduce_grads_in_fp32), resident from before the forward")
        return ModelStates(weights, gradients, Term(states, text), master_term, n_train, n_all - n_train, precision,
                           optimizer)
    states, text = _optimizer_bytes(training, optimizer)
    master = "none: the fp32 weights are the master copy" if precision.endswith("-mixed") else "none"
    if own_trained:
        master += f"; {own_trained:,} parameters train in their own dtype, without one"
    return ModelStates(weights, gradients, Term(states, text), Term(0, master), n_train, n_all - n_train, precision,
                       optimizer)


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _bytes(params: Iterable[ParameterInfo]) -> int:
    return sum(p.numel * itemsize(p.dtype) for p in params)


def _by_size(params: Iterable[ParameterInfo]) -> list[tuple[int, int]]:
    """[(element size, elements)], the largest size first."""
    sizes: dict[int, int] = {}
    for p in params:
        size = itemsize(p.dtype)
        sizes[size] = sizes.get(size, 0) + p.numel
    return sorted(sizes.items(), reverse=True)


def _sized(params: Iterable[ParameterInfo], what: str) -> str:
    """"N what × 4 B", or "N what × 4 B + M × 2 B" where dtypes differ."""
    groups = _by_size(params)
    if not groups:
        return f"0 {what}"
    first, *rest = groups
    return " + ".join([f"{first[1]:,} {what} × {first[0]} B", *(f"{n:,} × {size} B" for size, n in rest)])


def _per_size(params: list[ParameterInfo], factor: str = "") -> str:
    """"F × N × 4 B" for one element size, "F × (N × 4 B + M × 2 B)" for several."""
    groups = _by_size(params)
    body = " + ".join(f"{n:,} × {size} B" for size, n in groups) or "0 B"
    if not factor:
        return body
    return f"{factor} × {body}" if len(groups) <= 1 else f"{factor} × ({body})"


def _optimizer_bytes(params: list[ParameterInfo], optimizer: str) -> tuple[int, str]:
    """torch's optimizers create each state like its parameter (the parameter's dtype)."""
    total = _bytes(params)
    tensors = len(params)
    if optimizer in ("adamw", "adam"):
        return 2 * total + 4 * tensors, f"{_per_size(params, '2')} + {tensors} step scalars × 4 B"
    if optimizer == "sgd":
        return 0, "plain SGD keeps no state"
    if optimizer in ("sgd-momentum", "lion"):
        what = "momentum_buffer" if optimizer == "sgd-momentum" else "exp_avg"
        return total, f"{what}: {_per_size(params)}"
    if optimizer == "adafactor":
        factored = 0
        count = 0
        for p in params:
            if len(p.shape) >= 2:
                elements = math.prod(p.shape[:-2]) * (p.shape[-2] + p.shape[-1])
            else:
                elements = p.numel
            count += elements
            factored += elements * itemsize(p.dtype)
        return factored + 4 * tensors, (f"row and column second moments, {count:,} elements in {factored:,} B + "
                                        f"{tensors} step scalars × 4 B")
    if optimizer == "adamw-8bit":
        big = [p for p in params if p.numel >= 4096]
        small = sum(p.numel for p in params if p.numel < 4096)
        n_big = sum(p.numel for p in big)
        blocks = sum(-(-p.numel // 256) for p in big)
        total = 2 * (n_big + blocks * 4) + 2 * small * 4
        return total, (f"2 × ({n_big:,} × 1 B + {blocks:,} absmax × 4 B) + 2 × {small:,} small-tensor "
                       "elements × 4 B")
    raise OptionError(f"unknown optimizer {optimizer!r}")


def per_device(states: ModelStates, *, devices: int, zero: int) -> dict[str, int]:
    """Each device's share of the model states under ZeRO stage `zero` over `devices` devices."""
    def shard(value: int, sharded: bool) -> int:
        return -(-value // devices) if sharded else value

    return {
        "weights": shard(states.weights.bytes, zero >= 3),
        "gradients": shard(states.gradients.bytes, zero >= 2),
        "optimizer": shard(states.optimizer.bytes, zero >= 1),
        "master_weights": shard(states.master_weights.bytes, zero >= 1),
    }
