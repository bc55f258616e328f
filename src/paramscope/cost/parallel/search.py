"""Which layouts fit: every dp × tp × pp × cp (× ep) layout of N devices, the ones whose busiest device fits a GPU,
sorted by a bound on the step's time, with the pipeline bubble and the communication each device does a step; and
the fewest devices that fit. `memory --training --find-layout` and the Python API's `find_layout` run it.

    enumerate  layout_candidates.py: every layout of N devices the sharding rules, the layers, the sequence, the
               routed experts and the global batch allow
    → rank     lowest lower bound on its peak first (layout_bound.py), context parallel layouts after the others,
               so that where a class's derivations are capped (layout_derivation.py's MAX_DERIVED) they go to the
               layouts most likely to fit
    → evaluate layout_evaluation.py: one device's peak against the GPU (the analytic closed form, or derived as
               memory derives it), its FLOPs (layout_flops.py), a time bound at the GPU's peak, its communication a
               step (layout_comm.py)
    → sorted   by the step-time bound, then by the bytes, then by the peak (search_result.py's time_order: the
               bound is max(compute + exposed tp, NVLink, network), layout_time.py's EXPOSURE, once LayoutSearch
               times each layout's communication on the GPU's links)
    → fewest   layout_minimum.py: the fewest devices that fit, up to 16 × N
    → answer   search_result.py's LayoutSearch (the options: search_options.py's SearchOptions)
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from ...errors import UnsupportedError
from .layout_candidates import candidate_layouts, divisors, likely_first
from .layout_evaluation import LayoutEvaluator
from .layout_minimum import fewest_devices
from .search_options import SearchOptions, peak_for
from .search_result import (Candidate, CommTerm, DeviceCount, LayoutSearch, Minimum, Skipped,
                            candidate_settings)


def search(report: Any, view: Any, options: SearchOptions, flops_check: Any = None) -> LayoutSearch | None:
    """The search on a model's report and view; None where a layout's memory needs the built module (the caller
    builds and asks again). `flops_check`: the FLOPs' engine check (engine_check.CheckFor), as `flops` reads it."""
    from ..dims import text_config
    from ..memory.serving import step_length
    from ..memory.states import check_optimizer, check_precision, model_states
    from ..memory.training import DEFAULT_TRAINING_SEQ

    began = perf_counter()
    seq, _, notes = step_length(report, text_config(view.config), options.seq, DEFAULT_TRAINING_SEQ)
    evaluator = LayoutEvaluator(report, view, options, seq, flops_check)
    if options.expert_load != 1 and not evaluator.facts.experts:
        raise UnsupportedError("expert load {load:g}: {cls} has no routed experts for ep ranks to share",
                               load=options.expert_load, cls=view.class_name)
    layouts, skipped = candidate_layouts(evaluator.facts, options.devices)
    candidates: list[Candidate] = []
    # lowest lower bound first (as the fewest devices' search; a derived class's by its states: layout_bound.order),
    # context parallel layouts after the others, so that
    # where a class's derivations are capped (MAX_DERIVED) they go to the layouts most likely to fit: cp cuts only
    # the activations, and each (cp, tp, FSDP degree) is a derivation of its own (ranked with the rest, they spent
    # the cap and left Mixtral-8x7B's fastest on 16 H100s, dp 1 · tp 8 · pp 2, not derived); the table is sorted
    # afterwards
    ranked = sorted((layout.cp > 1, evaluator.lower_bound.order(layout, replica), i, layout, replica)
                    for i, (layout, replica) in enumerate(likely_first(layouts)))
    bounded = unanswered = 0  # N's layouts passed over on their bound, and those not answered otherwise
    for _, _, _, layout, replica in ranked:
        result = evaluator.evaluate(layout, replica)
        if result is None:
            return None
        if isinstance(result, Candidate):
            candidates.append(result)
            continue
        skipped.append(result)
        bounded += result.bounded
        unanswered += not result.bounded
    fitting, not_fitting = _sorted(candidates)
    states = model_states(report.params, precision=check_precision(options.precision),
                          optimizer=check_optimizer(options.optimizer),
                          trainable=frozenset(p.name for p in report.params))
    minimum = fewest_devices(evaluator, states.bytes, fitting, len(layouts) - unanswered - bounded, unanswered,
                             bounded)
    if minimum is None:
        return None
    notes.extend(_notes(evaluator, options, bool(fitting or not_fitting)))
    facts = evaluator.facts
    return LayoutSearch(facts.accelerator.name, facts.accelerator.memory, options.reserve, facts.peak,
                        facts.peak_dtype, options.devices, options.total_batch, seq, options.precision,
                        options.optimizer, options.grad_checkpointing, facts.shard,
                        options.schedule or ("interleaved" if options.virtual_stages > 1 else "1f1b"),
                        options.virtual_stages, fitting, not_fitting, tuple(skipped), minimum, evaluator.evaluated,
                        tuple(notes), perf_counter() - began, fsdp_mixed_precision=options.fsdp_mixed_precision)


