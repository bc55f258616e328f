"""What `--find-layout` is asked (SearchOptions: the devices, the GPU, the global batch, the training settings every
layout shares) and the GPU's peak FLOP/s the layouts are sorted by (peak_for)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError
from ..memory.result import DEFAULT_RESERVE
from .layout import MAX_DEGREE, SHARD_ALIASES, ParallelLayout, shard_mode


@dataclass(frozen=True)
class SearchOptions:
    devices: int
    gpu: str
    global_batch: int | None = None  # None: batch × devices (what N data-parallel replicas of `batch` take)
    batch: int = 1
    seq: int | None = None
    precision: str | None = None  # None: the frameworks' default for `zero` (memory/precision_default.py)
    optimizer: str = "adamw"
    grad_checkpointing: str = "none"
    attention: str | None = None
    zero: str | None = None  # None: fsdp (FSDP2, full sharding)
    shard_group: int | None = None
    schedule: str | None = None  # pipeline layouts' schedule (default 1f1b)
    virtual_stages: int = 1
    context_parallel: bool = True  # search cp too
    expert_load: float = 1.0  # every ep > 1 layout's busiest rank's pairs over its balanced share (--expert-load)
    # how a mixed precision runs under FSDP2 (--fsdp-mixed-precision): torch.autocast over the fp32 parameters, or
    # fully_shard's MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32), torchtitan's; every FSDP2 layout
    # sharded over more than one rank takes it (torchtitan applies no fully_shard, so no policy, to one); None: the
    # policy where FSDP2 shards in a mixed precision, as torchtitan and accelerate run it
    fsdp_mixed_precision: str | None = None
    reserve: int = DEFAULT_RESERVE
    fsdp_mixed_precision_asked: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        from ..memory.precision_default import default_fsdp_mixed_precision, default_precision

        if self.precision is None:
            object.__setattr__(self, "precision", default_precision(self.zero or "fsdp", self.optimizer))
        object.__setattr__(self, "fsdp_mixed_precision_asked", self.fsdp_mixed_precision is not None)
        if self.fsdp_mixed_precision is None:
            zero = str(self.zero or "fsdp").strip().lower().replace("-", "_")
            shard = SHARD_ALIASES.get(zero, "none")  # an unknown zero: check() refuses it in one line
            object.__setattr__(self, "fsdp_mixed_precision", default_fsdp_mixed_precision(shard, str(self.precision)))

    @property
    def total_batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.batch * self.devices

    def check(self) -> None:
        from ..hardware import find_accelerator
        from ..memory.training import TrainingOptions

        for name, value in (("devices", self.devices), ("global_batch", self.total_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
                raise OptionError("{0} must be a whole number from 1 to {limit:,}, got {value!r}", name,
                                  limit=MAX_DEGREE, value=str(value)[:40])
        TrainingOptions(batch=self.batch, seq=self.seq, optimizer=self.optimizer, precision=self.precision,
                        grad_checkpointing=self.grad_checkpointing, attention=self.attention,
                        reserve=self.reserve).check()
        from ..memory.states import MASTER_PRECISION, check_precision

        if check_precision(self.precision) == MASTER_PRECISION and shard_mode(self.zero or "fsdp") not in \
                ("none", "zero1", "zero2", "zero3"):  # DeepSpeed's ZeRO, not FSDP2 (the search's default)
            raise OptionError("{0} searches {1} bf16-master over DeepSpeed's ZeRO: give {2} 0, 1, 2 or 3 (FSDP2's "
                              "own is {3} policy)", "find_layout", "precision", "zero", "fsdp_mixed_precision")
        shard_mode(self.zero or "fsdp")
        if self.schedule is not None or self.virtual_stages != 1:
            ParallelLayout(pp=2, micro_batches=2, schedule=self.schedule or "interleaved",
                           virtual_stages=self.virtual_stages).check()
        load = self.expert_load  # from 1; its bound ep is each layout's own (a layout's ep below F is Skipped)
        if isinstance(load, bool) or not isinstance(load, (int, float)) or not load >= 1:
            raise OptionError("{0} (the busiest expert-parallel rank's pairs over its balanced share) must be a "
                              "number from 1, got {value!r}", "expert_load", value=str(load)[:40])
        self._check_mixed_precision()
        if self.shard_group is not None and shard_mode(self.zero or "fsdp") != "hsdp":
            raise OptionError("{0} is for hybrid sharding (hybrid_shard)", "shard_group")
        accelerator = find_accelerator(self.gpu)
        peak_for(accelerator, self.precision)

    def _check_mixed_precision(self) -> None:
        """--fsdp-mixed-precision policy: FSDP2's layouts (zero fsdp or hybrid_shard) in a mixed precision, one line
        where not."""
        from .layout import FSDP_MIXED_PRECISIONS

        mixed = self.fsdp_mixed_precision
        if mixed not in FSDP_MIXED_PRECISIONS:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "fsdp_mixed_precision",
                              choices=", ".join(FSDP_MIXED_PRECISIONS), value=str(mixed)[:40])
        if mixed == "autocast" and self.fsdp_mixed_precision_asked and \
                shard_mode(self.zero or "fsdp") not in ("fsdp", "hsdp"):
            raise OptionError("{0} chooses how FSDP2 runs a mixed precision: the search's layouts need {1} fsdp or "
                              "hybrid_shard, got {zero}", "fsdp_mixed_precision", "zero", zero=str(self.zero)[:40])
        if mixed == "autocast" and self.fsdp_mixed_precision_asked and not self.precision.endswith("-mixed"):
            raise OptionError("{0} autocast chooses torch.autocast over the fp32 parameters FSDP2 gathers: it needs a "
                              "mixed precision (bf16-mixed, fp16-mixed), got {precision}", "fsdp_mixed_precision",
                              precision=str(self.precision)[:40])
        if mixed == "policy" and shard_mode(self.zero or "fsdp") not in ("fsdp", "hsdp"):
            raise OptionError("{0} policy is FSDP2's MixedPrecisionPolicy: the search's layouts need {1} fsdp or "
                              "hybrid_shard, got {zero}", "fsdp_mixed_precision", "zero", zero=str(self.zero)[:40])
        if mixed == "policy" and not self.precision.endswith("-mixed"):
            raise OptionError("{0} policy casts fp32 parameters to 16 bits as FSDP2 gathers them: it needs a mixed "
                              "precision (bf16-mixed, fp16-mixed), got {precision}", "fsdp_mixed_precision",
                              precision=str(self.precision)[:40])


def peak_for(accelerator: Any, precision: str) -> tuple[float, str]:
    """(the GPU's dense peak FLOP/s, the dtype it is read in) for a precision's matmuls: bf16 for bf16-mixed and
    bf16-pure, fp16 for fp16-mixed, tf32 for fp32 (torch's allow_tf32; a lower bound on the time where matmuls
    run in full fp32)."""
    from ..hardware import PEAK_TFLOPS, peak_flops

    dtype = {"bf16-mixed": "bf16", "bf16-pure": "bf16", "fp16-mixed": "fp16", "fp32": "tf32"}.get(precision, "bf16")
    peak = peak_flops(accelerator, dtype)
    if peak is None:
        known = ", ".join(PEAK_TFLOPS.get(accelerator.name, {})) or "none"
        raise OptionError("{0} sorts layouts by the GPU's peak FLOP/s, and the table has none for {gpu} in {dtype} "
                          "(the {1} {precision}'s matmuls; it has: {known})", "find_layout", "precision",
                          gpu=accelerator.name, dtype=dtype, precision=precision, known=known)
    return peak, dtype
