"""Serving across GPUs: each GPU's weights, KV cache and prefill workspace under tensor and pipeline parallelism.

    Report + view → placements (rules.py, the training layouts' own rules: each parameter's cut from its role, at
    tp, no expert parallelism) → pipeline stages (pipeline.py: layers in order, embeddings on the first stage,
    final norm and head on the last, a tied head's copy of the embedding there)
    → each stage's GPU (rank 0 of its tensor-parallel group, which holds the largest share where a cut is uneven):
      weights  the rank's shards in the storage format (memory/weights.py on the local shapes: a quantised weight's
               shard is the format applied to the rank's slice, its packed values and its own scales, as vLLM
               loads each rank's slice; buffers whole on every stage that runs them)
      KV cache memory/kv.py at tp and the stage's layers: K and V heads / tp, one head a rank once tp exceeds them,
               MLA's latent whole on every rank
      prefill  the one-device workspace's formula on the rank's shard: the MLP's and attention's widths and heads
               / tp, the hidden size whole (the residual stream and norms are replicated), the last token's logits
               gathered (vocabulary whole) on the last stage only
    → the worst stage's peak is the answer; the fits table asks it at other batches and contexts.

Data parallel (`--dp D`, vLLM's --data-parallel-size): D replicas of the tp × pp layout, each its own engine with
its own scheduler, serving its own requests (here each replica --batch B sequences of S tokens: the batch is a
replica's, as --training's is); attention, dense MLPs, shared experts, embeddings and the head are replicated per
replica (tp-sharded within), so a GPU's KV cache and workspace are its replica's. vLLM's MoE layers span every
replica (FusedMoEParallelConfig.make: flatten_tp_across_dp): without expert parallelism the routed experts are cut
by their widths over tp × dp ranks, with it (--ep) split whole over EP = tp × dp ranks (serving_experts.py).

The smallest layout that fits a GPU (`--gpu`/`--budget`), at the asked pipeline degree, batch and context:
    dense model  each T that `rules.place` accepts (dividing the heads, and the KV heads or a multiple of them), in
                 order, beside the asked replicas (which change no GPU's figures: each replica is a copy)
    MoE model    each T × D, D the replicas in powers of two, in order of GPUs (T × D), the fewer replicas first at
                 equal GPUs, up to max(64, the widest T) GPUs a stage: vLLM's MoE layers span the replicas, so more
                 replicas split the experts further (over T × D ranks, whole under --ep), each replica its own batch
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import OptionError, ParamscopeError, UnsupportedError
from ...frozen import FrozenDict, freeze_fields
from .layout import ParallelLayout, layout_for
from .pipeline import Stage, layer_of, layer_stack_of, split_words, stages

_COPY = " (the last stage's copy for the tied head)"
MAX_SEARCHED = 64  # the widest tensor-parallel group the smallest-T search tries (heads unknown: powers of two)
# a MoE model's search: the replicas tried (powers of two) and the most GPUs a stage, unless a T alone is wider
DP_SEARCHED = 64


@dataclass(frozen=True)
class ServingStage:
    """One pipeline stage's GPU (rank 0 of its tensor-parallel group)."""

    rank: int
    layers: tuple[int, int] | None  # (first, last) layer index held; None: none
    layer_count: int
    first: bool  # holds the embeddings
    last: bool  # holds the final norm and head
    weights: Any  # memory/weights.WeightMemory of the rank's shards
    kv_cache: Any  # memory/kv.KVCache of the rank's share of the stage's layers, or None
    workspace: Any  # memory/result.Workspace, or None
    peak: int  # weights + buffers + KV cache + workspace + correction + gathered + experts_workspace
    correction: int = 0  # the one-device trace's correction carried to this GPU (PerGpuCorrection) with the
    # formula's tp cut of the workspace given back (the traced moment need not shrink with it), bytes
    gathered: int = 0  # under --dp, the MoE dispatch's tokens gathered from every replica (GatheredDispatch), bytes
    experts_workspace: int = 0  # under --dp, vLLM's fused experts' workspace over them (FusedExpertsWorkspace), bytes

    @property
    def weight_bytes(self) -> int:
        return self.weights.bytes + self.weights.buffer_bytes

    @property
    def chunks(self) -> tuple[tuple[int, int], ...]:
        """The runs of layers held, as a training stage names them: one run, or none."""
        return (self.layers,) if self.layers is not None else ()


