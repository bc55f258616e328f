"""The busiest device's FLOPs a step under a layout, which the search sorts by: the analytic count at the replica's
batch (one a batch), split weight by weight to the device by flops.py. The analytic count is trusted once checked
against FlopCounterMode for this config, as `flops` checks it."""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedError
from .layout import ParallelLayout
from .layout_facts import ModelFacts


class LayoutFlops:
    def __init__(self, facts: ModelFacts, flops_check: Any = None) -> None:
        self.facts = facts
        self.flops_check = flops_check  # engine_check.CheckFor, as `flops` reads it; None: not checked
        self._checked = False
        self._by_replica: dict[int, tuple[Any, Any]] = {}

    def device(self, layout: ParallelLayout, replica: int) -> Any:
        """The busiest device's DeviceFlops (its stage and tp rank, recompute included)."""
        from .flops import device_flops

        facts = self.facts
        estimate, parts = self.replica(replica)
        return device_flops(estimate, parts, facts.report, facts.view, layout, checkpointing=facts.checkpointing,
                            causal_model=facts.causal)

    def replica(self, replica: int) -> tuple[Any, Any]:
        """The analytic count at a replica's batch, and its weight-by-weight parts."""
        if replica not in self._by_replica:
            from ..flops.analytic import Parts, analytic_flops

            if not self._checked:
                self._check()
            facts = self.facts
            parts = Parts()
            estimate = analytic_flops(facts.view, facts.report.params, batch=replica, seq=facts.seq, training=True,
                                      checkpointing=facts.checkpointing, parts=parts)
            if estimate is None:
                raise UnsupportedError("{cls} has no analytic FLOP count here, which the search sorts by",
                                       cls=facts.view.class_name)
            self._by_replica[replica] = (estimate, parts)
        return self._by_replica[replica]

    def _check(self) -> None:
        """Kept with the cost facts, else made on the build (its FactsGap makes the caller build)."""
        if self.flops_check is not None:
            check = self.flops_check.of(self.facts.view)
            if check.status == "differs":
                raise UnsupportedError("the analytic FLOPs of {cls} differ from FlopCounterMode's for this config "
                                       "({why}); the search sorts by them", cls=self.facts.view.class_name,
                                       why=check.words())
        self._checked = True
