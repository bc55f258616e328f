"""A lower bound on a layout's peak per device, cheap beside its evaluation: the search passes over a layout whose
bound exceeds the GPU (it cannot fit), and tries the rest lowest bound first.

Two of the terms the per-device engine adds into one of the first stage's moments (the whole model's without a
pipeline), on rank 0. With a pipeline, its 1F1B steady state (or GPipe's first backward) holds the stage's model
states, gradients included, and its layers' saved activations for every microbatch in flight; without one, the end
of the forward holds the states but the gradients, and every layer's saved activations; the optimizer step holds all
the states. The rest of those moments (the embedding output, 16-bit weight copies, FSDP2's gathered units, the
arriving gradient, the logits) only adds, so a layout whose bound exceeds the GPU does not fit. The model states
alone where the class has no analytic recipe or its step is another engine's (a derived step's activations need not
reach the recipe's)."""

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

    def bound(self, layout: ParallelLayout, replica: int) -> int:
        if isinstance(self.facts.placements(layout.tp, layout.ep), OptionError):
            return 0
        states, layers, in_flight = self.first_stage(layout)
        micro = replica // layout.micro_batches if layout.pp > 1 and layout.micro_batches else replica
        per_layer = self.per_layer(layout.tp, layout.cp, layout.sp, micro)
        if per_layer is None or self.derived(replica):
            # the step is not the analytic recipe's (derived or traced), whose activations need not exceed the
            # recipe's: the model states alone, which the optimizer step holds
            return states.bytes
        kept = in_flight * layers * per_layer
        return max(states.bytes, states.bytes + kept if layout.pp > 1 else states.bytes - states.gradients + kept)

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
            from .activations import local_recipe, sequence_parallel, tp_activations

            facts = self.facts
            value = None
            if local_recipe(facts.text, facts.view.class_name) is not None:
                seq = -(-facts.seq // cp)
                act = tp_activations(facts.text, facts.view.class_name, tp=tp, batch=micro, seq=seq,
                                     precision=facts.options.precision, checkpointing=facts.checkpointing,
                                     cast_weights=0, cast_head=0, cast_biases=0)
                if act is not None and sp and tp > 1:
                    act = sequence_parallel(act, tp=tp, tokens=micro * seq, hidden=facts.hidden,
                                            precision=facts.options.precision, layer_norms=facts.layer_norms)
                value = act.per_layer if act is not None else None
            self._per_layer[key] = value
        return self._per_layer[key]