@dataclass(frozen=True)
class ServingLayout:
    """Each GPU's share of serving under tp × pp; `device` is the stage whose peak is the largest."""

    tp: int
    pp: int
    stages: tuple[ServingStage, ...]
    rules: FrozenDict[str, str]  # role → its tensor-parallel cut in words
    kv_heads: str  # the KV cache's heads on a rank, in words
    pipeline: str  # the layer split in words ("" without pp)
    workspace_from: str
    notes: tuple[str, ...] = field(default=())
    correction: "PerGpuCorrection | None" = None
    ep: int = 1  # expert parallel (vLLM's --enable-expert-parallel): the routed experts split whole over ep = tp × dp
    dp: int = 1  # data-parallel replicas (vLLM's --data-parallel-size), each serving its own --batch
    dispatch: Any = None  # serving_experts.GatheredDispatch under --dp for a MoE model, else None
    experts_workspace: Any = None  # serving_experts.FusedExpertsWorkspace beside the dispatch, else None
    sequence_parallel: bool = False  # vLLM's sequence-parallel MoE (serving_experts.sequence_parallel_moe)

    def __post_init__(self) -> None:
        freeze_fields(self, "rules")

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def device(self) -> ServingStage:
        return max(self.stages, key=lambda s: s.peak)

    @property
    def peak(self) -> int:
        return self.device.peak

    def words(self) -> str:
        parts = [f"tp {self.tp}" + (f" × dp {self.dp}" if self.dp > 1 else "")
                 + (f" with ep {self.ep}" if self.ep > 1 else "")] + ([f"pp {self.pp}"] if self.pp > 1 else [])
        return " × ".join(parts) + f" = {self.devices:,} GPU{'s' if self.devices > 1 else ''}"


@dataclass(frozen=True)
class PerGpuCorrection:
    """What the one-device answer's check found the analytic serving peak missing (traced − analytic at the asked
    point, memory/serving_check.py's two cuts), carried to each GPU: `bytes` is added to each GPU's peak."""

    one_device: int  # traced − analytic on one device at batch × seq (negative: the analytic peak is above)
    batch: int
    seq: int
    whole: bool = False  # measured by tracing the whole model (its difference on two cuts grew with depth)

    @property
    def bytes(self) -> int:
        return max(self.one_device, 0)

    def words(self) -> str:
        at = f"B={self.batch}, S={self.seq:,}"
        if self.one_device < 0:
            return (f"each GPU's peak is the analytic engine's, not lowered: on one device the analytic peak is "
                    f"{-self.one_device:,} B above the traced prefill at {at}, and how much of that a rank keeps was "
                    "not traced under tp")
        how = "the whole model traced" if self.whole else "traced on two cuts, the same on both"
        return (f"each GPU's peak adds the one-device correction whole, {self.one_device:,} B, and gives back the "
                "formula's own tp cut of the workspace (the one-device formula less the rank's), a bound: on one "
                f"device transformers' prefill at {at} keeps {self.one_device:,} B of working tensors the analytic "
                f"formula does not count ({how}), and that moment need not shrink with the widths the formula cuts "
                "(Qwen1.5-MoE's does not: a module shaped as its tp rank, heads, KV heads and shared expert / tp, "
                "traced, keeps the one device's workspace); under tp each tensor is cut or replicated, none larger "
                "on a rank than on one device, and a pipeline stage runs the same layers, so no GPU's workspace "
                "exceeds the one device's traced one, which each GPU's correction row makes up (not traced "
                "per layout); the fits move each GPU's curve by the correction (exact at the asked point only), the "
                "tp cut given back at each point")


def per_gpu_correction(one_device: int, batch: int, seq: int, whole: bool = False) -> PerGpuCorrection | None:
    """The one-device answer's correction (traced − analytic peak at batch × seq; 0: none) as each GPU takes it."""
    return PerGpuCorrection(one_device, batch, seq, whole) if one_device else None


