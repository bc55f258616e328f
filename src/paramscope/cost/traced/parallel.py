"""The traced engine for multi-GPU layouts: one rank's training step under FSDP2 and DTensor tensor parallelism.

    module (meta) → step.py's fake working copy → tensor parallel (torch's parallelize_module on the "tp" submesh,
    the rules read from transformers) → FSDP2 (fully_shard on each layer, then the root, on the "dp" submesh)
    → step.py's measured step (warm-up, then MemTracker phase by phase) → the TracedStep of `rank`

The GPUs are stood in for by torch's `fake` process group (torch.testing's FakeStore): a collective returns at
once and moves no data, but its outputs are allocated as on a GPU, so every tensor the rank holds, gathers, reduces
or saves has its real shape and lifetime, and MemTracker sorts its bytes into the same categories as a one-device
step. The mesh is (dp, tp) named ("dp", "tp") and built outside FakeTensorMode; tensor parallelism goes first, then
FSDP2, as torchtitan applies them. `settings.batch` is each data-parallel rank's micro-batch (the tp ranks of one
replica share it). Under context parallelism the mesh is torchtitan's (dp, cp, tp): FSDP2 over the flattened dp × cp
ranks (its dp_shard_cp), torch's ring attention over the cp submesh (context_parallel.py) on the heads the tp rank
holds, and the rank runs its S / cp tokens (split again over tp between the blocks under `sp`). Beside ep the
routed experts split over ep of the flattened dp × cp ranks, torchtitan's ep = dp_shard_in_ep × cp (without FSDP2
ep == dp × cp), and beside tp (without FSDP2) each rank's experts also cut over tp on the (ep, tp) mesh (its
ETP = tp); under FSDP2 (without tp) the mesh is torchtitan's (dp_shard_mod_ep, dp_shard_in_ep, cp, tp), the experts'
own unit over its dp_shard_mod_ep = dp × cp / ep ranks, the rest over all three flattened (dp_shard_cp).

The tensor-parallel rules and sequence parallel's plan are tensor_parallel.py's; where a model's layers and packed experts are, blocks.py's.
"""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ... import progress
from ...errors import OptionError, UnsupportedError
from .blocks import layer_lists, packed_experts_modules
from .context_parallel import ring_attention
from .expert_parallel import LOADED, ROUTING, check_experts, expert_parallel_style
from .step import (StepSettings, TracedStep, assumed_values, check_attention, fake_mode, measure_training, running,
                   training_copy)
from .tensor_parallel import apply_tensor_parallel, generic_name, replicate_the_rest

SHARDS = ("none", "fsdp")
MAX_RANKS = 65_536
# how a mixed precision runs under FSDP2: torch.autocast over the fp32 parameters, as on one device (the default), or
# FSDP2's own MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32) with no autocast, as torchtitan runs it
MIXED_PRECISIONS = ("autocast", "policy")


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    shard: str = "none"  # "none": DDP-like replication | "fsdp": FSDP2 over the dp ranks
    tp: int = 1
    sp: bool = False
    rank: int = 0
    ep: int = 1  # routed experts over the data-parallel ranks (expert_parallel.py); ep == dp (under FSDP2 ep | dp)
    cp: int = 1  # context parallel: the sequence over cp ranks, torch's ring attention (context_parallel.py)
    load: float = 1  # expert parallel's routing: rank 0, the busiest, receives load × its balanced pairs (1: balanced)
    mixed: str = "autocast"  # under FSDP2 and a mixed precision: "autocast" or "policy" (MIXED_PRECISIONS)
    # FSDP2's hybrid sharding (HSDP): the dp (× cp) shard group above replicated over this many groups, torchtitan's
    # dp_replicate in front of its mesh (1: full sharding)
    replicate: int = 1

    @property
    def world(self) -> int:
        return self.replicate * self.dp * self.tp * self.cp

    def describe(self) -> str:
        parts = ([f"dp_replicate {self.replicate} (HSDP: FSDP2's shards replicated)"] if self.replicate > 1 else []) + \
            [f"dp {self.dp}" + (" (FSDP2)" if self.shard == "fsdp" else "")]
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" with sequence parallel" if self.sp else ""))
        if self.cp > 1:
            parts.append(f"cp {self.cp}")
        ranks = "dp × cp" if self.cp > 1 else "dp"
        experts = (f", ep {self.ep} over the {ranks} ranks" if self.ep == self.dp * self.cp else
                   f", ep {self.ep} over each {self.ep} {ranks} ranks, the {ranks} / ep = "
                   f"{self.dp * self.cp // self.ep} holding the same experts sharding them (FSDP2)")
        return " × ".join(parts) + (experts if self.ep > 1 else "") + (
            f", rank 0 receiving {self.load:g}× its balanced token-expert pairs" if self.load != 1 else "") + (
            ", FSDP2's MixedPrecisionPolicy" if self.mixed == "policy" else "")


