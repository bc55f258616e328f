"""A multi-GPU layout: how many devices, and how a training step is split across them.

    devices = dp × tp × pp × cp        (ep borrows its ranks from dp × cp, as torchtitan and Megatron do)

- dp: data parallel. `shard` says what the data-parallel ranks share out: nothing (DDP), DeepSpeed ZeRO 1/2/3 (each
  rank keeps 1/dp of one flat, padded buffer of the optimizer states; 2 adds the gradients, 3 the weights) or FSDP2
  (`fully_shard`: every parameter cut along its first dimension, each rank ⌈dim0/dp⌉ rows; full, or hybrid with
  shards inside a group of `shard_group` ranks and replicas across groups).
- tp (+ sp): tensor parallel as Megatron and torch's `parallelize_module` plans cut a layer; with sequence parallel
  the norms and the residual stream hold 1/tp of the sequence.
- pp: pipeline stages, `micro_batches` microbatches per step, a schedule (gpipe, 1f1b, interleaved with
  `virtual_stages` chunks per device).
- ep: routed experts split over ep ranks (shared experts and routers replicated); `expert_load` F: the busiest ep
  rank receives F × its balanced token-expert pairs (1 ≤ F ≤ ep; 1: balanced routing).
- cp: context parallel: each rank holds 1/cp of the sequence (ring attention).

The figures are one device's: the batch is each data-parallel replica's (`--batch` per replica, as `--devices`
always meant), cut into `micro_batches` microbatches under a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import OptionError
from ...words import counted

MAX_DEGREE = 1 << 16
SCHEDULES = ("gpipe", "1f1b", "interleaved")
SHARDS = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")
# how a mixed precision runs under FSDP2 (--fsdp-mixed-precision): torch.autocast over the fp32 parameters, as on one
# device, or fully_shard's MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32) with no autocast (torchtitan's)
FSDP_MIXED_PRECISIONS = ("autocast", "policy")
# --zero's spellings (DeepSpeed's stages, FSDP1's strategy names, FSDP2's) → a shard mode
SHARD_ALIASES = {"0": "none", "ddp": "none", "no_shard": "none", "none": "none",
                 "1": "zero1", "zero1": "zero1", "2": "zero2", "zero2": "zero2", "shard_grad_op": "zero2",
                 "3": "zero3", "zero3": "zero3", "full_shard": "fsdp", "fsdp": "fsdp", "fsdp2": "fsdp",
                 "hybrid_shard": "hsdp", "hsdp": "hsdp"}


@dataclass(frozen=True)
class ParallelLayout:
    dp: int = 1
    shard: str = "none"  # one of SHARDS
    shard_group: int | None = None  # hsdp: ranks a shard group holds (default: 8, one node)
    tp: int = 1
    sp: bool = False
    pp: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    ep: int = 1
    cp: int = 1
    expert_load: float = 1.0  # the busiest ep rank's token-expert pairs over its balanced share (1: balanced)
    fsdp_mixed_precision: str = "autocast"  # one of FSDP_MIXED_PRECISIONS; "policy" under FSDP2 alone
    # layout_for was not asked a convention: the policy under FSDP2, which TrainingOptions turns to autocast where the
    # precision is not a mixed one (memory/precision_default.py); the words then name it the default
    fsdp_mixed_precision_defaulted: bool = field(default=False, compare=False, repr=False)
    # the sequences each data-parallel replica takes a step, where layout_for was told; None: the options' batch
    # (TrainingOptions, FlopOptions) is taken (at_batch). Not compared: a layout is its cut of the devices
    batch: int | None = field(default=None, compare=False)
    # layout_for was not given micro_batches: under a pipeline, one sequence a microbatch once the batch is known
    micro_batches_default: bool = field(default=False, compare=False, repr=False)
    # layout_for was given virtual_stages > 1 without a schedule: interleaved is implied, and the words say so
    schedule_implied: bool = field(default=False, compare=False, repr=False)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def trivial(self) -> bool:
        """One device holding everything: no layout to apply."""
        return self.devices == 1 and self.ep == 1

    @property
    def shard_degree(self) -> int:
        """Over how many ranks the sharded model states are cut: dp × cp (FSDP shards over both, as torchtitan
        does), within a group under hybrid sharding."""
        ranks = self.dp * self.cp
        if self.shard == "hsdp":
            return min(ranks, self.shard_group or 8)
        return ranks if self.shard != "none" else 1

    @property
    def zero_stage(self) -> int:
        """What is sharded, as a ZeRO stage: 1 optimizer states (and master weights), 2 also gradients, 3 also
        weights."""
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "hsdp": 3}[self.shard]

    def at_batch(self, batch: int) -> ParallelLayout:
        """This layout at the options' batch where it was built without one (a pipeline's default microbatches:
        one sequence each); unchanged where it names its own batch (check_batch refuses a different one)."""
        if self.batch is not None or isinstance(batch, bool) or not isinstance(batch, int):
            return self
        micro = batch if self.micro_batches_default and self.pp > 1 else self.micro_batches
        return replace(self, batch=batch, micro_batches=micro)

    def check_batch(self, batch: int) -> None:
        """The options' batch is the one batch: a layout built for another is refused, naming both."""
        if self.batch is not None and self.batch != batch:
            raise OptionError("the layout was built for {0} {layout_batch} (layout_for({0}=...)) but the options ask "
                              "{0} {batch}: give the batch once, in the options", "batch",
                              layout_batch=self.batch, batch=batch)

    def check(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batches", "virtual_stages", "ep", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
                raise OptionError("{0} must be a whole number from 1 to {limit:,}, got {value!r}", name,
                                  limit=MAX_DEGREE, value=str(value)[:40])
        if self.devices > MAX_DEGREE:
            raise OptionError("the layout needs {devices:,} devices (dp × tp × pp × cp); at most {limit:,}",
                              devices=self.devices, limit=MAX_DEGREE)
        if self.shard not in SHARDS:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "zero", choices=", ".join(SHARDS),
                              value=str(self.shard)[:40])
        if self.schedule not in SCHEDULES:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "schedule",
                              choices=", ".join(SCHEDULES), value=str(self.schedule)[:40])
        if self.sp and self.tp == 1:
            raise OptionError("{0} (sequence parallel) needs tensor parallelism: give tp > 1", "sp")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise OptionError("{0} > 1 needs the interleaved schedule", "virtual_stages")
        if self.schedule == "interleaved" and self.pp == 1 and self.virtual_stages > 1:
            raise OptionError("{0} {v} interleaves pipeline stages: give {1} 2 or more", "virtual_stages", "pp",
                              v=self.virtual_stages)
        if self.schedule == "interleaved" and self.pp == 1:
            raise OptionError("the interleaved schedule needs pipeline stages: give pp > 1", "schedule")
        # one chunk a device is 1F1B under another name; torchtitan refuses it for a multi-stage schedule and
        # Megatron interleaves only when given its chunks, so V is asked for rather than taken silently
        if self.schedule == "interleaved" and self.virtual_stages == 1:
            raise OptionError("{0} interleaved needs {1} V ≥ 2, the layer chunks each device holds (with 1 it is "
                              "1F1B; torchtitan takes 2 when not told)", "schedule", "virtual_stages")
        if self.micro_batches > 1 and self.pp == 1:
            raise OptionError("{0} split a batch across pipeline stages: give pp > 1", "micro_batches")
        load = self.expert_load
        if isinstance(load, bool) or not isinstance(load, (int, float)):
            raise OptionError("{0} must be a number, got {value!r}", "expert_load", value=str(load)[:40])
        if load != 1 and self.ep == 1:
            raise OptionError("{0} {value} needs expert parallelism (the busiest of the ep ranks receives F × its "
                              "share): give {1} E", "expert_load", "ep", value=f"{load:g}")
        if not 1 <= load <= self.ep:
            raise OptionError("{0} must be from 1 to ep {ep} (the busiest rank's pairs over its balanced share; ep: "
                              "every pair of every rank), got {value}", "expert_load", ep=self.ep, value=f"{load:g}")
        if (self.dp * self.cp) % self.ep:
            raise OptionError("{0} {ep} must divide dp × cp = {ranks}: expert-parallel ranks are drawn from the "
                              "data-parallel (and context-parallel) ones", "ep", ep=self.ep, ranks=self.dp * self.cp)
        if self.shard_group is not None:
            if self.shard != "hsdp":
                raise OptionError("{0} is for hybrid sharding (hybrid_shard)", "shard_group")
            if not isinstance(self.shard_group, int) or isinstance(self.shard_group, bool) or \
                    not 1 <= self.shard_group <= MAX_DEGREE or (self.dp * self.cp) % self.shard_group:
                raise OptionError("{0} must divide dp × cp = {ranks}, got {value!r}", "shard_group",
                                  ranks=self.dp * self.cp, value=str(self.shard_group)[:40])
        if self.fsdp_mixed_precision not in FSDP_MIXED_PRECISIONS:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "fsdp_mixed_precision",
                              choices=", ".join(FSDP_MIXED_PRECISIONS), value=str(self.fsdp_mixed_precision)[:40])
        if self.fsdp_mixed_precision == "policy" and self.shard not in ("fsdp", "hsdp"):
            raise OptionError("{0} policy is FSDP2's MixedPrecisionPolicy: it needs {1} fsdp or hybrid_shard, "
                              "got {shard}", "fsdp_mixed_precision", "zero", shard=shard_words(self))
        if self.batch is not None and self.batch % self.micro_batches:
            raise OptionError("{0} {micro} must divide the batch, {sequences} a replica", "micro_batches",
                              micro=self.micro_batches, sequences=counted(self.batch, "sequence"))

    def words(self, schedule: bool = True) -> str:
        """"dp 4 (FSDP2) × tp 2 (sequence parallel) × pp 2 (1F1B, 8 microbatches) = 16 devices"; `schedule` False:
        "pp 2 (forward only)", a pipeline that runs no backward (inference FLOPs) and so has no schedule."""
        policy = ", its MixedPrecisionPolicy" if self.fsdp_mixed_precision == "policy" else ""
        parts = [f"dp {self.dp}" + (f" ({shard_words(self)}{policy})" if self.shard != "none" else "")]
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" (sequence parallel)" if self.sp else ""))
        if self.pp > 1 and not schedule:
            parts.append(f"pp {self.pp} (forward only)")
        elif self.pp > 1:
            implied = " (implied by --virtual-stages, no --schedule given)" if self.schedule_implied else ""
            named = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": f"interleaved{implied}, {self.virtual_stages} "
                     "chunks a device"}[self.schedule]
            parts.append(f"pp {self.pp} ({named}, {self.micro_batches} microbatch"
                         f"{'es' if self.micro_batches != 1 else ''})")
        if self.cp > 1:
            parts.append(f"cp {self.cp}")
        text = " × ".join(parts) + f" = {self.devices:,} device{'s' if self.devices > 1 else ''}"
        if self.ep > 1:
            text += f"; ep {self.ep} over the data-parallel ranks"
            if self.expert_load != 1:
                text += f", the busiest receiving {self.expert_load:g}× its balanced share"
        return text