@dataclass(frozen=True)
class TensorParallelSearch:
    """The smallest tensor-parallel degree whose GPUs each fit `accelerator` at the asked batch and context."""

    accelerator: Any  # hardware.Accelerator (a --budget is the one named "budget")
    pp: int
    batch: int
    seq: int
    tp: int | None  # None: no degree tried fits
    peak: int | None  # the per-GPU peak at that degree
    tried: tuple[tuple[int, int | None, str], ...]  # (tp, per-GPU peak or None, why refused or "")
    dp: int = 1  # the replicas: the asked --dp each degree was tried beside, or (dp_searched) the found layout's D
    expert_parallel: bool = False  # each degree T splits the experts over T × dp ranks
    dp_searched: bool = False  # a MoE model: T × D searched, `tried_dp` each try's D
    tried_dp: tuple[int, ...] = ()  # dp_searched: the replicas of each entry of `tried`, in order

    def order_words(self) -> str:
        """The order the search tried its layouts in, in words."""
        if not self.dp_searched:
            return "each tp dividing the heads, smallest first"
        return ("tp × dp by GPUs, fewer replicas first at equal GPUs, dp in powers of two"
                + (", ep = tp × dp" if self.expert_parallel else ", the experts cut over tp × dp"))


@dataclass(frozen=True)
class ServingParallel:
    """What `memory MODEL --tp T --pp P` (or --gpu) adds to the serving answer."""

    layout: ServingLayout | None  # None: no --tp/--pp (one GPU)
    smallest: TensorParallelSearch | None  # with --gpu or --budget


@dataclass(frozen=True)
class ServingInputs:
    """What the one-device serving answer (memory/serving.py) computed that each GPU's answer reuses."""

    report: Any
    view: Any
    fmt: Any  # quantization.WeightFormat
    quantized: frozenset[str]
    fp32: frozenset[str]
    inputs_first: frozenset[str]
    cache: Any  # the one-device KVCache (its layout, measured heads and convention), or None
    kv_dtype: str
    encoder_seq: int | None
    shape: dict  # prefill_workspace's keywords (dtype_size, vocab, layers, gated, every_token_logits, class_name)


def check_degrees(tp: int, pp: int, dp: int = 1) -> ParallelLayout:
    """The layout --tp, --pp and --dp describe (bounds and types checked, one line naming the flag)."""
    return layout_for(tp=tp, pp=pp, dp=dp)


def serving_placements(report: Any, view: Any, tp: int, dp: int = 1, ep: int = 1) -> tuple[Any, ...]:
    """Each parameter's placement on rank 0 as vLLM cuts it: every role but the routed experts by `rules.place` at
    tp (attention, dense and shared MLPs, embeddings and head; the heads and widths checked there); the routed
    experts as vLLM's MoE layers take them (FusedMoEParallelConfig.make): under expert parallelism (ep > 1) whole,
    their own TP size 1, so no width of theirs need divide anything (`expert_parallel` then splits them over ep);
    without it cut by their widths over tp × dp (flatten_tp_across_dp; FusedMoE asserts `intermediate_size %
    self.tp_size == 0` at that size, which rules.place's width check is). Under vLLM's sequence-parallel MoE
    (serving_experts.sequence_parallel_moe: DeepSeek under --ep with tp > 1 and dp > 1) the shared experts are
    whole on every rank (DeepseekV2MLP's `disable_tp=is_sequence_parallel`)."""
    from ..dims import text_config
    from .rules import model_shape, place
    from .serving_experts import sequence_parallel_moe

    classes = {sub.__class__.__name__ for _, sub in view.root.named_modules()} if view.root is not None else set()
    shape = model_shape(text_config(view.config), classes)
    experts = [p for p in report.params if p.role == "moe.experts"]
    placed = {p.name: p for p in place([p for p in report.params if p.role != "moe.experts"], shape, tp=tp, ep=1)}
    # the heads are attention's: the experts' own cut checks only their widths
    expert_shape = dataclasses.replace(shape, heads=None, kv_heads=None)
    whole = place(experts, expert_shape, tp=1, ep=1)
    if ep == 1 and dp > 1:  # the widths over tp × dp, named as such (rules.place would name a tp of that size)
        for p in whole:
            if p.tp_dim is not None and p.shape[p.tp_dim] % (tp * dp):
                raise OptionError("{0} {dp} with {1} {tp}: without {2}, vLLM's MoE layers cut the routed experts' "
                                  "widths over tp × dp = {ranks} ranks, which does not divide {size:,}, the {what} "
                                  "features of {name}", "dp", "tp", "ep", dp=dp, tp=tp, ranks=tp * dp,
                                  size=p.shape[p.tp_dim], what="output" if p.tp == "column" else "input",
                                  name=p.name)
    placed.update((p.name, p) for p in (whole if ep > 1 else place(experts, expert_shape, tp=tp * dp, ep=1)))
    if sequence_parallel_moe(view.class_name, tp, dp, ep):
        shared = [p for p in report.params if p.role == "moe.shared_experts"]
        placed.update((p.name, p) for p in place(shared, expert_shape, tp=1, ep=1))
    return tuple(placed[p.name] for p in report.params)


