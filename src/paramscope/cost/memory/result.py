"""Memory to load and serve a model: the analytic engine's answer, as frozen data for the renderers.

    weights (memory/weights.py) + KV cache (memory/kv.py) + the prefill's working memory = the peak at serving

Every figure is at allocator level (bytes of tensors); the CUDA context and the allocator's fragmentation are a
separate reserve that the "fits on" table adds, and the report names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...display import HtmlDisplay
from ...frozen import FrozenDict, freeze_fields
from ..hardware import Accelerator, GiB
from .kv import KVCache
from .weights import WeightMemory

DEFAULT_RESERVE = 1 * GiB  # CUDA context (~0.5 GiB with torch) and fragmentation; `--reserve` sets it


def check_memory_target(gpu: str | None, budget: int | None, reserve: int) -> None:
    """The GPU or byte budget a serving engine's plan fits, and the reserve kept outside it: one OptionError naming
    the bad value (the llama.cpp and vLLM pre-flights' options share it)."""
    from ...errors import OptionError

    if gpu and budget is not None:
        raise OptionError("give {0} or {1}, not both", "gpu", "budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise OptionError("{0} must be a number of bytes, 1 or more, got {value!r}", "budget", value=budget)
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise OptionError("{0} must be a number of bytes, 0 or more, got {value!r}", "reserve", value=reserve)


@dataclass(frozen=True)
class Workspace:
    """Working memory of the prefill's forward beyond weights and cache: the largest layer's live tensors."""

    bytes: int
    arithmetic: str
    logits: int  # the last token's logits (generate's logits_to_keep=1), in the compute dtype


@dataclass(frozen=True)
class Fit:
    accelerator: Accelerator
    fits: bool
    free: int  # bytes left after the peak and the reserve (negative: short by)
    largest_batch: int | None  # at the asked context length; None when nothing fits
    largest_context: int | None  # at the asked batch


@dataclass(frozen=True)
class MemoryEstimate(HtmlDisplay):
    mode: str  # "inference" | "training"
    engine: str  # "analytic" | "traced"
    settings: FrozenDict[str, Any]  # what was asked (batch, seq, dtypes, …); lists inside become tuples
    weights: WeightMemory
    kv_cache: KVCache | None
    activations: Workspace | None
    peak: int
    peak_phase: str
    reserve: int
    fits: tuple[Fit, ...] = ()
    budget: Fit | None = None  # the answer for --gpu or --budget
    notes: tuple[str, ...] = field(default=())
    training: Any = None  # training.TrainingDetail for mode "training"
    # serving: the analytic peak's check against a traced prefill on a cut of the class, once per config
    # (engine_check.EngineCheck); None with --trace, for a live module, or in training
    check: Any = None
    # serving across GPUs (parallel/serving.ServingParallel): each GPU's figures under --tp/--pp, and the smallest
    # tensor-parallel degree that fits --gpu/--budget; None otherwise (then `peak` and `fits` are one device's)
    parallel: Any = None
    # the model's Report, as `estimate_memory` and `estimate_training` answer (`result.report`): the page draws its
    # treemap and names the model, as the CLI's does; None for an estimate made without one. Not in == or hash:
    # the same figures are equal whichever engine counted the model.
    report: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "settings")

    @property
    def with_reserve(self) -> int:
        return self.peak + self.reserve

    def __repr__(self) -> str:
        """One line, the page's subtitle in short: `<MemoryEstimate to serve gpt2 (GPT2LMHeadModel): peak … B …>`;
        the whole answer displays in Jupyter (`_repr_html_`) and saves with `.to_html(path)`."""
        settings, training = self.settings, self.mode == "training"
        model = "" if self.report is None else f" {self.report.model.label} ({self.report.model.class_name})"
        asked = (f"{settings.get('precision')}, {settings.get('optimizer')}" if training
                 else f"{self.weights.format.key} weights")
        fit = ""
        if self.budget is not None:
            fit = f" · {'fits' if self.budget.fits else 'does not fit'} on {self.budget.accelerator.name}"
        batch, seq = settings.get("batch", 1), settings.get("seq") or 0
        # under a layout the peak is one device's, the one whose share and stage hold the most: say of which layout
        device = self.training.device if training and self.training is not None else None
        across = self.parallel.layout if self.parallel is not None else None
        flat = training and self.training is not None and self.training.per_device is not None
        where = (f" on the fullest device of {device.layout.words()}" if device is not None else
                 f" on the fullest GPU of {across.words()}" if across is not None else
                 f" on each of {settings.get('devices'):,} devices (ZeRO-{settings.get('zero')}'s flat shares)" if flat
                 else "")
        return (f"<MemoryEstimate to {'train' if training else 'serve'}{model}: peak {self.peak:,} B "
                f"({self.peak / GiB:,.2f} GiB){where} in {self.peak_phase} · {asked} · batch {batch:,} × {seq:,} "
                f"tokens · {self.engine} engine{fit}>")