def with_mixed_precision(layout: tuple, mixed: str) -> tuple:
    """A layout tuple (dp, shard, tp, sp[, rank, ep, cp, load]) as StepSettings.layout holds it, with `mixed` in its
    9th place where it is the policy (the entries between at Layout's defaults); autocast, the default, leaves it as
    it was, so the keys of recipes traced before the policy existed stay what they were."""
    if mixed == "autocast":
        return layout
    defaults = (1, "none", 1, False, 0, 1, 1, 1)
    return tuple(layout) + defaults[len(layout):] + (mixed,)


def trace_parallel_training(module: Any, settings: StepSettings, *, dp: int = 1, shard: str = "none", tp: int = 1,
                            sp: bool = False, rank: int = 0, ep: int = 1, cp: int = 1, load: float = 1,
                            mixed: str = "autocast", replicate: int = 1) -> TracedStep:
    """One steady training step of `rank` in a (dp × tp) layout, measured as trace_training measures one device.

    `module` is a meta-built transformers model; it is not modified. `settings.batch` is each data-parallel rank's
    micro-batch. Rank r sits at (r // tp, r % tp) of the ("dp", "tp") mesh; ranks differ only where a width does
    not divide (a vocabulary over tp, dim 0 over dp: the last ranks hold fewer rows, FSDP2 pads them alike). `ep`:
    the routed experts split over the dp ranks as torchtitan's ExpertParallel splits them (expert_parallel.py,
    balanced routing); it takes every dp rank (ep == dp), or under FSDP2 ep ranks dividing dp (torchtitan's
    (dp / ep, ep, tp) mesh, the experts' own FSDP2 unit over dp / ep); beside tp each rank's experts are
    also cut over tp (the (ep, tp) mesh, torchtitan's ExpertTensorParallel). `cp`: the sequence split over cp ranks by
    torch's context_parallel (context_parallel.py), `settings.seq` the whole sequence, the rank running its S / cp
    tokens; beside tp and dp as torchtitan lays them out: a (dp, cp, tp) mesh, the ring over cp on the rank's local
    heads, FSDP2 over the flattened (dp, cp) ranks (its dp_shard_cp); beside ep the experts split over ep of those
    dp × cp ranks (torchtitan's ep = dp_shard_in_ep × cp: ep == dp × cp without FSDP2; under FSDP2 ep dividing
    dp × cp, the experts' own FSDP2 unit over its dp_shard_mod_ep = dp × cp / ep ranks holding the same experts),
    beside tp without FSDP2 also cut over tp (the (ep, tp) mesh). `load`: under ep, rank 0 the
    busiest, receiving load × its balanced pairs (expert_parallel.py). `mixed` "policy": under FSDP2 and a mixed
    precision, fully_shard's MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32) and no autocast
    (torchtitan's); "autocast": torch.autocast over the fp32 parameters, as on one device. `replicate` > 1 (under
    FSDP2): hybrid sharding, torchtitan's dp_replicate in front of the mesh: every fully_shard unit on the
    (dp_replicate, its shard ranks) mesh, the experts' on (dp_replicate, dp_shard_mod_ep); the rank is rank 0 of
    the first shard group."""
    layout = check_layout(dp, shard, tp, sp, rank, ep, cp, load, mixed, replicate)
    with progress.status(f"tracing one training step of {type(module).__name__} on rank {rank} of "
                         f"{layout.describe()} (fake process group, MemTracker)"):
        with parallel_copy(module, settings, layout) as (model, notes, assumed):
            step = measure_training(model, dataclasses.replace(rank_tokens(settings, layout), grad_checkpointing=False),
                                    fake=False)
            notes.extend(assumed.notes())
    return dataclasses.replace(step, notes=tuple(notes) + step.notes)


