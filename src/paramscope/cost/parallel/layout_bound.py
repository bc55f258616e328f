"""A lower bound on a layout's peak per device, cheap beside its evaluation: the search passes over a layout whose
bound exceeds the GPU (it cannot fit), and tries the rest lowest bound first.

Two of the terms the per-device engine adds into one of the first stage's moments (the whole model's without a
pipeline), on rank 0. With a pipeline, its 1F1B steady state (or GPipe's first backward) holds the stage's model
states, gradients included, and its layers' saved activations for every microbatch in flight; without one, the end
of the forward holds the states but the gradients, and every layer's saved activations; the optimizer step holds all
the states. The rest of those moments (the embedding output, 16-bit weight copies, FSDP2's gathered units, the
arriving gradient, the logits) only adds, so a layout whose bound exceeds the GPU does not fit.

A class whose step is derived from traces (no analytic recipe, or its one-device step another engine's) has no
closed form for a rank's activations, so without a pipeline they are bounded from the one-device derived recipe at
the replica's batch (read from the cache, or derived once a batch regime: the recipe the one-device step, dp × pp
and ep alone are answered from anyway): what its forward makes and leaves live at its end (held_after_forward),
each allocation whose size follows the batch or the tokens (the activations, the logits, the loss's, the positions;
not a weight's 16-bit copy nor a buffer, which FSDP2 or a cut may not hold; a recipe of the batch-1 regime has B
fixed, so the tokens tell) taken at the rank's share of it:

    cp   the rank runs S / cp of each sequence's tokens (torch's ring): each tensor is taken at S / cp tokens, its
         shape's own form in S (S − 1 for shifted labels stays exact). A tensor of degree 2 in S (eager attention's
         scores) is left out under cp: the ring's kernel need not keep one at all
    tp   a tensor-parallel rank holds each tensor whole (replicated: the residual stream without sequence parallel,
         KV heads past the tp degree), or cut once over tp: heads or widths (column-parallel outputs, attention's
         heads, a vocabulary-parallel head's logits) or tokens (sequence parallel's norm regions); never twice, so
         at least 1 / tp of it
    ep   an expert-parallel rank's experts receive balanced routing's ep × their share of the ep ranks' pairs (the
         busiest rank more under an expert load): the same pairs as one device; 1 / ep is taken anyway, as no
         tensor of the rank can be cut further than tp × ep at S / cp
    dp   cuts no activation: the rank runs its replica's batch, the recipe's B (FSDP2 and ZeRO cut the states only,
         counted apart)

Each share is at most the rank's own tensor's bytes, so their sum (floored) is at most what the rank holds at the
end of its forward, beside its model states but the gradients: the engine's forward moment, at most its peak. With
a pipeline, and where the recipe is neither cached nor derivable without the build, the model states alone (a
stage's layers' part of the one-device recipe is not split out here). The search passes over on this bound but
tries a derived class's layouts in its states' order (order): the pipelines' bound has no share, so ranked by it
they would take the derivations the cap allows from the layouts they go to now."""

from __future__ import annotations

from typing import Any, Callable

from ...errors import OptionError
from .layout import ParallelLayout
from .layout_facts import ModelFacts
from .pipeline import params_held, stages