def serving_layout(inputs: ServingInputs, tp: int, pp: int, batch: int, seq: int,
                   split: tuple[int, ...] | None = None, *, missed: PerGpuCorrection | None = None,
                   ep: int = 1, dp: int = 1) -> tuple[ServingLayout, Callable[[int, int], int]]:
    """(each GPU's figures at `batch` × `seq`, the per-GPU peak at another batch and context). `split`: each
    stage's layer count, in order, where a server's own rule places them (vLLM's get_pp_indices); None: the
    training layouts' split (pipeline.stages). `missed`: the one-device answer's correction, added to each GPU.
    `ep`: 1, or tp × dp (vLLM's expert parallelism: serving_experts.py). `dp`: data-parallel replicas, each serving
    `batch` sequences of its own."""
    from ...count import ParameterInfo
    from ..dims import text_config
    from ..memory.prefill import prefill_workspace
    from ..memory.weights import weight_memory
    from .rules import rules_in_words

    layout = check_degrees(tp, pp, dp)
    report, view = inputs.report, inputs.view
    if ep not in (1, tp * dp):
        raise OptionError("{0} {ep}: vLLM's expert-parallel size is TP × DP = {tp} × {dp} = {size}", "ep", ep=ep,
                          tp=tp, dp=dp, size=tp * dp)
    placements = serving_placements(report, view, tp, dp, ep)
    experts_words = None
    notes: list[str] = []
    if ep > 1:
        from .serving_experts import expert_parallel, notes as expert_notes, rule_words, sequence_parallel_moe

        placements, experts, held_experts = expert_parallel(placements, ep, view.class_name)
        experts_words = rule_words(experts, ep)
        notes.extend(expert_notes(experts, ep, tp, held_experts, dp,
                                  sequence_parallel_moe(view.class_name, tp, dp, ep)))
    elif dp > 1 and any(p.role == "moe.experts" for p in placements):
        from .serving_experts import flattened_words

        experts_words = flattened_words(tp, dp)
    by_name = {p.name: p for p in placements}
    text = text_config(view.config)
    local = [ParameterInfo(p.name, by_name[p.name].local_shape, by_name[p.name].local_numel, p.trainable, p.role,
                           p.dtype) for p in report.params if by_name[p.name].local_numel or not p.numel]
    if pp > 1:
        stack, count = layer_stack_of([p.name for p in report.params])
        if pp > count:
            raise OptionError("{0} {pp} is more than the model's {layers} layers: each stage holds one or more", "pp",
                              pp=pp, layers=count)
        plan = stages(layout, count) if split is None else _stages_of(split, count)
        kinds = _cache_layers(text, inputs.cache)
        if kinds is not None and kinds != count:
            raise UnsupportedError("pipeline stages split {count} layers of {stack}, but the config's cache has "
                                   "{kinds}: the cache's layers cannot be assigned to stages", count=count,
                                   stack=stack, kinds=kinds)
    else:
        stack, count, plan = None, report.num_layers or 0, None
    tied = next((g.canonical for g in report.tied), None)
    components = [c.name for c in report.components]
    stage_rows: list[tuple[Any, Any, Any]] = []  # (stage or None, weights, layers held or None)
    for stage in (plan or (None,)):
        if stage is None:
            params, buffers, held = local, list(report.buffers), None
        else:
            held = stage.layers
            params = [p for p in local if _on_stage(p.name, p.role, stage, stack)]
            buffers = [b for b in report.buffers if _on_stage(b.name, "", stage, stack, buffer=True)]
            if stage.last and not stage.first and tied is not None and by_name[tied].role.startswith("embeddings"):
                copy = next(p for p in local if p.name == tied)
                params.append(dataclasses.replace(copy, name=copy.name + _COPY, role="head.lm"))
        copies = {p.name for p in params if p.name.endswith(_COPY)}
        quantized = inputs.quantized | (copies if tied in inputs.quantized else frozenset())
        weights = weight_memory(params, buffers, inputs.fmt, quantized=quantized, fp32=inputs.fp32,
                                components=components, inputs_first=inputs.inputs_first)
        stage_rows.append((stage, weights, held))

    def cache_of(held: Any, b: int, s: int) -> Any:
        if inputs.cache is None:
            return None
        from ..memory.kv import kv_cache

        c = inputs.cache
        return kv_cache(view.config, batch=b, seq=s, dtype=inputs.kv_dtype, layout=c.layout, heads=c.heads,
                        convention=c.convention, encoder_seq=inputs.encoder_seq, tp=tp, layers=held)

    caches = [cache_of(held, batch, seq) for _, _, held in stage_rows]

    experts_whole = False
    if ep > 1:
        from .serving_experts import workspace_experts_whole

        experts_whole = workspace_experts_whole(report.params, text, ep)

    def workspace_of(stage: Any, cache: Any, b: int, s: int) -> Any:
        last = stage is None or stage.last
        return prefill_workspace(view.config, tp=tp, batch=b, seq=s, last=last, experts_whole=experts_whole,
                                 cache_bytes=cache.at(b, s) if cache is not None else 0,
                                 window_extra=cache.prefill_extra(b, s) if cache is not None else 0, **inputs.shape)

    extra = missed.bytes if missed is not None else 0

    def uncut_of(stage: Any, cache: Any, b: int, s: int) -> int:
        """Where the one-device answer carries a traced correction: the formula's own tp cut of the workspace (the
        one-device formula less the rank's, at the rank's cache), given back. The traced moment the formula misses
        need not shrink with the widths the formula cuts (on Qwen1.5-MoE it does not: a rank-shaped module, heads
        and shared expert / tp, keeps the one device's workspace, its KV cache alone cut), so a bound carries the
        one device's whole workspace."""
        if missed is None or missed.one_device <= 0:
            return 0
        common = dict(batch=b, seq=s, last=stage is None or stage.last,
                      cache_bytes=cache.at(b, s) if cache is not None else 0,
                      window_extra=cache.prefill_extra(b, s) if cache is not None else 0, **inputs.shape)
        return max(0, prefill_workspace(view.config, **common).bytes - workspace_of(stage, cache, b, s).bytes)
    moe = any(p.role == "moe.experts" for p in placements)
    dispatch = fused = None
    sequence = False
    if moe:
        from .serving_experts import fused_experts_workspace, gathered_dispatch, sequence_parallel_moe

        sequence = sequence_parallel_moe(view.class_name, tp, dp, ep)
        dispatch = gathered_dispatch(text, dp, inputs.shape["dtype_size"], tp if sequence else 1)
        fused = fused_experts_workspace(dispatch, report.params, tp=tp, dp=dp, ep=ep)

    def gathered_of(weights: Any, b: int, s: int) -> int:  # on a stage that runs a MoE layer
        return dispatch.at(b, s) if dispatch is not None and weights.by_role.get("moe.experts") else 0

    def fused_of(weights: Any, b: int, s: int) -> int:  # likewise: vLLM's fused experts' workspace over them
        return fused.at(b, s) if fused is not None and weights.by_role.get("moe.experts") else 0

    rows = []
    for (stage, weights, held), cache in zip(stage_rows, caches):
        work = workspace_of(stage, cache, batch, seq)
        gathered = gathered_of(weights, batch, seq)
        experts_work = fused_of(weights, batch, seq)
        carried = extra + uncut_of(stage, cache, batch, seq)
        peak = (weights.bytes + weights.buffer_bytes + (cache.bytes if cache is not None else 0) + work.bytes
                + carried + gathered + experts_work)
        rows.append(ServingStage(stage.rank if stage else 0, (held[0], held[-1]) if held else None,
                                 len(held) if held is not None else count, stage is None or stage.first,
                                 stage is None or stage.last, weights, cache, work, peak, carried, gathered,
                                 experts_work))

    def peak_at(b: int, s: int) -> int:
        best = 0
        for (stage, weights, _), cache in zip(stage_rows, caches):
            kv = cache.at(b, s) if cache is not None else 0
            best = max(best, weights.bytes + weights.buffer_bytes + kv + workspace_of(stage, cache, b, s).bytes
                       + gathered_of(weights, b, s) + fused_of(weights, b, s) + uncut_of(stage, cache, b, s))
        return best + extra

    cut_experts = ep == 1 and moe
    if tp * (dp if cut_experts else 1) > 1:
        flat = f"tp × dp = {tp * dp} ranks (vLLM's flatten_tp_across_dp)" if dp > 1 else "the tp ranks"
        head = f"tensor parallel {tp}: each GPU holds rank 0's shards (the largest where a cut is uneven)"
        notes.append(f"{head}; routed experts are cut by their widths over {flat}, as their dense twins (vLLM's "
                     "default, without expert parallelism)" if cut_experts else head)
    if dp > 1:
        notes.append(_data_parallel_words(dp, batch, seq))
        if dispatch is not None:
            notes.append(dispatch.words(batch, seq))
        if fused is not None:
            notes.append(fused.words(batch, seq))
        if inputs.fmt.quantized:
            notes.append(f"{inputs.fmt.key}: a quantised weight's shard is the format applied to the rank's slice "
                         "(its packed values and its own scales and zero points, counted on the local shape), as "
                         "vLLM loads each rank's slice")
    if pp > 1:
        notes.append("pipeline stages: each stage holds its own layers' KV cache; buffers outside the layers (rotary "
                     "tables) are on every stage; the activations sent between stages (b·S·h) are not counted")
    if missed is not None:
        notes.append(missed.words())
    layout_words = _kv_heads_words(text, inputs.cache, tp)
    rules = rules_in_words(placements, layout)
    if experts_words is not None:
        rules["moe.experts"] = experts_words
    if sequence and "moe.shared_experts" in rules:
        from .serving_experts import SHARED_WHOLE

        rules["moe.shared_experts"] = SHARED_WHOLE
        notes.append(f"{SHARED_WHOLE}; tp {tp} × dp {dp} with ep turns vLLM's sequence-parallel MoE on "
                     "(ParallelConfig.use_sequence_parallel_moe), so each tp rank runs the shared experts on its own "
                     "⌈T / tp⌉ tokens; with one replica or tp 1 they are tensor parallel")
    result = ServingLayout(tp, pp, tuple(rows), rules, layout_words,
                           split_words(layout, count) if pp > 1 else "", _workspace_words(text, tp),
                           tuple(notes), missed, ep, dp, dispatch, fused, sequence)
    return result, peak_at


