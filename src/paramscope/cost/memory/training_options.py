"""`memory MODEL --training`'s options: `TrainingOptions` (the one batch, the precision defaulted for the layout asked)
and its checks, each bad value one OptionError naming the parameter; the traced engine's depth (`trace_depth`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...entry_options import check_layout_option
from ...errors import OptionError
from ..parallel.layout import ParallelLayout, layout_at_batch
from ..parallel.trace_reach import untraced_by_layout
from ..traced.step import ATTENTION
from .precision_default import default_fsdp_mixed_precision, default_precision
from .result import DEFAULT_RESERVE
from .states import (
    check_main_grad_layout, check_master_layout, check_master_optimizer, check_optimizer, check_precision, zero_stage,
)

DEFAULT_TRAINING_SEQ = 2048
MAX_DEVICES = 1 << 16


@dataclass(frozen=True)
class TrainingOptions:
    batch: int = 1
    seq: int | None = None  # None: 2,048, or the model's maximum when shorter
    optimizer: str = "adamw"
    # None: what the frameworks run by default for the layout asked (precision_default.py): bf16-mixed, or
    # bf16-master under DeepSpeed's ZeRO 1-3; resolved here, `precision_defaulted` saying so for the notes
    precision: str | None = None
    grad_checkpointing: str = "none"  # "none" | "full"
    attention: str | None = None  # None: the model's own choice (sdpa where supported)
    freeze: tuple[str, ...] = ()  # roles ("embedding", "attention") or parameter-name globs
    # parameters (by name) a live module stores in their own dtype under any precision: a plan's bf16 adapters
    own_dtype: frozenset[str] = frozenset()
    devices: int = 1
    zero: str = "0"
    # a multi-GPU layout (parallel/layout.py: dp with ZeRO or FSDP2, tp, ep); None: --devices/--zero as DeepSpeed's
    # flat ZeRO shares over data-parallel devices
    layout: Any = None
    # the traced engine: False; "extended" (a few layers of each type traced at the asked point and extended to the
    # model's depth exactly, checked by a longer cut; --trace); "full" or True (every layer traced; --trace full)
    trace: bool | str = False
    # under a layout: derive one device's step from traces of the real class with the layout applied where the
    # closed form does not hold it (FSDP2's in-backward buffers; a class without a per-rank recipe); False: the
    # closed form answers, with its gap said (the layout search, which must answer in seconds)
    derive_layout: bool = True
    fits: bool = True  # the fits table (every accelerator's largest batch and context); False: left out
    gpu: str | None = None
    budget: int | None = None
    reserve: int = DEFAULT_RESERVE
    # images beside the text (towers.MediaInput): the towers train, and what their forward saves is held with the
    # language model's activations over the text and image tokens; None: a text input
    media: Any = None
    # gradient accumulation: the batch (each replica's) runs as this many micro-steps of batch / grad_accum sequences,
    # the optimizer stepping after the last (torchtitan's global / local batch, HF Trainer's
    # gradient_accumulation_steps); 1: the whole batch at once
    grad_accum: int = 1
    precision_defaulted: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.precision is None:
            shard = self.layout.shard if isinstance(self.layout, ParallelLayout) else self.zero
            object.__setattr__(self, "precision", default_precision(shard, self.optimizer))
            object.__setattr__(self, "precision_defaulted", True)
        # the options' batch is the one batch: a layout built without one takes it (check refuses another)
        layout = layout_at_batch(self.layout, self.batch)
        if isinstance(layout, ParallelLayout) and layout.fsdp_mixed_precision_defaulted:
            # FSDP2's MixedPrecisionPolicy where a mixed precision runs under it; autocast (nothing) elsewhere
            layout = dataclasses.replace(layout, fsdp_mixed_precision=default_fsdp_mixed_precision(
                layout.shard, str(self.precision)))
        object.__setattr__(self, "layout", layout)

    def check(self) -> None:
        from .serving import check_batch_and_seq

        check_batch_and_seq(self.batch, self.seq)
        check_master_optimizer(check_precision(self.precision), check_optimizer(self.optimizer))
        _check_flat_zero(self.zero)
        try:
            check_master_layout(check_precision(self.precision), self.layout)
        except OptionError as err:
            if not self.precision_defaulted:
                raise
            # a layout DeepSpeed refuses under its bf16, where the user asked no precision: say whose default it is
            raise OptionError(err.template + "; bf16-master is the default precision under DeepSpeed's ZeRO 1-3: "
                              "give {%d} bf16-mixed for torch.autocast over fp32 weights" % len(err.options),
                              *err.options, "precision", **err.values) from err
        check_main_grad_layout(check_precision(self.precision), self.layout, zero=zero_stage(self.zero),
                               devices=self.devices)
        if self.grad_checkpointing not in ("none", "full"):
            raise OptionError("{0} must be none or full, got {value!r}", "grad_checkpointing",
                              value=self.grad_checkpointing)
        if self.attention is not None and self.attention not in ATTENTION:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "attention", choices=", ".join(ATTENTION),
                              value=self.attention)
        if not 1 <= self.devices <= MAX_DEVICES:
            raise OptionError("{0} must be between 1 and {limit:,}, got {devices}", "devices", limit=MAX_DEVICES,
                              devices=self.devices)
        if self.reserve < 0:
            raise OptionError("{0} must be 0 or more, got {reserve}", "reserve", reserve=self.reserve)
        trace_depth(self.trace)
        _check_grad_accum(self.grad_accum, self.batch, self.layout)
        if self.grad_accum > 1 and (self.devices != 1 or self.media is not None):
            raise OptionError("{0} is counted on one device or under a layout (layout_for), without an image or "
                              "audio input, here", "grad_accum")
        if self.media is not None:
            self.media.check()
            refused = "trace" if self.trace else "grad_checkpointing" if self.grad_checkpointing != "none" else \
                "devices" if self.layout is not None or self.devices != 1 else None
            if refused:
                raise OptionError("an image or audio input's training memory is counted on one device, without {0}, here",
                                  refused)
        if self.layout is not None:
            check_layout_option(self.layout)
            self.layout.check_batch(self.batch)
            if self.devices != 1 or str(self.zero) != "0":
                raise OptionError("give the layout or {0} and {1}, not both", "devices", "zero")
            why = untraced_by_layout(self.layout, self.precision) if self.trace else None
            if why:  # refused before the build that would end in "no rank traced"
                raise OptionError("{0} traces no rank under this layout: {why}", "trace", why=why)


def _check_grad_accum(steps: Any, batch: int, layout: Any) -> None:
    """Micro-steps a whole number dividing the batch; a pipeline's --micro-batches are already its accumulation."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise OptionError("{0} must be a whole number of micro-steps, 1 or more, got {value!r}", "grad_accum",
                          value=str(steps)[:40])
    if batch % steps:
        raise OptionError("{0} {steps} must divide the batch, {batch} sequence{s} a replica", "grad_accum",
                          steps=steps, batch=batch, s="" if batch == 1 else "s")
    if steps > 1 and layout is not None and getattr(layout, "pp", 1) > 1:
        raise OptionError("{0} beside a pipeline: its microbatches ({1}) already are the accumulation",
                          "grad_accum", "micro_batches")