def _notes(evaluator: LayoutEvaluator, options: SearchOptions, any_answered: bool) -> list[str]:
    """What the summary says of how the layouts were answered: the pipelines not modelled, the engine (closed form or
    derived, and what the closed form leaves out), the derivations made and capped."""
    notes = []
    if evaluator.facts.no_pp:
        notes.append(f"no pipeline layouts: {evaluator.facts.no_pp}")
    if evaluator.engines.any_derived:
        notes.append("tensor, context and pipeline parallelism have analytic per-device memory for the Llama-style "
                     "family (Llama, Mistral, Qwen2, Gemma, Gemma-2, Phi-3, Mixtral, Qwen2-MoE); for this class each "
                     "layout is answered as memory --dp D --tp T --pp P --cp C --ep E --sp answers it: a rank's step "
                     "derived from traces of short cuts with the layout applied on torch's fake process group, a "
                     "pipeline's stages replayed from the one-device (or tensor- or expert-parallel rank's) derived "
                     "recipe; a layout memory refuses is named as not answered, with its reason")
    elif any_answered:
        notes.append("each layout's peak is the analytic per-device closed form (instant; the ranks a note below "
                     "names derived from traces apart); under FSDP2 it prices the moments fully_shard holds inside "
                     "the step (a unit's all-gather, the root's unsharded gradients, the reduce-scatter input) for "
                     "Llama, Mistral and Qwen2 in fp32, mixed precision and bf16-pure, with or without full "
                     "checkpointing, equal to memory's derived rank (llama-3-8b, 8 × H100, 512 tokens: dp 8 20.34 GiB "
                     "under FSDP2's MixedPrecisionPolicy, 36.19 GiB under autocast); for the other classes and "
                     "settings memory --dp D --zero fsdp (no pipeline) derives a rank from traces that counts them, so "
                     "its figure can be higher: a layout near the GPU's limit is worth memory's answer")
    if any_answered:
        notes.append("gradient accumulation (memory --grad-accum): a layout without a pipeline runs its replica batch "
                     "as micro-steps of one sequence (accum N), the microbatch each pipeline runs, the optimizer "
                     "after the last; its peak is the larger of the first micro-step's and a later one's, which "
                     "starts with the device's share of the gradients held (FSDP2's default: reduce-scatter every "
                     "micro-step). The later micro-step is a lower bound where the closed form answers (the head's "
                     "new gradient, added into the held one, is not among its moments: about the rank's head "
                     "gradient, twice under mixed precision); FSDP2's gathers and reduce-scatters run every "
                     "micro-step (its dp bytes × N), the step's FLOPs are unchanged. Where that does not fit but the "
                     "replica batch at once does (the held gradients outweigh the activations saved), the closed "
                     "form's layout runs it at once (no accum)")
    from ..memory.states import MASTER_PRECISION, check_precision

    if any_answered and check_precision(options.precision) == MASTER_PRECISION:
        from .states import master_search_words

        notes.append(master_search_words())
    if any_answered and evaluator.facts.shard in ("fsdp", "hsdp") and options.precision.endswith("-mixed"):
        notes.append(mixed_precision_note(options))
    if options.expert_load != 1:
        notes.append(f"expert load {options.expert_load:g} (a convention: the busiest expert-parallel rank receives "
                     f"{options.expert_load:g}× its balanced token-expert pairs): each ep > 1 layout's peak and step "
                     "time are that rank's (memory --expert-load and flops --expert-load), its ep communication "
                     "still balanced routing's; ep 1 layouts route every pair on their own rank")
    derived = evaluator.derivations.note(options.devices)
    if derived:
        notes.append(derived)
    return notes