class PeakLowerBound:
    """The bound, with the first stage's model states and one layer's activations each computed once."""

    def __init__(self, facts: ModelFacts, derived: Callable[[int], bool | None]) -> None:
        self.facts = facts
        self.derived = derived  # StepEngines.derived: a replica batch whose step is not the analytic recipe's
        self._first_stage: dict[tuple, tuple[Any, int, int]] = {}  # (its states, its layers, microbatches in flight)
        self._per_layer: dict[tuple[int, int, bool, int], int | None] = {}
        self._held_bytes: dict[tuple[int, int], int] = {}  # (replica, cp) → the forward's held allocations' share
        self._step: Any = None  # the one-device derived step (derived/step.py), read once
        self._step_missing = False  # neither cached nor derivable without the build

    def bound(self, layout: ParallelLayout, replica: int, activations: bool = True) -> int:
        """The bound; `activations` False: a derived class's model states alone (the search's order, see order)."""
        if isinstance(self.facts.placements(layout.tp, layout.ep), OptionError):
            return 0
        states, layers, in_flight = self.first_stage(layout)
        micro = replica // layout.micro_batches if layout.pp > 1 and layout.micro_batches else replica
        per_layer = self.per_layer(layout.tp, layout.cp, layout.sp, micro)
        if per_layer is None or self.derived(replica):
            # the step is not the analytic recipe's (derived or traced): its states, and beside them (the end of
            # the forward's) the rank's share of what one device's derived forward leaves live
            shared = self.derived_share(layout, replica) if activations else 0
            return max(states.bytes, states.bytes - states.gradients + shared) if shared else states.bytes
        kept = in_flight * layers * per_layer
        return max(states.bytes, states.bytes + kept if layout.pp > 1 else states.bytes - states.gradients + kept)

    def order(self, layout: ParallelLayout, replica: int) -> int:
        """The key the search tries layouts by, lowest first: the bound, but a derived class's model states alone.
        Its derived share is bounded without a pipeline only, so ranked by it the pipelines would come first and
        take the derivations the cap allows from the layouts they went to; what it buys is a layout passed over
        instead of derived, not another order."""
        return self.bound(layout, replica, activations=False)

    def states_bytes(self, layout: ParallelLayout) -> int:
        """The first stage's model states on rank 0 (the whole model's without a pipeline): the bound's floor."""
        return self.first_stage(layout)[0].bytes

    def derived_share(self, layout: ParallelLayout, replica: int) -> int:
        """The rank's share of the one-device derived forward's held allocations that follow the batch or the
        tokens (the module docstring's cuts): 0 under a pipeline or where the recipe is not at hand."""
        if layout.pp > 1:
            return 0
        held = self._held(replica, layout.cp)
        return held // (layout.tp * layout.ep)

    def _held(self, replica: int, cp: int) -> int:
        key = (replica, cp)
        if key not in self._held_bytes:
            from ..derived.symbols import evaluate

            recipe = self._recipe(replica)
            total = 0
            if recipe is not None and (cp == 1 or recipe.seq_unit == 1):
                seq = self.facts.seq // recipe.seq_unit
                for poly, size, times in recipe.held_after_forward(replica, self.facts.seq):
                    if not any(i or j for i, j, _ in poly):
                        continue  # follows neither the batch nor the tokens: a weight's copy, a buffer
                    if cp > 1:
                        if max(j for _, j, _ in poly) > 1:
                            continue  # S² (eager attention's scores): the ring's kernel need not keep any
                        size = max(0, evaluate(poly, replica, seq // cp))
                    total += times * size
            self._held_bytes[key] = total
        return self._held_bytes[key]

    def _recipe(self, replica: int) -> Any:
        """The one-device derived recipe covering replica × seq, or None (not cached and no module; declined)."""
        seq = self.facts.seq
        if self._step is None:
            if self._step_missing:
                return None
            from ..memory.training import one_device_derived

            facts = self.facts
            self._step = one_device_derived(facts.report, facts.view, facts.training_options(replica))
            if self._step is None:
                self._step_missing = True
                return None
        step = self._step
        if not any(r.covers(replica, seq) for r in step.recipes) and step.at(replica, seq) is None:
            return None
        return next((r for r in step.recipes if r.covers(replica, seq)), None)

    def first_stage(self, layout: ParallelLayout) -> tuple[Any, int, int]:
        """(rank 0's model states on the first stage (the whole model without a pipeline), the layers whose
        activations it keeps at once (the largest chunk's, interleaved), the microbatches in flight)."""
        key = (layout.tp, layout.ep, layout.pp, layout.virtual_stages, layout.shard, layout.shard_degree, layout.dp,
               layout.cp)
        if key not in self._first_stage:
            from ..memory.states import check_optimizer, check_precision
            from .states import device_states

            facts = self.facts
            params = facts.report.params
            first = stages(layout, facts.layers)[0] if layout.pp > 1 else None
            held = params_held(params, facts.stack, first) if first else params  # type: ignore[arg-type]
            states = device_states(held, facts.placements(layout.tp, layout.ep), layout,
                                   precision=check_precision(facts.options.precision),
                                   optimizer=check_optimizer(facts.options.optimizer),
                                   trainable=frozenset(p.name for p in params))
            if first is None:
                self._first_stage[key] = (states, facts.layers, 1)
            else:
                layers = max(first.chunk_layers) if layout.virtual_stages > 1 else len(first.layers)
                self._first_stage[key] = (states, layers, first.in_flight)
        return self._first_stage[key]

    def per_layer(self, tp: int, cp: int, sp: bool, micro: int) -> int | None:
        """One layer's saved activations on a rank (the analytic recipe on its shard, at S / cp tokens, norms on
        S / tp under sequence parallel), or None where the class has no such recipe."""
        key = (tp, cp, sp, micro)
        if key not in self._per_layer:
            from ..memory.states import step_precision
            from .activations import local_recipe, sequence_parallel, tp_activations

            facts = self.facts
            precision = step_precision(facts.options.precision)  # bf16-master's activations are bf16-pure's
            value = None
            if local_recipe(facts.text, facts.view.class_name) is not None:
                seq = -(-facts.seq // cp)
                act = tp_activations(facts.text, facts.view.class_name, tp=tp, batch=micro, seq=seq,
                                     precision=precision, checkpointing=facts.checkpointing,
                                     cast_weights=0, cast_head=0, cast_biases=0)
                if act is not None and sp and tp > 1:
                    act = sequence_parallel(act, tp=tp, tokens=micro * seq, hidden=facts.hidden,
                                            precision=precision, layer_norms=facts.layer_norms,
                                            checkpointing=facts.checkpointing)
                value = act.per_layer if act is not None else None
            self._per_layer[key] = value
        return self._per_layer[key]