def layout_at_batch(layout: Any, batch: int) -> Any:
    """An options' layout at the options' batch (ParallelLayout.at_batch); anything else as given, for the options'
    check to refuse in one line."""
    return layout.at_batch(batch) if isinstance(layout, ParallelLayout) else layout


def shard_words(layout: ParallelLayout) -> str:
    return {"none": "no sharding", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP2",
            "hsdp": f"FSDP2 hybrid, shards over {layout.shard_degree}"}[layout.shard]


def shard_mode(value: str | int) -> str:
    key = str(value).strip().lower().replace("-", "_")
    if key not in SHARD_ALIASES:
        raise OptionError("unknown {0} {value!r}; use 0, 1, 2, 3 (DeepSpeed ZeRO), fsdp (FSDP2 full sharding), "
                          "hybrid_shard, or FSDP1's no_shard, shard_grad_op, full_shard", "zero",
                          value=str(value)[:40])
    return SHARD_ALIASES[key]


def layout_for(*, devices: int | None = None, dp: int | None = None, zero: str | int = "0", shard_group: int | None = None,
               tp: int = 1, sp: bool = False, pp: int = 1, micro_batches: int | None = None,
               schedule: str | None = None, virtual_stages: int = 1, ep: int = 1, cp: int = 1,
               batch: int | None = None, expert_load: float = 1.0,
               fsdp_mixed_precision: str | None = None) -> ParallelLayout:
    """The layout the options describe. `devices` is the total; dp, when not given, is what tp × pp × cp leave of
    it (so `--devices 8 --zero 3` is dp 8, as it always was, and `--devices 8 --tp 2` is dp 4); neither given: dp 1. `batch`: the
    sequences each data-parallel replica takes a step; under a pipeline they are cut into `micro_batches`
    microbatches (default: one sequence each, Megatron's usual micro-batch size); not given, the options' batch
    (TrainingOptions, FlopOptions) is taken, and one given must be theirs. `fsdp_mixed_precision`: "autocast" (a
    mixed precision as torch.autocast over fp32 parameters) or "policy" (FSDP2's MixedPrecisionPolicy, torchtitan's:
    16-bit gathered parameters, fp32 gradient reduction, no autocast); policy needs zero fsdp or hybrid_shard. None:
    the policy under FSDP2 (zero fsdp or hybrid_shard) in a mixed precision, as torchtitan and accelerate run it."""
    for name, value in (("devices", 1 if devices is None else devices), ("tp", tp), ("pp", pp), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
            raise OptionError("{0} must be a whole number from 1 to {limit:,}, got {value!r}", name,
                              limit=MAX_DEGREE, value=str(value)[:40])
    model = tp * pp * cp
    if dp is None and devices is None:
        dp = 1
    elif dp is None:
        if devices % model:
            raise OptionError("{0} {devices} is not a multiple of tp × pp × cp = {model}", "devices",
                              devices=devices, model=model)
        dp = devices // model
    elif devices is not None and devices != dp * model:
        raise OptionError("{0} {devices} is not dp × tp × pp × cp = {total}", "devices", devices=devices,
                          total=dp * model)
    if schedule is not None and pp == 1:  # as --micro-batches: a schedule orders a pipeline's microbatches
        raise OptionError("{0} {value!r} orders a pipeline's microbatches: give pp > 1", "schedule",
                          value=str(schedule)[:40])
    chosen = schedule or ("interleaved" if virtual_stages > 1 else "1f1b")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise OptionError("{0} must be a whole number of sequences, 1 or more, got {value!r}", "batch",
                          value=str(batch)[:40])
    default_micro = micro_batches is None and pp > 1
    micro = micro_batches if micro_batches is not None else (batch or 1) if pp > 1 else 1
    layout = ParallelLayout(dp=dp, shard=shard_mode(zero), shard_group=shard_group, tp=tp, sp=sp, pp=pp,
                            micro_batches=micro, schedule=chosen, virtual_stages=virtual_stages, ep=ep, cp=cp,
                            expert_load=expert_load, batch=batch, micro_batches_default=default_micro,
                            fsdp_mixed_precision=fsdp_mixed_precision or (
                                "policy" if shard_mode(zero) in ("fsdp", "hsdp") else "autocast"),
                            fsdp_mixed_precision_defaulted=fsdp_mixed_precision is None,
                            schedule_implied=schedule is None and virtual_stages > 1)
    layout.check()
    if fsdp_mixed_precision is not None and layout.shard not in ("fsdp", "hsdp"):
        # an asked choice that would change nothing is refused rather than ignored: without FSDP2 there is no
        # policy to apply, and a mixed precision is torch.autocast's
        raise OptionError("{0} chooses how FSDP2 runs a mixed precision: it needs {1} fsdp or hybrid_shard, got "
                          "{shard}", "fsdp_mixed_precision", "zero", shard=shard_words(layout))
    return layout
