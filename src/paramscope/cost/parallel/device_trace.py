"""--trace under a layout: rank 0's step of the real class traced on torch's fake process group, or each pipeline
stage of a derived class cut and traced, beside the answer it checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .device import DeviceMemory, StepContext
from .device_parts import fsdp_sharded
from .pipeline import layer_stack_of
from .rules import cuts_routed_experts, placements_for
from .trace_reach import closed_form_traced, hybrid_replicas, untraced_by_layout


def traced_check(ctx: StepContext, device: DeviceMemory) -> DeviceMemory:
    """--trace: rank 0's step of the real class traced on torch's fake process group (FSDP2 and DTensor as
    traced/parallel.py applies them), its peak beside the analytic one."""
    from ..traced.parallel import trace_parallel_training
    from ..traced.step import StepSettings

    layout = ctx.layout
    why = None
    if ctx.view.module is not None and layout.pp > 1 and device.stages and \
            all(s.replayed is not None for s in device.stages):
        return traced_stages(ctx, device)
    if ctx.view.module is not None and layout.pp > 1 and device.stages and \
            device.activations_from.startswith("analytic") and \
            closed_form_traced(layout, checkpointing=bool(ctx.shape.get("checkpointing"))) is None:
        return traced_closed_form_stages(ctx, device)
    if ctx.view.module is None:
        why = "the model was not built"
    elif layout.pp > 1:
        why = "pipeline parallelism has no traced engine here (its figures are checked against torch's schedules " \
              "in tests)"
    else:  # the layouts no trace takes whatever the class: one list, the one TrainingOptions refuses up front with
        why = untraced_by_layout(layout)
    if why:
        return dataclasses.replace(device, notes=device.notes + (f"--trace: no rank traced: {why}",))
    fsdp = fsdp_sharded(layout)
    # the states' precision: bf16-master's rank runs bf16-pure's forward and backward, its step on fp32 masters
    # the answer's full checkpointing too (each layer recomputed in its backward; the trace ran without it)
    # under gradient accumulation (ctx.batch the micro-batch) the rank runs two micro-steps before its optimizer's,
    # the second over the gradients the first left (every later one is the second again): FSDP2 reduce-scatters
    # each micro-step's gradients and adds the shard into the held one (set_requires_gradient_sync(True), its
    # default, which torchtitan and accelerate keep); a tp rank's AccumulateGrad adds into its DTensor gradients
    settings = StepSettings(batch=ctx.batch, seq=ctx.seq, precision=ctx.states.precision, optimizer=ctx.optimizer,
                            attention=ctx.attention, frozen=ctx.frozen, weights_dtype=ctx.weights_dtype,
                            own_dtype=ctx.own, grad_accum=2 if ctx.accumulating else 1,
                            grad_checkpointing=bool(ctx.shape.get("checkpointing")))
    # beside cp, the ep ranks are dp_shard_in_ep × cp (torchtitan's): the trace's dp is ep / cp
    # under FSDP2 beside ep, torchtitan's (dp / ep, ep) mesh: the trace's dp is the shard degree (/ cp)
    traced = trace_parallel_training(ctx.view.module, settings, dp=layout.shard_degree // layout.cp if fsdp else
                                     layout.ep // layout.cp if layout.ep > 1 else 1, shard="fsdp" if fsdp else "none",
                                     tp=layout.tp, sp=layout.sp, ep=layout.ep, cp=layout.cp,
                                     load=layout.expert_load,
                                     mixed=layout.fsdp_mixed_precision if fsdp else "autocast",
                                     replicate=hybrid_replicas(layout, layout.ep > 1 and cuts_routed_experts(
                                         placements_for(ctx.report, ctx.view, layout))))
    engine = "derived" if device.activations_from.startswith("derived") else "analytic"
    applied = ", ".join(["FSDP2"] * fsdp + ["torchtitan's ExpertParallel"] * (layout.ep > 1) +
                        ["DTensor"] * (layout.tp > 1) + ["torch's ring attention"] * (layout.cp > 1)) \
        or "one data-parallel replica"
    if ctx.accumulating:
        applied += ("; two micro-steps before the optimizer's, the second over the gradients held" +
                    (", FSDP2 reduce-scattering each (set_requires_gradient_sync(True), its default)" if fsdp else ""))
    check = RankCheck(applied, engine, device.peak)
    return dataclasses.replace(device, traced=traced, rank_check=check,
                               notes=device.notes + (check.note(traced),) + tuple(traced.notes))


RANK_CHECK = "check: rank 0's step traced on torch's fake process group ("


@dataclass(frozen=True)
class RankCheck:
    """--trace's check under a layout, as data (carried beside the device's notes, DeviceMemory.rank_check): what
    the trace laid out, in words (`applied`), the engine whose answer it checks (analytic or derived) and that
    answer's `peak`; its note rendered from them beside the traced rank (note)."""

    applied: str
    engine: str
    peak: int

    def note(self, traced: Any) -> str:
        """The check's note: the traced rank's peak (`traced`, a TracedStep) beside the engine's `peak`, RANK_CHECK
        its opening."""
        top = traced.peak
        diff = (self.peak - top.bytes) / top.bytes if top.bytes else 0.0
        return (f"{RANK_CHECK}{self.applied}, MemTracker): peak {top.bytes:,} B in {top.phase}; the {self.engine} "
                f"{self.peak:,} B is {100 * diff:+.3f}% from it")