def _data_parallel_words(dp: int, batch: int, seq: int) -> str:
    return (f"data parallel {dp} (vLLM's --data-parallel-size): {dp} replicas, each its own engine and scheduler "
             f"serving its own requests; the convention here: --batch is each replica's, so each serves {batch:,} "
             f"× {seq:,} tokens ({dp * batch:,} sequences in all), and a GPU's KV cache and prefill workspace are "
             "its replica's; attention, dense MLPs, embeddings and the head are replicated per replica")


def smallest_tp(inputs: ServingInputs, accelerator: Any, reserve: int, *, pp: int, batch: int, seq: int,
                one_device_peak: int | None = None, missed: PerGpuCorrection | None = None,
                expert_parallel: bool = False, dp: int = 1) -> TensorParallelSearch:
    """The smallest layout whose GPUs each fit `accelerator` (peak + reserve within its memory) at `batch` ×
    `seq` (a replica's), under `pp` pipeline stages; the layouts tried, each with its peak or why it was refused.
    A dense model: the smallest T beside the `dp` replicas asked. A MoE model: the smallest T × D (the module
    docstring's order), the asked `dp` not held. `one_device_peak`: the one-device answer (tp 1, pp 1, dp 1), which
    may be the traced engine's, whose correction (`missed`) each other layout's GPUs take. `expert_parallel`: each
    layout of T × D > 1 GPUs splits the routed experts whole over its T × D ranks (vLLM's
    --enable-expert-parallel)."""
    from ..dims import dim, text_config

    heads = dim(text_config(inputs.view.config), "heads")
    degrees = [t for t in range(1, (heads or MAX_SEARCHED) + 1) if (heads % t == 0 if heads else t & (t - 1) == 0)]
    moe = any(p.role == "moe.experts" for p in inputs.report.params)
    if moe:
        widest = max(MAX_SEARCHED, degrees[-1])
        replicas = [1 << i for i in range(DP_SEARCHED.bit_length()) if 1 << i <= DP_SEARCHED]
        layouts = sorted(((t, d) for t in degrees for d in replicas if t * d <= widest),
                         key=lambda layout: (layout[0] * layout[1], layout[1]))
    else:
        layouts = [(t, dp) for t in degrees]
    capacity = accelerator.memory - reserve
    tried: list[tuple[int, int | None, str]] = []
    tried_dp: list[int] = []

    def answer(found: tuple[int, int] | None, peak: int | None) -> TensorParallelSearch:
        return TensorParallelSearch(accelerator, pp, batch, seq, found[0] if found else None, peak, tuple(tried),
                                    found[1] if found and moe else dp, expert_parallel, moe,
                                    tuple(tried_dp) if moe else ())

    for t, d in layouts:
        if t * pp * d > 1 << 16:
            break
        tried_dp.append(d)
        try:
            if t == 1 and pp == 1 and d == 1 and one_device_peak is not None:
                peak = one_device_peak
            else:
                peak = serving_layout(inputs, t, pp, batch, seq, missed=missed, dp=d,
                                      ep=t * d if expert_parallel and t * d > 1 else 1)[0].peak
        except ParamscopeError as error:
            tried.append((t, None, str(error)))
            continue
        tried.append((t, peak, ""))
        if peak <= capacity:
            return answer((t, d), peak)
    return answer(None, None)


