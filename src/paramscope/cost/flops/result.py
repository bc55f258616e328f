"""FLOPs of a forward pass or a training step, as frozen data for the renderers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...display import HtmlDisplay


@dataclass(frozen=True)
class FlopTerm:
    role: str
    flops: int  # forward
    arithmetic: str


@dataclass(frozen=True)
class FlopEstimate(HtmlDisplay):
    engine: str  # "analytic" | "traced"
    batch: int
    seq: int
    causal: str  # "full" | "half"
    forward: int
    attention: int  # the forward's attention-score term (grows with S²)
    terms: tuple[FlopTerm, ...]  # by role, summing to forward
    backward: int | None  # model FLOPs of the backward (training)
    recompute: int | None  # hardware FLOPs beyond the model's (training)
    notes: tuple[str, ...] = field(default=())
    # The forward at other context lengths, same batch: (seq, forward, attention) from the same analytic count
    # (FlopOptions.context_curve); empty when not asked or when the traced engine answered.
    by_context: tuple[tuple[int, int, int], ...] = field(default=())
    # the analytic count held against FlopCounterMode on a cut of the class, once per config (engine_check.py's
    # EngineCheck): why the analytic engine answered, or why the traced one did; None with --trace (the whole trace
    # is beside) or where no analytic count exists
    check: Any = field(default=None)
    # --generate N: generation.GenerationFlops (the prefill with its last token's logits, the decode steps)
    generation: Any = field(default=None)
    # what `estimate_flops` answers with beside the count (`result.report`, `result.compute`): the model's Report
    # and the step's compute (estimate.Compute: per token, over D tokens, MFU, time); the page shows them as the
    # CLI's does. None for a count made without them. Not in == or hash: the count is the figures above.
    # under a multi-GPU layout (FlopOptions.layout): one device's FLOPs per step (parallel/flops.py's DeviceFlops)
    device: Any = field(default=None)
    # an image or audio input (FlopOptions.media): towers.MediaFlops, whose tower and projector lines are also terms
    media: Any = field(default=None)
    report: Any = field(default=None, repr=False, compare=False)
    compute: Any = field(default=None, repr=False, compare=False)

    @property
    def by_role(self) -> dict[str, int]:
        return {t.role: t.flops for t in self.terms}

    @property
    def step(self) -> int | None:
        return None if self.backward is None else self.forward + self.backward

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def __repr__(self) -> str:
        """One line, as the CLI's title: `<FlopEstimate of a forward pass of gpt2 (GPT2LMHeadModel): … FLOPs …>`;
        the whole answer displays in Jupyter (`_repr_html_`) and saves with `.to_html(path)`."""
        model = "" if self.report is None else f" of {self.report.model.label} ({self.report.model.class_name})"
        what, flops = ("a training step", self.step) if self.step is not None else ("a forward pass", self.forward)
        forward = f"; forward {self.forward:,}" if self.step is not None else ""
        scientific = f"{flops:.3e}".replace("e+", "e")  # as the CLI writes it (2.916e11)
        return (f"<FlopEstimate of {what}{model}: {flops:,} FLOPs ({scientific}{forward}) · batch {self.batch:,} × "
                f"{self.seq:,} tokens · {self.engine} engine>")