def rechecked(notes: tuple[str, ...], check: RankCheck, traced: Any, peak: int) -> tuple[str, ...]:
    """`notes` with `check`'s note (the one traced_check rendered, beside `traced`) said again beside `peak` (the
    engine's answer once a later micro-step's moments are added to it: grad_accum.accumulated), re-rendered from
    the check's data: the traced rank and what it laid out as they were."""
    said, again = check.note(traced), dataclasses.replace(check, peak=peak).note(traced)
    return tuple(again if note == said else note for note in notes)


def traced_stages(ctx: StepContext, device: DeviceMemory) -> DeviceMemory:
    """--trace under a pipeline of a derived class: each stage of the real class cut to its layers and run as
    PipelineStage runs it, its in-flight forwards then one backward, measured by MemTracker (traced/pipeline_stage.py),
    beside the stage's replayed figures."""
    from ..traced.parallel import check_layout
    from ..traced.pipeline_stage import trace_stage
    from ..traced.step import StepSettings

    layout = ctx.layout
    # tensor parallel: rank 0's stage, the copy sharded on torch's fake process group; expert parallel (where the
    # class has routed experts to cut): its experts sharded over ep ranks as the replayed step's
    experts = cuts_routed_experts(placements_for(ctx.report, ctx.view, layout))
    # context parallel: rank 0 of the (dp, cp, tp) mesh, torch's ring over the cp ranks (the replayed rank)
    # beside cp too: rank 0 of the (dp_shard_in_ep, cp, tp) mesh, the ep ranks dp_shard_in_ep × cp (the replayed rank)
    parallel = check_layout(layout.ep // layout.cp, "none", layout.tp, layout.sp, 0, layout.ep, layout.cp,
                            layout.expert_load) if experts else \
        check_layout(1, "none", layout.tp, layout.sp, 0, 1, layout.cp) if layout.tp > 1 or layout.cp > 1 else None
    why = untraced_by_layout(layout)
    if why:
        return dataclasses.replace(device, notes=device.notes + (f"--trace: no stage traced: {why}",))
    stack, _ = layer_stack_of([p.name for p in ctx.report.params])
    micro = ctx.batch // layout.micro_batches
    settings = StepSettings(batch=micro, seq=ctx.seq, precision=ctx.precision, optimizer=ctx.optimizer,
                            attention=ctx.attention, frozen=ctx.frozen, weights_dtype=ctx.weights_dtype,
                            own_dtype=ctx.own)
    notes, traces = [], []
    for stage in device.stages:
        start, stop = stage.layers[0], stage.layers[1] + 1
        replayed = stage.replayed
        later = replayed.later_in_flight
        if layout.virtual_stages > 1:  # the rank's chunks, run in torch's ScheduleInterleaved1F1B order
            from ..traced.interleaved_stage import trace_interleaved_stage
            from .pipeline import interleaved_order

            traced = trace_interleaved_stage(ctx.view.module, settings, stack,
                                             tuple((a, b + 1) for a, b in stage.chunks),
                                             interleaved_order(layout, stage.rank), parallel=parallel)
        else:
            traced = trace_stage(ctx.view.module, settings, stack, start, stop, stage.in_flight, later=later,
                                 parallel=parallel)
        traces.append(traced)
        words = ""
        if later:  # the later backward's rise above what the first left (the microbatches still held)
            rise = traced.later_peak - traced.after_backward
            derived = replayed.later_peak - replayed.after_first_backward
            again = "one more forward and " if later == stage.in_flight else ""
            words = (f"; then {again}the next backward, gradients held: {rise:,} B above what the first backward "
                     f"left, replayed {derived:,} B")
            if replayed.gradients_made is not None:  # interleaved: the later moments hold the gradients made since
                first, every = replayed.gradients_made
                derived = replayed.later_peak + every - replayed.after_first_backward - first
                words = (f"; then the rest of the order, the other chunks' gradients made as they go: {rise:,} B "
                         f"above what the first backward left, replayed {derived:,} B")
        run = (f"the real class cut to layers {start}–{stop - 1} and run as PipelineStage runs it, "
               f"{stage.in_flight} forward{'s' if stage.in_flight > 1 else ''} then a backward") \
            if layout.virtual_stages == 1 else \
            (f"the real class cut to its chunks, layers {', '.join(f'{a}–{b}' for a, b in stage.chunks)}, each run "
             "as PipelineStage runs it, in torch's ScheduleInterleaved1F1B order; held at its first backward")
        notes.append(f"check: stage {stage.rank} traced ({run}; MemTracker): held {traced.held:,} B, peak "
                     f"{traced.peak:,} B above its states; "
                     f"replayed {replayed.held:,} B and {replayed.peak:,} B ("
                     + ("equal" if (traced.held, traced.peak) == (replayed.held, replayed.peak) else
                        f"the replay {replayed.held - traced.held:+,} B held, {replayed.peak - traced.peak:+,} B at "
                        "the peak")
                     + ")" + words)
    return dataclasses.replace(device, traced=tuple(traces), notes=device.notes + tuple(notes))


