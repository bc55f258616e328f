"""One layout's figures: its busiest device's peak against the GPU, and for a layout that fits its FLOPs, the time
bound at the GPU's peak and its communication.

    → memory   one device's peak (estimate.py through memory/training.py's step_estimate), + the reserve, against
               the GPU's memory. A class without the analytic per-device recipe (its step derived from traces):
               each layout asked as memory --dp D --tp T --pp P --sp asks it (the same peak to the byte), which
               derives a rank's step (layout_derivation.py: at most MAX_DERIVED a search, lowest bound first, none
               for a layout whose bound exceeds the GPU); what memory refuses, or the cap leaves underived, is a
               Skipped with its reason
    → FLOPs    the busiest device's hardware FLOPs a step (layout_flops.py: its stage and tp rank, recompute included)
    → time     a bound at the GPU's peak: hardware FLOPs / peak FLOP/s / (1 − bubble). Not a prediction: no
               kernel runs at its peak, and communication is not in it (it may overlap or not)
    → bytes    each device's communication a step, by kind, each a bound (layout_comm.py)

A layout that does not fit is given its memory only (no FLOPs, time or bytes): the search reads only that it does
not fit."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from ...errors import ParamscopeError
from . import layout_derivation
from .layout import ParallelLayout
from .layout_bound import PeakLowerBound
from .layout_candidates import refusal_words
from .layout_comm import StepCommunication
from .layout_derivation import Derivations, derivation_key
from .layout_engines import StepEngines
from .layout_facts import ModelFacts, read_facts
from .layout_flops import LayoutFlops
from .pipeline import bubble
from .search_options import SearchOptions
from .search_result import Candidate, Skipped


class LayoutEvaluator:
    """Each layout's Candidate (or Skipped), from the model's facts read once; counts the layouts evaluated."""

    def __init__(self, report: Any, view: Any, options: SearchOptions, seq: int, flops_check: Any = None) -> None:
        self.facts: ModelFacts = read_facts(report, view, options, seq)
        self.engines = StepEngines(self.facts)
        self.lower_bound = PeakLowerBound(self.facts, self.engines.derived)
        self.derivations = Derivations()
        self.flops = LayoutFlops(self.facts, flops_check)
        self.communication = StepCommunication(self.facts)
        self.evaluated = 0  # layouts whose memory was computed

    def bound(self, layout: ParallelLayout, replica: int) -> int:
        """A lower bound on the layout's peak per device (layout_bound.py): its first micro-step's, at the
        microbatch, under gradient accumulation. Under FSDP2's MixedPrecisionPolicy its model states alone (the
        same fp32 shards as autocast's): the bound's activations are autocast's, which the policy's 16-bit ones may
        be below, so they bound nothing there."""
        if policy_layout(layout):
            return self.lower_bound.states_bytes(layout)
        return self.lower_bound.bound(layout, micro_batch(layout, replica))

    def evaluate(self, layout: ParallelLayout, replica: int) -> Candidate | Skipped | None:
        """The layout's figures; Skipped where an engine refuses it (the reason); None where the memory answer
        needs the built module.

        A class without the analytic per-device recipe is asked exactly what `memory --dp D --tp T --pp P --sp`
        asks (derive_layout: one rank's step derived from traces with the layout applied, wherever memory derives
        one), so each answered layout's peak is memory's to the byte; a derivation the search has not made yet is
        made only while fewer than MAX_DERIVED were, and only for a layout whose lower bound fits the GPU."""
        facts = self.facts
        steps = accumulation(layout, replica)
        micro = replica // steps  # the batch one rank's step runs at: what is derived
        key = derivation_key(layout, micro, facts.experts)
        derive = False
        # (an expert load is asked as memory asks it, derived, so that what memory refuses is named with its reason)
        if layout.tp > 1 or layout.cp > 1 or layout.pp > 1 or key is not None or layout.expert_load != 1:
            why = self.engines.not_answered(layout, micro)
            if self.engines.needs_build:
                return None
            if why:
                return _skipped(layout, why)
            derive = bool(self.engines.derived(micro)) or policy_derived(layout, facts)
        new = False  # a rank's step this search derives now
        if derive and key is not None and key not in self.derivations.made:
            if key[0] == "device":  # the one-device recipe at a microbatch size, as dp × pp always derived it
                self.derivations.made.append(key)
            else:
                refused = self._derivation_refused(layout, replica)
                if refused is not None:
                    return refused
                self.derivations.made.append(key)
                new = True
        self.evaluated += 1
        try:
            memory = self._memory(layout, replica, derive, new, steps)
            if memory is None:
                return None
            if steps > 1 and memory.peak > facts.capacity and not derive:
                # the later micro-steps hold every gradient: where that does not fit but the whole replica batch at
                # once does, a practitioner runs it at once (the closed form answers both in an instant)
                at_once = self._memory(layout, replica, derive, False, 1)
                if at_once is not None and at_once.peak <= facts.capacity:
                    memory, steps = at_once, 1
            if memory.peak > facts.capacity:
                return Candidate(layout, replica, memory.peak, memory.peak_phase, False, facts.capacity - memory.peak,
                                 None, None, bubble(layout), None, (), None, steps)
            device = self.flops.device(layout, replica)
        except ParamscopeError as err:
            if new:  # memory refused the layout (GPT-2's attention dropout under cp, say): no rank was derived for
                # it, so the cap is not spent on it
                self.derivations.made.remove(key)
            self.engines.refuse_stages(layout, replica, refusal_words(err))
            return _skipped(layout, refusal_words(err))
        idle = bubble(layout)
        seconds = device.hardware / facts.peak / (1 - idle)
        stage, comm = self.communication.busiest(layout, replica, steps)
        return Candidate(layout, replica, memory.peak, memory.peak_phase, True, facts.capacity - memory.peak,
                         device.hardware, device.step, idle, seconds, comm, stage, steps)

    def _derivation_refused(self, layout: ParallelLayout, replica: int) -> Skipped | None:
        """Why a layout that needs a new rank's derivation gets none: its bound exceeds the GPU, or the cap is
        spent (counted as not derived); None where it is derived."""
        capacity = self.facts.capacity
        if self.bound(layout, replica) > capacity:
            what = "its model states alone" if self.lower_bound.states_bytes(layout) > capacity else \
                "its model states and its share of one device's derived activations"
            return _skipped(layout, f"does not fit: {what}, a lower bound on its peak, exceed the "
                                    f"{capacity:,} B the GPU leaves beside the reserve (no step derived)",
                            bounded=True)
        if self.derivations.exhausted:
            known = self._ring_refusal(layout)
            if known is not None:  # memory refuses it before deriving anything: its reason, not the cap's
                return known
            self.derivations.not_derived += 1
            return _skipped(layout, f"not derived: the search derives at most {layout_derivation.MAX_DERIVED} ranks' "
                                    "steps from traces (the lowest-bound layouts' first), and each "
                                    f"{self.facts.view.class_name} rank at another tp, cp or FSDP degree or batch "
                                    "regime is one; memory --dp D --tp T --pp P --cp C --sp derives it")
        return None

    def _ring_refusal(self, layout: ParallelLayout) -> Skipped | None:
        """Memory's refusal of a context-parallel layout where it comes before any derivation (an encoder, attention
        dropout, a window shorter than S, a length the ring cannot split, cp beside experts it does not trace):
        estimate.check_context_parallel itself, on what it reads of a step's context. None where it passes (the
        layout then needs its rank derived) or the layout has no cp."""
        from ...errors import UnsupportedError
        from .estimate import check_context_parallel

        if layout.cp == 1:
            return None
        facts = self.facts
        try:
            check_context_parallel(_RingQuestion(facts.view, facts.text, layout, facts.seq),
                                   experts=layout.ep > 1 and facts.experts > 0)
        except UnsupportedError as err:
            return _skipped(layout, refusal_words(err))
        return None

    def _memory(self, layout: ParallelLayout, replica: int, derive: bool, new: bool, steps: int) -> Any:
        """One device's step under the layout as memory answers it (None: the build is needed); `new`: a rank's
        step derived now, said on the progress line; `steps`: its micro-steps (memory --grad-accum)."""
        from ... import progress
        from ..memory.training import step_estimate

        facts = self.facts
        status = progress.status(f"layout search: one rank's step for {layout.words()}, derived from traces "
                                 f"({self.derivations.spent} of at most {layout_derivation.MAX_DERIVED})") \
            if new else nullcontext()
        with status:
            return step_estimate(facts.report, facts.view,
                                 facts.training_options(replica, layout=layout, derive_layout=derive,
                                                        grad_accum=steps), live=False)


@dataclass(frozen=True)
class _RingQuestion:
    """device.RingQuestion, what estimate.check_context_parallel reads of a step's context: the model, its text
    config, the layout and the sequence, all the search knows before a step is asked."""

    view: Any
    text: Any
    layout: ParallelLayout
    seq: int


def policy_layout(layout: ParallelLayout) -> bool:
    """FSDP2 shards the layout under its MixedPrecisionPolicy (--fsdp-mixed-precision policy)."""
    return layout.fsdp_mixed_precision == "policy" and layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1


def policy_derived(layout: ParallelLayout, facts: ModelFacts) -> bool:
    """Under the policy, a layout memory answers from a derived step whatever the class: context parallel where the
    policy's closed form (fsdp_moments.py) does not price the ring (below) or routed experts cut
    over ep (it reaches none; beside a pipeline memory refuses them, naming why), and without a pipeline a class
    the policy's closed form does not price (fsdp_moments.fsdp_moments_missing: Llama, Mistral and Qwen2, tied heads
    too). A Llama-family pipeline without tp takes the closed form over bf16-pure's stages with the derivation off
    (pipeline_device.py), as autocast's pipelines do; beside tp (cp 1) its stages replay the policy's FSDP2 tp rank, as
    memory's do (the closed form lies under that replay there); another class's stages replay the policy's FSDP2
    rank."""
    from .fsdp_moments import TRACED_FAMILY  # the families the policy's closed form is held to

    if not policy_layout(layout):
        return False
    priced = getattr(facts.text, "model_type", None) in TRACED_FAMILY  # a tied head too, beside tp or not
    # context parallel: the closed form prices torch's ring over FSDP2 without a tied head, beyond cp 2 where it runs
    # balanced (2·cp divides S) (fsdp_moments_missing); under a pipeline the closed form answers memory too (the
    # replay reaches no cp rank: pipeline_device.POLICY_BESIDE_CP)
    ring_priced = priced and layout.shard == "fsdp" and facts.tied is None \
        and (layout.cp == 2 or facts.seq % (2 * layout.cp) == 0)
    # a pipeline beside tensor parallel: memory replays the policy's FSDP2 rank (tp's), which the closed form over
    # bf16-pure's stages lies under (tp's layers and the backward's moments: pipeline_device.POLICY_CLOSED_FORM), so
    # the search asks memory's replay there, the same figure to the byte (the rank derived once a tp degree: at
    # another shard degree its recipe's shards are resized, parallel/policy_degrees.py)
    replayed = layout.pp > 1 and layout.tp > 1 and layout.cp == 1
    return layout.cp > 1 and not ring_priced or layout.ep > 1 and facts.experts > 0 or layout.pp == 1 and not priced \
        or replayed


MICRO_BATCH = 1  # sequences a microbatch: a pipeline's default (layout_for), Megatron's usual micro-batch size


def accumulation(layout: ParallelLayout, replica: int) -> int:
    """Micro-steps a layout runs its replica batch as: without a pipeline, gradient accumulation over microbatches
    of MICRO_BATCH sequences, the microbatch a pipeline runs (its --micro-batches), so that no layout is priced
    at a larger batch at once than a pipeline's; 1 under a pipeline (its microbatches are its accumulation). Where the closed
    form answers and the accumulated step does not fit but the batch at once does (the later micro-steps hold every
    gradient), the layout runs it at once (LayoutEvaluator.evaluate)."""
    return replica // MICRO_BATCH if layout.pp == 1 and replica % MICRO_BATCH == 0 else 1


def micro_batch(layout: ParallelLayout, replica: int) -> int:
    return replica // accumulation(layout, replica)


def _skipped(layout: ParallelLayout, reason: str, bounded: bool = False) -> Skipped:
    return Skipped(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, reason, bounded)