def rank_tokens(settings: StepSettings, layout: Layout) -> StepSettings:
    """The settings the rank's step runs: under context parallelism its S / cp tokens, else the settings."""
    return dataclasses.replace(settings, seq=settings.seq // layout.cp) if layout.cp > 1 else settings


def check_layout(dp: Any, shard: Any, tp: Any, sp: Any, rank: Any, ep: Any = 1, cp: Any = 1, load: Any = 1,
                 mixed: Any = "autocast", replicate: Any = 1) -> Layout:
    """The layout, or one line naming the value that does not fit."""
    for name, value in (("dp", dp), ("tp", tp), ("ep", ep), ("cp", cp), ("replicate", replicate)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RANKS:
            raise OptionError("{0} must be an integer between 1 and {most:,}, got {value!r}", name, most=MAX_RANKS,
                              value=value)
    if shard not in SHARDS:
        raise OptionError("unknown {0} {value!r}; use one of {choices}", "shard", value=str(shard)[:40],
                          choices=", ".join(SHARDS))
    if not isinstance(sp, bool):
        raise OptionError("{0} must be True or False, got {value!r}", "sp", value=sp)
    if sp and tp == 1:
        raise OptionError("{0} splits the sequence over the tensor-parallel ranks: it needs tp > 1, got tp 1", "sp")
    if replicate > 1 and shard != "fsdp":
        raise OptionError("{0} {value} replicates FSDP2's shard groups (hybrid sharding): it needs shard 'fsdp', got "
                          "{shard!r}", "replicate", value=replicate, shard=shard)
    ranks = ("replicate × " if replicate > 1 else "") + "dp × tp" + (" × cp" if cp > 1 else "")
    world = replicate * dp * tp * cp
    if world > MAX_RANKS:
        raise OptionError("{ranks} must be at most {most:,}, got {value:,}", ranks=ranks, most=MAX_RANKS,
                          value=world)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
        raise OptionError("{0} must be an integer between 0 and {last} ({ranks} - 1), got {value!r}", "rank",
                          last=world - 1, ranks=ranks, value=rank)
    if cp > 1 and ep > 1:  # torchtitan's ep = dp_shard_in_ep × cp (ETP = tp); under FSDP2 its dp_shard_mod_ep
        # = dp × cp / ep shards each rank's experts further (DDP's replicas beyond ep run the same step: dp = ep / cp)
        if ep % cp or (dp * cp % ep if shard == "fsdp" else ep != dp * cp) or tp > 1 and shard == "fsdp":
            raise UnsupportedError(f"context parallel is traced beside ep over dp × cp ranks (torchtitan's "
                                   f"dp_shard_in_ep × cp: cp dividing ep, ep == dp × cp, or under FSDP2 ep dividing "
                                   f"dp × cp), beside tp without FSDP2; got cp {cp}, ep {ep}, dp {dp}, tp {tp}, "
                                   f"shard {shard}")
    elif ep > 1 and (dp % ep if shard == "fsdp" else ep != dp):
        raise UnsupportedError(f"expert parallel is traced over every data-parallel rank (ep == dp), or under FSDP2 "
                               f"over ep ranks dividing dp (torchtitan's dp_shard_in_ep, its dp_shard_mod_ep = dp / ep "
                               f"sharding the experts further); got ep {ep}, dp {dp}, tp {tp}, shard {shard}")
    if isinstance(load, bool) or not isinstance(load, (int, float)) or not 1 <= load <= ep:
        raise OptionError("{0} (the busiest expert-parallel rank's pairs over its balanced share) must be from 1 to "
                          "ep {ep}, got {value!r}", "load", ep=ep, value=str(load)[:40])
    if load != 1 and rank != 0:
        raise UnsupportedError(f"an uneven expert load is traced on rank 0, the busiest; got rank {rank}")
    if mixed not in MIXED_PRECISIONS:
        raise OptionError("unknown {0} {value!r}; use one of {choices}", "fsdp_mixed_precision",
                          value=str(mixed)[:40], choices=", ".join(MIXED_PRECISIONS))
    if mixed == "policy" and shard != "fsdp":
        raise OptionError("{0} policy is FSDP2's MixedPrecisionPolicy: it needs shard 'fsdp', got {shard!r}",
                          "fsdp_mixed_precision", shard=shard)
    return Layout(dp, shard, tp, sp, rank, ep, cp, load, mixed, replicate)


@contextmanager
def parallel_copy(module: Any, settings: StepSettings, layout: Layout) -> Iterator[tuple[Any, list[str], Any]]:
    """(the fake working copy with the layout applied, the notes naming what was applied, the assumed-values
    counter), inside a fake process group of the layout's ranks and FakeTensorMode; the group is destroyed after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    check_attention(settings.attention)
    if dist.is_initialized():
        raise UnsupportedError("a torch process group is already initialised in this process; the parallel trace "
                               "runs on a fake one of its own")
    if layout.cp > 1 and settings.seq % layout.cp:
        raise OptionError("context parallel splits the sequence over the cp ranks: cp {cp} does not divide {0} "
                          "{seq:,}", "seq", cp=layout.cp, seq=settings.seq)
    if layout.sp and settings.seq // layout.cp % layout.tp:  # the rank's S / cp tokens under context parallel
        raise OptionError("sequence parallel splits the sequence over the tp ranks: tp {tp} does not divide {0} "
                          "{seq:,}" + (" / cp {cp}" if layout.cp > 1 else ""), "seq", tp=layout.tp,
                          seq=settings.seq, cp=layout.cp)
    if layout.shard == "fsdp" and (settings.frozen or any(not p.requires_grad for p in module.parameters())):
        raise UnsupportedError("frozen parameters under FSDP2 are not traced: MemTracker hooks the gradient of "
                               "every parameter FSDP2 gathers for a forward, and torch refuses a hook on a frozen one")
    if layout.mixed == "policy" and not settings.precision.endswith("-mixed"):
        raise OptionError("{0} policy casts fp32 parameters to 16 bits as FSDP2 gathers them: it needs a mixed "
                          "precision (bf16-mixed, fp16-mixed), got {precision}", "fsdp_mixed_precision",
                          precision=settings.precision)
    dist.init_process_group("fake", rank=layout.rank, world_size=layout.world, store=FakeStore())
    _clear_sharding_caches()
    try:
        with _mesh_tables_real(), _propagation_unseen():
            # the mesh and its submeshes are made outside FakeTensorMode (their rank tables are real tensors)
            def grid(dims: tuple[int, ...], names: tuple[str, ...]) -> Any:
                # hybrid sharding: torchtitan's dp_replicate in front of every other dimension
                replicas = layout.replicate > 1
                return init_device_mesh("cpu", (layout.replicate,) * replicas + dims,
                                        mesh_dim_names=("dp_replicate",) * replicas + names)

            ring_mesh = None
            ep_mesh = None  # the experts' ranks where they are not the dp ranks (or dp × cp)
            if layout.cp > 1:  # torchtitan's mesh: (dp, cp, tp); FSDP2 over the flattened (dp, cp), the ring over cp
                # beside ep, torchtitan's (dp_shard_mod_ep, dp_shard_in_ep, cp, tp) mesh (ETP = tp): the experts split
                # over the flattened (dp_shard_in_ep, cp) ranks, ep = dp_shard_in_ep × cp; under FSDP2 their own unit
                # over the dp_shard_mod_ep = dp × cp / ep ranks holding the same experts, the rest over all dp × cp
                # (its dp_shard_cp, the three flattened); without FSDP2 ep == dp × cp, the flattened (dp, cp)
                experts_fsdp = layout.ep > 1 and layout.shard == "fsdp"
                if experts_fsdp:
                    mesh = grid((layout.dp * layout.cp // layout.ep, layout.ep // layout.cp, layout.cp, layout.tp),
                                ("dp_mod_ep", "dp_in_ep", "cp", "tp"))
                    dp_mesh, tp_mesh, experts_mesh, ring_mesh = (
                        mesh["dp_mod_ep", "dp_in_ep", "cp"]._flatten("dp_shard_cp"), mesh["tp"], mesh["dp_mod_ep"],
                        mesh["cp"])
                    ep_mesh = mesh["dp_in_ep", "cp"]._flatten("ep")
                else:
                    mesh = grid((layout.dp, layout.cp, layout.tp), ("dp", "cp", "tp"))
                    dp_mesh, tp_mesh, experts_mesh, ring_mesh = (
                        mesh["dp", "cp"]._flatten("dp_shard_cp") if layout.shard == "fsdp" or layout.ep > 1 else
                        mesh["dp"], mesh["tp"], None, mesh["cp"])
            elif layout.ep > 1 and layout.shard == "fsdp":
                # expert parallel under FSDP2, laid out as torchtitan lays it out (ETP = tp): the (dp / ep, ep, tp)
                # mesh (its dp_shard_mod_ep, dp_shard_in_ep, tp), the experts split over the ep ranks of a row, then
                # their own FSDP2 unit over the dp / ep ranks holding the same experts, the rest over all dp ranks
                mesh = grid((layout.dp // layout.ep, layout.ep, layout.tp), ("dp_mod_ep", "dp_in_ep", "tp"))
                dp_mesh, tp_mesh, experts_mesh, ep_mesh = (mesh["dp_mod_ep", "dp_in_ep"]._flatten("dp"), mesh["tp"],
                                                           mesh["dp_mod_ep"], mesh["dp_in_ep"])
            else:
                mesh = grid((layout.dp, layout.tp), ("dp", "tp"))
                dp_mesh, tp_mesh, experts_mesh = mesh["dp"], mesh["tp"], None
            if layout.replicate > 1:  # HSDP: each unit's mesh (dp_replicate, its shard ranks), as torchtitan's
                # (dp_replicate, dp_shard_cp) and, for the experts, (dp_replicate, dp_shard_mod_ep); torch warns that
                # slicing a flattened dimension from the root will change in a later release: torchtitan's slicing
                # today, kept out of the user's output
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
                    dp_mesh = mesh["dp_replicate", dp_mesh.mesh_dim_names[0]]
                if experts_mesh is not None:
                    experts_mesh = mesh["dp_replicate", "dp_mod_ep"]
            with fake_mode(True) as mode, assumed_values(True) as assumed:
                model = training_copy(module, mode, settings)
                notes = [f"rank {layout.rank} of {layout.world} ({layout.describe()}) on a fake process group: "
                         "collectives move no data but allocate their outputs, so every tensor the rank holds is "
                         f"counted; batch {settings.batch} is each data-parallel rank's micro-batch"]
                with running(model):
                    if layout.tp > 1:
                        notes += apply_tensor_parallel(model, tp_mesh, layout.tp, layout.sp,
                                                       fsdp=layout.shard == "fsdp")
                    if layout.ep > 1:
                        notes += apply_expert_parallel(model, dp_mesh if ep_mesh is None else ep_mesh,
                                                       replicate_rest=experts_mesh is None, load=layout.load)
                    if layout.shard == "fsdp":
                        notes += apply_fsdp(model, dp_mesh, settings, experts_mesh, mixed=layout.mixed)
                        if layout.replicate > 1:
                            notes.append(_hybrid_note(layout))
                    elif layout.dp > 1:
                        notes.append(_replication_note(model, layout.dp))
                if ring_mesh is None:
                    yield model, notes, assumed
                    return
                with ring_attention(ring_mesh, settings.seq) as ring:
                    notes += [f"{settings.seq // layout.cp:,} of the {settings.seq:,} tokens on the rank", ring]
                    yield model, notes, assumed
    finally:
        dist.destroy_process_group()


def _clear_sharding_caches() -> None:
    """Forget what DTensor's sharding propagation cached for an earlier trace in this process: its caches key an op
    by its tensors' specs and not by every other argument, so a second model whose router takes another top-k
    (topk's k) was handed the first's output shape ([T, 1] for [T, 2]) and failed in its backward."""
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:  # a torch without it has no such cache to clear
        return
    _clear_sharding_prop_cache()


@contextmanager
def _propagation_unseen() -> Iterator[None]:
    """DTensor's sharding propagation, on an op with shardings it has not cached, runs the op on fake arguments of
    the global shapes to read its output's shape and stride (ShardingPropagator._propagate_tensor_meta_non_cached:
    "in fake tensor mode so that it avoids materializing memory"): nothing a device allocates. Inside the trace's
    FakeTensorMode the dispatch modes above it (MemTracker, the allocation recorder) would count those arguments as
    the rank's memory, at each op's first call with its shardings (a pipeline stage's first forward, a later
    backward's first gradient accumulation: a stage of a Mixtral cut under ep 2 held the embedding's whole weight
    for its lookup, 8,192,000 B at a 32,000 vocabulary): the propagation runs with those modes set aside, in a fake
    mode of its own."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def unseen(self: Any, op_schema: Any) -> Any:
        with _disable_current_modes():
            return original(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = unseen
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextmanager
def _mesh_tables_real() -> Iterator[None]:
    """A device mesh keeps its rank table in a real tensor and computes on it when made or asked for it (FSDP2
    joins the dp and tp meshes inside its init): let those computations out of FakeTensorMode and the other
    dispatch modes (assumed_values would answer its nonzero)."""
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.distributed.device_mesh import DeviceMesh

    original_init, original_mesh = DeviceMesh.__init__, DeviceMesh.__dict__["mesh"]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        with _disable_current_modes():
            original_init(self, *args, **kwargs)

    def mesh(self: Any) -> Any:
        with _disable_current_modes():
            return original_mesh.fget(self)

    DeviceMesh.__init__, DeviceMesh.mesh = init, property(mesh)
    try:
        yield
    finally:
        DeviceMesh.__init__, DeviceMesh.mesh = original_init, original_mesh


# --- expert parallel -----------------------------------------------------------------------------------------------

def apply_expert_parallel(model: Any, mesh: Any, replicate_rest: bool = True, load: float = 1) -> list[str]:
    """Each layer's packed experts split over the ep ranks with torchtitan's dispatch and combine (expert_parallel.py);
    the router, a shared expert and everything else whole on every rank (`replicate_rest`: as Replicate DTensors;
    FSDP2 makes them its own DTensors instead)."""
    from torch.distributed.tensor.parallel import parallelize_module

    ep = mesh.size()
    found = packed_experts_modules(model)
    if not found:
        raise UnsupportedError(f"expert parallel over {type(model).__name__}: it has no packed experts module "
                               "(X.experts with gate_up_proj and down_proj)")
    modules = dict(model.named_modules())
    for name in found:
        check_experts(modules[name], name, ep)
    experts = modules[found[0]].gate_up_proj.shape[0]
    # already cut over tp (apply_tensor_parallel): each rank's E/ep experts of its tp shard, on the (ep, tp) mesh
    beside_tp = type(modules[found[0]].gate_up_proj).__name__ == "DTensor"
    parallelize_module(model, mesh, {name: expert_parallel_style(load) for name in found})
    if replicate_rest:
        replicate_the_rest(model, mesh)  # one optimizer steps the experts' DTensor shards beside the rest (as under tp)
    return [f"expert parallel over {ep} ranks, as torchtitan's ExpertParallel: {generic_name(found[0])} gate_up_proj and "
            f"down_proj Shard(0) ({experts // ep} of the {experts} experts a rank), the token-expert pairs sent to "
            "their experts' rank and back by two all-to-alls, put in expert-major order there and back (permute, "
            "unpermute); "
            + ("each expert's tp shard kept (gate_up_proj [Shard(0), Shard(1)], down_proj [Shard(0), Shard(2)] on the "
               "(ep, tp) mesh, torchtitan's ExpertTensorParallel), every tp rank dispatching the same pairs; the rest "
               "as tensor parallel cuts it; " if beside_tp else "the router and the rest whole on every rank; ")
            + (ROUTING if load == 1 else LOADED.format(load=load))]


# --- FSDP2 ------------------------------------------------------------------------------------------------------


def apply_fsdp(model: Any, mesh: Any, settings: StepSettings, experts_mesh: Any = None,
               mixed: str = "autocast") -> list[str]:
    """FSDP2 as torchtitan and accelerate apply it: fully_shard on each layer, then on the root, with the default
    reshard_after_forward (a layer frees its gathered parameters after its forward; the root keeps its own).
    `experts_mesh` (expert parallel): each layer's experts, already split over the ep ranks, first get a unit of
    their own over that mesh, as torchtitan's apply_fsdp does (its dp_shard_mod_ep mesh); where that mesh has more
    ranks than a rank's experts (dp_shard_mod_ep × ep > E; under HSDP its shard dimension, not the replicas), on
    their dim 1 as torchtitan shards them (dim 0 would leave ranks holding padding). `mixed` "policy" (a mixed precision): every unit gets torchtitan's
    MixedPrecisionPolicy (param_dtype the 16-bit type, reduce_dtype fp32) and the model's forward runs with autocast
    off (policy_without_autocast)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    options = {"mp_policy": mixed_precision_policy(settings.precision)} if mixed == "policy" else {}
    experts = packed_experts_modules(model) if experts_mesh is not None else []
    modules = dict(model.named_modules())
    on_dim_1 = False
    for name in experts:
        # the shard dimension's ranks alone (under HSDP not the replicas: torchtitan's apply_fsdp compares
        # edp_mesh["efsdp"].size() × ep with the experts)
        on_dim_1 = experts_mesh.size(experts_mesh.ndim - 1) > _local(modules[name].gate_up_proj).shape[0]
        fully_shard(modules[name], mesh=experts_mesh, shard_placement_fn=(lambda _: Shard(1)) if on_dim_1 else None,
                    **options)
    lists, how = layer_lists(model)
    for _, blocks in lists:
        for block in blocks:
            fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    if options:
        policy_without_autocast(model)
    where = ", ".join(f"{len(blocks)} {type(blocks[0]).__name__} of {name}" for name, blocks in lists)
    half = "bf16" if settings.precision.startswith("bf16") else "fp16"
    return [f"FSDP2 over {mesh.size()} rank{'s' if mesh.size() > 1 else ''}: fully_shard on each of the {where} "
            f"(found by {how}), then on the root (what is left: embeddings, final norm, head), reshard_after_forward "
            "as torch defaults it (layers free their gathered parameters after the forward, the root keeps its "
            "own); each parameter's dim 0 is split in ceil(dim0 / dp) rows, padded"
            + ((f"; mixed precision is FSDP2's MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32), "
                "torchtitan's: the fp32 shards gathered as " + half + " parameters, no autocast (no per-op cast "
                "copies), the " + half + " gradients reduce-scattered in fp32 into fp32 sharded gradients"
                if mixed == "policy" else "; mixed precision is torch.autocast over the parameters' own dtype, as "
                "on one device (no MixedPrecisionPolicy)") if settings.precision.endswith("-mixed") else "")
            + (f"; each layer's experts (already split over the ep ranks) a unit of their own first, over the "
               f"{experts_mesh.size()} rank{'s' if experts_mesh.size() > 1 else ''} holding the same experts "
               "(torchtitan's dp_shard_mod_ep), gathered while their layer runs"
               + (", cut on dim 1 (more ranks than the rank's experts, as torchtitan cuts them)" if on_dim_1 else "")
               if experts else "")]


def mixed_precision_policy(precision: str) -> Any:
    """torchtitan's MixedPrecisionPolicy for a mixed precision: parameters gathered in its 16-bit type, gradients
    reduced in fp32 (its defaults, mixed_precision_param bfloat16 and mixed_precision_reduce float32)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    half = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)


def policy_without_autocast(model: Any) -> None:
    """The model's forward with torch.autocast off: the traced step (step.py, timeline.py) enters autocast around
    the forward for a mixed precision; under FSDP2's policy torchtitan enters none (maybe_enable_amp: "Mixed precision
    training is handled by fully_shard"), so the model's ops see the 16-bit parameters FSDP2 gathered and nothing
    casts them again."""
    import functools

    import torch

    forward = model.forward

    @functools.wraps(forward)
    def without_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            return forward(*args, **kwargs)

    model.forward = without_autocast


def _hybrid_note(layout: Layout) -> str:
    group = layout.dp * layout.cp
    return (f"hybrid sharding (HSDP, torchtitan's dp_replicate {layout.replicate} in front of its mesh): each FSDP2 "
            f"unit on a 2-D (dp_replicate, shard) mesh, its parameters sharded over the {group} ranks of a shard "
            f"group and replicated over the {layout.replicate} groups (the sizes above are the mesh's, both "
            "dimensions); a unit's reduce-scattered gradient is all-reduced over dp_replicate in place"
            + (f"; the experts' unit on (dp_replicate, dp_shard_mod_ep), sharded over {group // layout.ep}"
               if layout.ep > 1 else ""))


def _replication_note(model: Any, dp: int) -> str:
    grads = sum(_local(p).numel() * _local(p).element_size() for p in model.parameters() if p.requires_grad)
    return (f"shard 'none': each of the {dp} data-parallel ranks holds the whole model states, as DDP does; the step "
            "traced is one rank's without DDP's wrapper, whose reducer (C++) does not run on fake tensors: it also "
            f"keeps gradient buckets, one more copy of the trainable gradients ({grads:,} B), unless "
            "gradient_as_bucket_view=True")


def _local(tensor: Any) -> Any:
    return getattr(tensor, "_local_tensor", tensor)