def traced_closed_form_stages(ctx: StepContext, device: DeviceMemory) -> DeviceMemory:
    """--trace under a pipeline the Llama closed form answers where it is held to its traces
    (trace_reach.closed_form_traced: 1F1B, more microbatches than stages): each stage of the real class cut
    to its layers and run as PipelineStage runs it (traced/pipeline_stage.py), its in-flight forwards, a backward,
    then one more forward and the next backward with every gradient held (its steady state), measured by MemTracker;
    its largest moment beside the closed form's stage figure above the same resident states."""
    from ..traced.pipeline_stage import trace_stage
    from ..traced.step import StepSettings

    layout = ctx.layout
    stack, _ = layer_stack_of([p.name for p in ctx.report.params])
    settings = StepSettings(batch=ctx.batch // layout.micro_batches, seq=ctx.seq, precision=ctx.precision,
                            optimizer=ctx.optimizer, attention=ctx.attention, frozen=ctx.frozen,
                            weights_dtype=ctx.weights_dtype, own_dtype=ctx.own)
    notes, traces = [], []
    for stage in device.stages:
        start, stop = stage.layers[0], stage.layers[1] + 1
        traced = trace_stage(ctx.view.module, settings, stack, start, stop, stage.in_flight, later=stage.in_flight)
        traces.append(traced)
        top = max(traced.forward_peak, traced.peak, traced.later_peak)
        figure = stage.peak - (stage.weights + stage.optimizer + stage.master_weights + ctx.buffer_bytes)
        compared = ("the closed form's stage peaks at its optimizer step, which the trace does not run"
                    if stage.peak_phase == "optimizer step" else
                    f"the closed form {figure:,} B ("
                    + ("equal" if figure == top else f"{figure - top:+,} B from the trace") + ")")
        notes.append(f"check: stage {stage.rank} traced (the real class cut to layers {start}–{stop - 1} and run as "
                     f"PipelineStage runs it: {stage.in_flight} forward{'s' if stage.in_flight > 1 else ''}, a "
                     "backward, then one more forward and the next backward with every gradient held; MemTracker): "
                     f"held {traced.held:,} B (the closed form {stage.activations:,}), largest moment {top:,} B above "
                     f"its states; {compared}")
    return dataclasses.replace(device, traced=tuple(traces), notes=device.notes + tuple(notes))