def _check_flat_zero(zero: str | int) -> None:
    """`zero` is DeepSpeed's flat ZeRO share over `devices` (0-3, FSDP1's names for them); FSDP2's per-parameter
    sharding, which the CLI's --zero fsdp or hybrid_shard gives, is a layout's shard: one OptionError naming the
    way."""
    from ..parallel.layout import SHARD_ALIASES
    from .states import ZERO_ALIASES

    key = str(zero).strip().lower().replace("-", "_")
    # hybrid_shard: shards within a group of ranks, which a flat share over every device is not
    if SHARD_ALIASES.get(key) in ("fsdp", "hsdp") and (key not in ZERO_ALIASES or key == "hybrid_shard"):
        raise OptionError("{0} {value!r} is FSDP2's per-parameter sharding, a layout's: give "
                          "layout=paramscope.layout_for(devices=N, zero={value!r}) (devices and zero are DeepSpeed's "
                          "flat ZeRO 0-3)", "zero", value=str(zero)[:40])
    zero_stage(zero)


TRACE_DEPTHS = ("extended", "full")


def trace_depth(trace: bool | str) -> str | None:
    """None (no trace), "extended" or "full", from TrainingOptions.trace (True is "full", the older spelling)."""
    if trace is False or trace is None:
        return None
    if trace is True:
        return "full"
    if trace not in TRACE_DEPTHS:
        raise OptionError("{0} is extended or full, got {value!r}", "trace", value=str(trace)[:40])
    return trace