def mixed_precision_note(options: SearchOptions) -> str:
    """The convention the FSDP2 layouts' mixed precision is priced under (--fsdp-mixed-precision), named."""
    half = options.precision.split("-")[0]
    if options.fsdp_mixed_precision == "policy":
        return (f"FSDP2's mixed precision: fully_shard's MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32) "
                "and no autocast (--fsdp-mixed-precision policy, torchtitan's: the default), on every layout FSDP2 "
                "shards over more than one rank (named 'its MixedPrecisionPolicy'; one sharded over one rank has no "
                "fully_shard and runs autocast): each peak as memory --fsdp-mixed-precision policy answers it, by the closed form "
                "where one reaches (Llama, Mistral and Qwen2 over dp, tp, cp without sp and pipelines, as "
                "derive_layout=False asks it), else derived from traces with the policy applied (cp beside sp, ep, "
                "other classes: each a derivation of its own); a pipeline's stages beside tp (cp 1) replay the policy's "
                "FSDP2 tp rank, as memory's do (every unit of the stage gathered in 16 bits and its gradients "
                "unsharded in fp32 until the step's reduce: torch's PipelineStage's unsynced backward), memory's figure "
                "to the byte; without tp, or beside cp, they are the Llama closed form over bf16-pure's stages, an "
                f"estimate named in memory's answer; its dp bytes the {half} gathers (2 B an element) and fp32 "
                "reduce-scatters (4 B), each parameter padded as fully_shard pads it")
    return (f"FSDP2's mixed precision: torch.autocast({half}) over the fp32 parameters (--fsdp-mixed-precision "
            "autocast): fp32 gathers and reduce-scatters (4 B an element each, padded as fully_shard "
            "pads); torchtitan runs FSDP2 with its MixedPrecisionPolicy instead, the default: --fsdp-mixed-precision "
            "policy")


def _sorted(candidates: list[Candidate]) -> tuple[tuple[Candidate, ...], tuple[Candidate, ...]]:
    fitting = sorted((c for c in candidates if c.fits),
                     key=lambda c: (c.seconds, c.comm_bytes, c.peak, c.layout.tp, c.layout.pp, c.layout.cp,
                                    c.layout.ep))
    rest = sorted((c for c in candidates if not c.fits), key=lambda c: (c.peak, c.layout.tp,
                                                                        c.layout.pp, c.layout.cp, c.layout.ep))
    return tuple(fitting), tuple(rest)


def find_layouts(model: Any, options: SearchOptions, use_cache: bool = True,
                 **model_options: Any) -> tuple[Any, LayoutSearch, Any]:
    """(the model's Report, the LayoutSearch, the ModelView it read): from the template and cost facts where they
    answer, else from the meta build."""
    from ...api import as_source
    from ..engine_check import CheckFor
    from ..facts.store import answer_from_facts_or_build, facts_key
    from ..flops.check import check_flops
    from ..memory.states import check_precision, weight_dtype

    options.check()
    dtype = weight_dtype(check_precision(options.precision))
    source = as_source(model, model_options.pop("revision", None))
    key = facts_key(source.config, model_class=model_options.get("model_class"), task=model_options.get("task"),
                    num_labels=model_options.get("num_labels"))
    checked = CheckFor("flops", key, use_cache, check_flops)
    report, view, result = answer_from_facts_or_build(
        source, lambda report, view: search(report, view, options, checked),
        why_none=lambda report, view: "a layout's memory needs a traced step, which needs the build",
        dtype=dtype, use_cache=use_cache, **model_options)
    if result is None:
        raise UnsupportedError("the layout search needs each layout's memory without a full trace; {cls} has none "
                               "here", cls=view.class_name)
    return report, result, view


__all__ = ["Candidate", "CommTerm", "DeviceCount", "LayoutSearch", "Minimum", "SearchOptions", "Skipped",
           "candidate_settings", "divisors", "find_layouts", "peak_for", "search"]
