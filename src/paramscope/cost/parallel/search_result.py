"""The layout search's answer as data: each layout's figures (Candidate, its communication as CommTerms), the
layouts not answered and why (Skipped), the fewest devices that fit (Minimum, each count tried a DeviceCount), and
the whole search (LayoutSearch, which a notebook shows as the layout page)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...display import HtmlDisplay
from .comm_term import CommTerm
from .layout import ParallelLayout, shard_words

if TYPE_CHECKING:
    from ..hardware import Interconnect
    from .layout_time import CommTime


@dataclass(frozen=True)
class Candidate:
    """One layout: its busiest device's peak, FLOPs, time bound and communication."""

    layout: ParallelLayout
    replica_batch: int  # sequences each data-parallel replica takes a step: G / dp
    peak: int  # the worst device's peak, bytes (reserve not included)
    peak_phase: str
    fits: bool
    free: int  # memory − reserve − peak (negative: short by that much)
    # the rest is computed for a layout that fits only (None, and no terms, where it does not)
    flops: int | None  # the busiest device's hardware FLOPs a step (model FLOPs + recompute)
    model_flops: int | None
    bubble: float
    seconds: float | None  # flops / peak / (1 − bubble): a bound at the GPU's peak
    comm: tuple[CommTerm, ...]
    comm_stage: int | None  # the pipeline stage whose device communicates the most (the one shown)
    # micro-steps a layout without a pipeline runs its replica batch as (gradient accumulation: the pipelines'
    # microbatch of one sequence, so every layout runs the same per-device microbatch); 1 under a pipeline
    accumulation: int = 1
    # the communication's time at least, by link (layout_time.py): set by LayoutSearch from the GPU's interconnect;
    # None where the layout does not fit or the GPU has no link figures
    comm_time: CommTime | None = None

    @property
    def step_bound(self) -> float | None:
        """The step-time bound the layouts are ranked by: max(compute + exposed tp, NVLink, network), tp's
        collectives on the critical path where its group spans nodes (layout_time.EXPOSURE), the rest perfectly
        overlapped, so a lower bound; the compute bound alone where communication is not timed."""
        if self.seconds is None or self.comm_time is None:
            return self.seconds
        return max(self.seconds + self.comm_time.exposed, self.comm_time.seconds)

    @property
    def tp_spans_nodes(self) -> bool | None:
        """Whether the shown device's tp group spans nodes (its collectives then exposed); None where not timed."""
        return None if self.comm_time is None else self.comm_time.tp_spans_nodes

    @property
    def no_overlap(self) -> float | None:
        """Compute, then NVLink, then the network, none overlapped: shown beside the bound."""
        if self.seconds is None or self.comm_time is None:
            return None
        return self.seconds + self.comm_time.serial

    def timed(self, links: Interconnect | None) -> Candidate:
        """This layout with its communication timed on `links` (unchanged where it does not fit or no links)."""
        if links is None or not self.fits:
            return self
        from .layout_time import comm_time

        return replace(self, comm_time=comm_time(self.layout, self.comm, self.comm_stage, links))

    @property
    def accumulation_words(self) -> str:
        """" · accum 8" beside the layout's degrees where it accumulates gradients over micro-steps; "" otherwise."""
        return f" · accum {self.accumulation}" if self.accumulation > 1 else ""

    @property
    def comm_bytes(self) -> int:
        return sum(term.bytes for term in self.comm)

    def comm_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for term in self.comm:
            out[term.kind] = out.get(term.kind, 0) + term.bytes
        return out