def _stages_of(split: tuple[int, ...], count: int) -> tuple[Stage, ...]:
    """Stages holding `split` layers each, in order (a server's partition of the `count` layers)."""
    if sum(split) != count or min(split) < 1:
        raise OptionError("{0} {split} must give each stage one or more layers, {count} in all", "pp_layer_partition",
                          split=",".join(map(str, split)), count=count)
    starts = [sum(split[:r]) for r in range(len(split))]
    return tuple(Stage(r, tuple(range(starts[r], starts[r] + n)), (n,), r == 0, r == len(split) - 1, 1)
                 for r, n in enumerate(split))


def _on_stage(name: str, role: str, stage: Any, stack: str, buffer: bool = False) -> bool:
    index = layer_of(name, stack)
    if index is not None:
        return index in set(stage.layers)
    if buffer:
        return True  # rotary tables and the like: every stage runs layers that read them
    if role.startswith("embeddings"):
        return stage.first
    return stage.last


def _cache_layers(text: Any, cache: Any) -> int | None:
    if cache is None:
        return None
    from ..memory.kv import layer_kinds

    return len(layer_kinds(text))


def _kv_heads_words(text: Any, cache: Any, tp: int) -> str:
    from ..dims import is_mla
    from ..memory.kv import attention_shape, cached_heads, rank_heads

    if cache is None:
        return "no KV cache (the model does not generate)"
    if cache.layout == "latent" or is_mla(text) and cache.layout != "expanded":
        return (f"MLA's latent, whole on each of the {tp} ranks (replicated)" if tp > 1 else "MLA's latent")
    if cache.layout == "grouped":
        heads = attention_shape(text)[0]
    elif cache.layout == "expanded":
        from ..dims import config_int

        heads = config_int(text, "num_key_value_heads", "num_attention_heads") or 1
    else:
        heads = cache.heads or cached_heads(text)[0]
    if tp == 1:
        return f"{heads} K and V heads a layer"
    if tp <= heads:
        return f"{heads} K and V heads / tp {tp} = {rank_heads(heads, tp)} a rank"
    return (f"1 K and V head a rank: tp {tp} exceeds the {heads} KV heads, each replicated {tp // heads} times "
            "(each rank keeps the head its query heads read, as vLLM does)")


def _workspace_words(text: Any, tp: int) -> str:
    if tp == 1:
        return "the one-device prefill workspace's formula"
    return (f"the one-device formula on the rank's shard: the MLP's and attention's widths and heads / {tp}, the "
            "hidden size whole (residual stream and norms replicated), the last token's logits gathered (the whole "
            "vocabulary) on the last stage")


def not_for_serving(flag: str) -> OptionError:
    return OptionError(f"{flag} is for --training; serving across GPUs takes --tp, --pp, --dp and --ep")
