"""Which engine answers one device's step at a replica batch, and so how a layout is asked.

The analytic per-device engine (estimate.py) lays out the analytic recipe's activations, so a tensor, context or
pipeline layout has the closed form where the class has the analytic recipe (the Llama-style family) and its
one-device step at that batch is the analytic engine's. Otherwise the step is derived: each layout is asked as
memory --dp D --tp T --pp P --cp C --ep E --sp answers it, which refuses what it does not model in one line (a
Skipped's reason): a rank's step derived from traces with the layout applied (estimate_derived.derived_device), a
pipeline's stages replayed from the one-device, tensor- or expert-parallel rank's derived recipe (pipeline_replay.py's
derived_pipeline_device); each derivation once and cached."""

from __future__ import annotations

from .layout import ParallelLayout
from .layout_facts import ModelFacts


class StepEngines:
    """One device's step at each replica batch, asked once: its engine and whether it is derived; and the pipelines
    memory refused, by microbatch and degrees."""

    def __init__(self, facts: ModelFacts) -> None:
        self.facts = facts
        self.needs_build = False  # an answer needs the built module (the caller builds and asks again)
        self._engines: dict[int, str] = {}
        self._derived: dict[int, bool] = {}
        # a class's pipeline stages replayed from its derived step, refused at a microbatch size (the derivation
        # declined, an encoder-decoder): the same for every pipeline of that size, so asked once
        self._stages_refused: dict[tuple[int, int, int, int], str] = {}  # (microbatch, tp, ep, cp)

    def engine(self, replica: int) -> str | None:
        """The engine that answers one device's step at `replica` × seq ("analytic", "derived", "traced"); None
        where that needs the built module (needs_build is set)."""
        if replica not in self._engines:
            from ..memory.training import step_estimate

            facts = self.facts
            one = step_estimate(facts.report, facts.view, facts.training_options(replica), live=False)
            if one is None:
                self.needs_build = True
                return None
            self._engines[replica] = one.engine
        return self._engines[replica]

    def derived(self, replica: int) -> bool | None:
        """True where tensor, context and pipeline layouts at this replica batch have no closed form, so each is
        derived as memory derives it: the class has no analytic recipe, or its one-device step is another engine's
        (derived or traced). None where that needs the built module."""
        if replica not in self._derived:
            from .activations import local_recipe

            if local_recipe(self.facts.text, self.facts.view.class_name) is None:
                self._derived[replica] = True
            else:
                engine = self.engine(replica)
                if engine is None:
                    return None
                self._derived[replica] = engine != "analytic"
        return self._derived[replica]

    @property
    def any_derived(self) -> bool:
        """Some replica batch's layouts were derived (the search's note says how they were asked)."""
        return any(self._derived.values())

    def not_answered(self, layout: ParallelLayout, replica: int) -> str | None:
        """Why a tensor, context or pipeline layout is not answered, or None where it is asked (the closed form, or
        derived). A pipeline refused at a microbatch size is refused for every pipeline of that size and those
        degrees, so asked once (refuse_stages)."""
        if not self.derived(replica) or self.needs_build:
            return None
        if layout.pp > 1:
            return self._stages_refused.get(_stages_key(layout, replica))
        return None

    def refuse_stages(self, layout: ParallelLayout, replica: int, words: str) -> None:
        """Memory refused a derived pipeline: every pipeline of its microbatch and degrees is refused the same."""
        if layout.pp > 1 and self.derived(replica):
            self._stages_refused[_stages_key(layout, replica)] = words


def _stages_key(layout: ParallelLayout, replica: int) -> tuple[int, int, int, int]:
    return replica // layout.micro_batches, layout.tp, layout.ep, layout.cp