@dataclass(frozen=True)
class Skipped:
    """A layout the search could not answer, and why."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    reason: str
    bounded: bool = False  # it cannot fit: its lower bound (layout_bound.py) exceeds the GPU, so it was not derived


@dataclass(frozen=True)
class DeviceCount:
    """One device count tried for the fewest that fit."""

    devices: int
    outcome: str  # "fits" | "none fits" | "no layout" (counts whose model states alone exceed are below the floor)
    layouts: int  # layouts evaluated
    words: str
    unanswered: int = 0  # layouts tried that no engine answers here (Skipped: a class's tp or cp, say)


@dataclass(frozen=True)
class Minimum:
    devices: int | None  # the fewest that fit (every count tried below it, unless `untried`); None: none up to `limit`
    layout: Candidate | None  # the first layout found to fit there (the best there when it is N)
    limit: int  # the largest count tried
    tried: tuple[DeviceCount, ...]  # each count looked at, from `floor` up, ascending
    floor: int = 1  # below it the model states alone, spread evenly, exceed the GPU (no count there is tried)
    untried: tuple[int, int] | None = None  # (first, last): from first to last, the counts `tried` does not list were
    # left when the budget ran out (the powers of two among them were tried first)
    budget: int = 0  # the most layouts tried below the first power of two that fits (MIN_BUDGET)
    bounded: int = 0  # layouts passed over without an evaluation: their lower bound (layout_bound.py) exceeds the GPU
    unanswered: int = 0  # layouts of the counts in `tried` that no engine answers here: the answer is among the
    # answered layouts only (a count below it, or any where none is found, may fit by one of these)


@dataclass(frozen=True)
class LayoutSearch(HtmlDisplay):
    accelerator: str
    memory: int
    reserve: int
    peak_flops: float  # FLOP/s
    peak_dtype: str
    devices: int
    global_batch: int
    seq: int
    precision: str
    optimizer: str
    grad_checkpointing: str
    shard: str  # the data-parallel shard mode every layout uses
    schedule: str
    virtual_stages: int
    fitting: tuple[Candidate, ...]  # sorted (time_order): the step-time bound, bytes, peak
    not_fitting: tuple[Candidate, ...]  # sorted by peak
    skipped: tuple[Skipped, ...]
    minimum: Minimum
    evaluated: int  # layouts whose memory and FLOPs were computed (here and in the minimum's search)
    notes: tuple[str, ...] = field(default=())
    seconds: float = 0.0  # the search's wall time (a measurement, not a figure of the model)
    # how a mixed precision ran where FSDP2 shards (--fsdp-mixed-precision): "policy" (its MixedPrecisionPolicy, the
    # default) or "autocast"; the header names it, since "bf16-mixed" alone reads as torch.autocast
    fsdp_mixed_precision: str = "autocast"
    # the model's Report, as `paramscope.find_layout` answers (the CLI renders it beside); no part of == or hash
    report: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Each layout that fits gets its communication timed on the GPU's interconnect, and `fitting` is held in
        the order of the step-time bound (time_order), whatever order it was given in; the fewest devices' layout
        is timed too (the first in that order where the fewest are N)."""
        links = self.links
        fitting = tuple(sorted((c.timed(links) for c in self.fitting), key=time_order))
        object.__setattr__(self, "fitting", fitting)
        minimum = self.minimum
        if minimum.layout is not None:
            first = fitting[0] if minimum.devices == self.devices and fitting else minimum.layout.timed(links)
            object.__setattr__(self, "minimum", replace(minimum, layout=first))

    @property
    def links(self) -> Interconnect | None:
        """The GPU's interconnect (hardware.INTERCONNECTS), or None: communication not timed."""
        from ..hardware import INTERCONNECTS

        return INTERCONNECTS.get(self.accelerator)

    @property
    def best(self) -> Candidate | None:
        return self.fitting[0] if self.fitting else None

    def __repr__(self) -> str:
        """One line: `<LayoutSearch of … on 4 × H100 80GB: 10 of 10 layouts fit, best dp 1 (FSDP2) × tp 4 (sequence
        parallel) = 4 devices, 0.0485 s a step (bound at the peak) · batch 4 × 1,024 tokens · fewest that fit: 2>`."""
        model = "" if self.report is None else f" of {self.report.model.label}"
        best = self.best
        answer = (f"best {layout_words(best.layout, self.precision)}, {best.step_bound:.3g} s a step (a bound: "
                  + ("max(compute + exposed tp, communication))" if best.comm_time is not None else
                     "compute at the peak)")
                  if best is not None and best.step_bound is not None else "none fits")
        fewest = self.minimum.devices
        return (f"<LayoutSearch{model} on {self.devices:,} × {self.accelerator}: {len(self.fitting):,} of "
                f"{len(self.fitting) + len(self.not_fitting):,} layouts fit, {answer} · batch {self.global_batch:,} "
                f"× {self.seq:,} tokens · fewest that fit: {'none' if fewest is None else f'{fewest:,}'}>")


def layout_words(layout: ParallelLayout, precision: str) -> str:
    """The layout's words as the search's text reads them: FSDP2 over one rank applies no fully_shard, so shards
    nothing (and runs torch.autocast in a mixed precision): "dp 1 (one rank: no sharding, torch.autocast) × tp 8 …"
    where ParallelLayout.words says "dp 1 (FSDP2) × tp 8 …"."""
    text = layout.words()
    if layout.shard not in ("fsdp", "hsdp") or layout.shard_degree > 1:
        return text
    policy = ", its MixedPrecisionPolicy" if layout.fsdp_mixed_precision == "policy" else ""
    autocast = ", torch.autocast" if precision.endswith("-mixed") else ""
    return text.replace(f"dp {layout.dp} ({shard_words(layout)}{policy})",
                        f"dp {layout.dp} (one rank: no sharding{autocast})", 1)


def time_order(candidate: Candidate) -> tuple:
    """The layouts' order: the step-time bound, then the bytes, then the peak (then the degrees, for a fixed order)."""
    layout = candidate.layout
    return (candidate.step_bound, candidate.comm_bytes, candidate.peak, layout.tp, layout.pp, layout.cp, layout.ep)


def candidate_settings(candidate: Candidate) -> dict[str, Any]:
    layout = candidate.layout
    return {"dp": layout.dp, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep,
            "micro_batches": layout.micro_batches, "schedule": layout.schedule if layout.pp > 1 else None,
            "virtual_stages": layout.virtual_stages, "shard": layout.shard, "shard_degree": layout.shard_degree,
            "words": layout.words() + (f", {candidate.accumulation} micro-steps of "
                                       f"{candidate.replica_batch // candidate.accumulation} (gradient accumulation)"
                                       if candidate.accumulation > 1 else ""),
            "grad_accum": candidate.accumulation}
