"""FLOPs of a forward pass or a training step, as frozen data for the renderers."""

from __future__ import annotations

from dataclasses import dataclass, field

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

    @property
    def by_role(self) -> dict[str, int]:
        return {t.role: t.flops for t in self.terms}

    @property
    def step(self) -> int | None:
        return None if self.backward is None else self.forward + self.backward

    @property
    def tokens(self) -> int:
        return self.batch * self.seq
