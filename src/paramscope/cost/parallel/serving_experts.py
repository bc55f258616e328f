"""Expert parallelism when serving (`memory MODEL --tp T --ep`): vLLM's `--enable-expert-parallel`.

vLLM (model_executor/layers/fused_moe: FusedMoEParallelConfig.make, determine_expert_map): with expert parallelism
the MoE layers' EP group is the tp × dp ranks (EP size = TP × DP: `--tp T --dp D --ep`, the ranks flattened as
ep_rank = dp_rank × T + tp_rank, so EP rank 0 is replica 0's tp rank 0) and the experts are not cut within (the MoE's
own tensor-parallel size becomes 1, so no expert width need divide T): each rank holds whole experts, ⌊E / ep⌋ of
them, the first E mod ep ranks one more ("linear" placement: rank r holds a contiguous run; determine_expert_map
asserts nothing of E against ep, so where E < ep the ranks past E hold none). Attention, shared experts, embeddings
and the head stay tensor parallel within each replica (their layers are vLLM's ordinary parallel linears); the
router is replicated. So on rank 0 (which holds the most experts where the split is uneven):

    packed experts [E, …] (transformers' fused tensors, a bias [E, out] included) → [n0, …], every other dim whole
    per-expert modules (experts.<i>.…)                                         → the rank's own, whole; the rest 0

Under data parallelism (`--dp D`, with or without --ep) each MoE layer runs every replica's tokens. vLLM's default
all2all backend (ParallelConfig.all2all_backend = "allgather_reducescatter"; without --ep vLLM falls back to the same
"AllGather+ReduceScatter dispatch/combine", all2all_utils.maybe_make_prepare_finalize) prepares each MoE layer with
MoEPrepareAndFinalizeNaiveDPEPModular.prepare, whose AgRsAll2AllManager.dispatch all_gatherv's, over the DP group,
three tensors of each replica's tokens (hidden states in the compute dtype, fused_topk's top-k weights in fp32 and
ids in int32); they live from the dispatch to the combine's reduce-scatter, through the experts (GatheredDispatch).
The fused experts then run over those gathered tokens: FusedMoEModularKernel (modular_kernel.py) sizes TritonExperts'
intermediate caches by the gathered M, chunked by VLLM_FUSED_MOE_CHUNK_SIZE (16,384 by default, envs.py), in
vLLM's WorkspaceManager (v1/worker/workspace.py): one buffer a worker, grown to the largest request and kept, so it
sits beside every moment of the forward (FusedExpertsWorkspace).

vLLM's sequence-parallel MoE (ParallelConfig.use_sequence_parallel_moe, config/parallel.py: the allgather_reducescatter
backend, expert parallel, tp > 1 and dp > 1), in the models whose MoE block reads it (deepseek_v2.py's DeepseekV2MoE,
DeepSeek-V2 and V3): each tp rank takes its own ⌈T / tp⌉ of the replica's T tokens (sequence_parallel_chunk pads T to
a multiple of tp) into the MoE layer, so the dispatch gathers tp × ⌈T / tp⌉ tokens a replica over the EP group; and
the shared experts are built with `disable_tp=is_sequence_parallel` (DeepseekV2MLP's MergedColumnParallelLinear and
RowParallelLinear), so they are whole on every rank. Without it (one replica, or tp 1) they are tensor parallel.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError

_EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_GATE = re.compile(r"(?:^|\.)(?:gate_proj|gate_up_proj|w1|w3)(?:\.|$)")  # a routed expert's gate projection
# vLLM's envs.VLLM_FUSED_MOE_CHUNK_SIZE default (envs.py: int(os.getenv("VLLM_FUSED_MOE_CHUNK_SIZE", str(16 * 1024))))
FUSED_MOE_CHUNK_SIZE = 16 * 1024
# WorkspaceManager.get_simultaneous rounds each tensor of a request up to 256 bytes (round_up(actual, 256))
_ALIGN = 256
# the model classes whose vLLM MoE block reads ParallelConfig.use_sequence_parallel_moe (deepseek_v2.py's
# DeepseekV2MoE: `self.is_sequence_parallel = parallel_config.use_sequence_parallel_moe`, serving DeepSeek-V2 and V3)
SEQUENCE_PARALLEL_MOE = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})

SHARED_WHOLE = ("replicated: whole on every rank (vLLM's sequence-parallel MoE: DeepseekV2MLP(disable_tp="
                "is_sequence_parallel), deepseek_v2.py)")


def sequence_parallel_moe(class_name: str, tp: int, dp: int, ep: int) -> bool:
    """Whether vLLM runs this model's MoE layers sequence parallel: ParallelConfig.use_sequence_parallel_moe (the
    default all2all backend allgather_reducescatter, --enable-expert-parallel, tp > 1, dp > 1) in a model class that
    reads it (SEQUENCE_PARALLEL_MOE)."""
    return ep > 1 and tp > 1 and dp > 1 and class_name in SEQUENCE_PARALLEL_MOE


def expert_ranges(experts: int, ep: int) -> tuple[tuple[int, int], ...]:
    """Each rank's experts as [start, stop), vLLM's linear placement: ⌊E / ep⌋ each, the first E mod ep one more."""
    base, extra = divmod(experts, ep)
    ranges, start = [], 0
    for rank in range(ep):
        count = base + (1 if rank < extra else 0)
        ranges.append((start, start + count))
        start += count
    return tuple(ranges)


def experts_of(placements: Any) -> int:
    """The routed experts a layer holds (E), from the packed tensors' first dimension or the per-expert modules'
    indices; 0 where the model has none."""
    packed = {p.shape[0] for p in placements if p.role == "moe.experts" and not _EXPERT_INDEX.search(p.name)
              and len(p.shape) >= 2}
    indices = {int(m.group(1)) for p in placements if p.role == "moe.experts"
               for m in [_EXPERT_INDEX.search(p.name)] if m}
    counts = packed | ({max(indices) + 1} if indices else set())
    if len(counts) > 1:
        raise OptionError("{0}: the routed experts' tensors disagree on the number of experts ({counts})", "ep",
                          counts=", ".join(map(str, sorted(counts))))
    return counts.pop() if counts else 0


def expert_parallel(placements: Any, ep: int, model: str) -> tuple[Any, int, tuple[int, int]]:
    """(rank 0's placements with the routed experts split whole over `ep` ranks, E, rank 0's [start, stop))."""
    experts = experts_of(placements)
    if experts == 0:
        raise OptionError("{0} splits routed experts over the ranks, and {model} has none", "ep", model=model)
    start, stop = expert_ranges(experts, ep)[0]
    placed = []
    for p in placements:
        if p.role != "moe.experts":
            placed.append(p)
            continue
        match = _EXPERT_INDEX.search(p.name)
        if match:  # a per-expert module's tensor: on rank 0 whole, or not at all
            held = start <= int(match.group(1)) < stop
            local = tuple(p.shape) if held else tuple(0 for _ in p.shape)
        else:
            local = (stop - start, *p.shape[1:])
        placed.append(dataclasses.replace(p, local_shape=local, tp="replicated", tp_dim=None, experts_split=True))
    return tuple(placed), experts, (start, stop)


def expert_widths(params: Any, hidden: int) -> frozenset[int]:
    """The routed experts' own widths beside the hidden size, read off their tensors: a projection's other dim where
    one of its last two is `hidden` (packed [E, 2i, h] and [E, h, i], per-expert [i, h] and [h, i], either
    orientation), so the fused gate-up's 2i and the down projection's i."""
    widths = set()
    for p in params:
        if p.role != "moe.experts" or len(p.shape) < 2:
            continue
        out, inputs = p.shape[-2], p.shape[-1]
        if inputs == hidden and out != hidden:
            widths.add(out)
        elif out == hidden:
            widths.add(inputs)
    return frozenset(widths)


def workspace_experts_whole(params: Any, text: Any, ep: int) -> bool:
    """Whether a rank's prefill workspace keeps its MLP width whole: under expert parallelism (each rank holds whole
    experts, vLLM's MoE tensor-parallel size 1) where the config's intermediate size is the routed experts' own
    width (Mixtral, OLMoE: every MLP is routed). A config whose intermediate is another MLP's (Qwen-MoE's dense or
    shared expert, DeepSeek's dense layers: a moe_intermediate_size apart) keeps it / tp: those are cut over tp
    under --ep too."""
    from ..dims import dim

    hidden, inner = dim(text, "hidden"), dim(text, "intermediate")
    return ep > 1 and bool(hidden) and bool(inner) and inner in expert_widths(params, hidden)


def rule_words(experts: int, ep: int) -> str:
    counts = sorted({stop - start for start, stop in expert_ranges(experts, ep)}, reverse=True)
    share = f"{counts[0]} a rank" if len(counts) == 1 else \
        f"{counts[0]} on the first {experts % ep} ranks, {counts[1]} on the rest (rank 0: {counts[0]})"
    return f"expert parallel: whole experts, {experts} / ep {ep} = {share} (vLLM's linear placement)"


def notes(experts: int, ep: int, tp: int, held: tuple[int, int], dp: int = 1,
          shared_whole: bool = False) -> tuple[str, ...]:
    ranks = (f"{ep} tensor-parallel ranks" if dp == 1 else
             f"{ep} ranks of the {dp} replicas, ep rank = dp rank × {tp} + tp rank,")
    empty = (f"; {experts} experts over {ep} ranks: ranks {experts}–{ep - 1} hold none (vLLM's determine_expert_map "
             "allows it)" if experts < ep else "")
    return (f"expert parallel (vLLM's --enable-expert-parallel): EP size = TP × DP = {tp} × {dp} = {ep}"
            + (" (one replica, no data parallelism)" if dp == 1 else "")
            + f", so the MoE layers' {experts} routed experts are split whole over the {ranks} with no tensor "
            f"parallelism within an expert (so no expert width need divide the tp degree): rank 0 holds experts "
            f"{held[0]}–{held[1] - 1}{empty}; attention, " + ("" if shared_whole else "shared experts, ")
            + "embeddings and the head stay tensor parallel" + (" within each replica" if dp > 1 else "")
            + (", the shared experts whole (sequence-parallel MoE: see its note)" if shared_whole else "")
            + ", routers replicated",
            ("expert parallel: the tokens each rank's experts read are the replicas' gathered ones (the "
             "data-parallel dispatch, counted: see its note)" if dp > 1 else
             "expert parallel with one replica: every tp rank already holds the replica's tokens, so nothing is "
             "dispatched (vLLM's MoE layer runs its own experts on them and all-reduces the outputs over tp)")
            + "; the prefill workspace is the tensor-parallel formula's, with the routed experts' widths whole "
            "where it reads them (vLLM's fused experts run whole experts, their intermediate caches at the "
            "expert's full width)")


def flattened_words(tp: int, dp: int) -> str:
    """The routed experts' rule under data parallelism without expert parallelism (vLLM's flatten_tp_across_dp)."""
    return (f"gate and up column-parallel, down row-parallel over tp × dp = {tp * dp} ranks (vLLM's MoE layers "
            "flatten TP across DP without expert parallelism)")


def _round_up(value: int) -> int:
    return -(-value // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class GatheredDispatch:
    """What each GPU holds at a MoE layer under vLLM's data parallelism beside its replica's own tensors: the
    dispatch's all-gathered hidden states [M, h] in the compute dtype, top-k weights [M, k] fp32 and top-k ids
    [M, k] int32, M = D·B·S (every replica prefilling B × S tokens at once; each tp rank of a replica gathers its
    replica's whole batch) or, under vLLM's sequence-parallel MoE (`tp_chunks` = tp), D·tp·⌈B·S / tp⌉: each tp rank
    dispatches its own chunk of the replica's tokens, padded to a multiple of tp (sequence_parallel_chunk), and the
    EP group's all_gatherv gathers every rank's."""

    dp: int
    hidden: int
    top_k: int
    dtype_size: int
    tp_chunks: int = 1  # tp under vLLM's sequence-parallel MoE, else 1

    def tokens(self, batch: int, seq: int) -> int:
        """M: the tokens gathered at a MoE layer."""
        return self.dp * self.tp_chunks * -(-batch * seq // self.tp_chunks)

    def at(self, batch: int, seq: int) -> int:
        return self.tokens(batch, seq) * (self.hidden * self.dtype_size + self.top_k * (4 + 4))

    def token_words(self, batch: int, seq: int) -> str:
        if self.tp_chunks == 1:
            return f"{self.dp} replicas × {batch:,} × {seq:,} tokens"
        return (f"{self.dp} replicas × tp {self.tp_chunks} × ⌈{batch:,} × {seq:,} / {self.tp_chunks}⌉ tokens "
                "(sequence-parallel MoE: each tp rank's chunk, gathered over the EP group)")

    def arithmetic(self, batch: int, seq: int) -> str:
        return (f"{self.token_words(batch, seq)} × (hidden {self.hidden:,} × {self.dtype_size} B"
                f" + top-k {self.top_k} × (4 B fp32 weight + 4 B int32 id))")

    def words(self, batch: int, seq: int) -> str:
        unknown = ("; the config names no top-k (num_experts_per_tok): its weights and ids are not counted"
                   if not self.top_k else "")
        sequence = ("; vLLM's sequence-parallel MoE (this model under --ep with tp > 1 and dp > 1: "
                    "ParallelConfig.use_sequence_parallel_moe): each tp rank dispatches its ⌈B·S / tp⌉ tokens "
                    "(sequence_parallel_chunk) over the EP group, so the tp ranks of a replica gather its tokens "
                    "once between them, padded to a multiple of tp" if self.tp_chunks > 1 else "")
        return ("the MoE layers' gathered tokens are in each GPU's peak (vLLM's default all2all backend, "
                "allgather_reducescatter, the same without --ep: AgRsAll2AllManager.dispatch all_gatherv's every "
                "replica's hidden states, fused_topk's fp32 top-k weights and int32 top-k ids over the DP group, "
                "held to the combine's reduce-scatter): "
                f"{self.arithmetic(batch, seq)} = {self.at(batch, seq):,} B at the asked point, on every stage "
                "holding a MoE layer, beside the workspace (whose moment is the MoE layer's: the Llama-style "
                "formula's MLP, Mixtral's fitted experts' moments) and the fused experts' workspace over these "
                "tokens (its own row and note); the convention: every replica prefills its batch at once (vLLM's "
                "chunked prefill caps a step at max_num_batched_tokens and holds less)" + sequence
                + "; an fp8 w8a8 checkpoint dispatches 1-byte activations with their scales: a bound there" + unknown)


@dataclass(frozen=True)
class FusedExpertsWorkspace:
    """vLLM's fused experts' workspace over the gathered tokens, on each GPU whose stage runs a MoE layer.

    FusedMoEModularKernel._fused_experts (modular_kernel.py) takes M_full, the tokens after the dispatch (the
    gathered M of GatheredDispatch), and `_chunk_info` chunks it: CHUNK = min(M_full, VLLM_FUSED_MOE_CHUNK_SIZE),
    16,384 by default (TritonExperts supports chunking; VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING is on by default).
    `_allocate_buffers` asks the WorkspaceManager, in one `get_simultaneous` request (each tensor rounded up to 256
    B), for TritonExperts.workspace_shapes (fused_moe.py) at the chunk: workspace13 (CHUNK, k, max(N', K)) and
    workspace2 (CHUNK, k, max(N, K)), N the fused gate-up's width (2i gated, i otherwise), N' = N // 2 gated (the
    activation's output; N for a *_no_mul activation), K = h, with the output (M_full, K) at the full M: in one
    chunk (M_full ≤ CHUNK) the output shares workspace13's storage (max of the two), past it the three are apart.
    Under data + expert parallelism (`dp_ep`, the kernel's is_dp_ep) the profile run also asks for the worst case at
    CHUNK = VLLM_FUSED_MOE_CHUNK_SIZE whatever its tokens (the three apart), since the random routing of DP+EP may
    not reach it while profiling. The WorkspaceManager keeps one buffer, grown to the largest request and never
    shrunk (locked after warm-up), so the GPU holds the larger of the two beside every moment of its forward.

    `width` is the routed expert's width on the rank (i: whole under --ep; i / (tp × dp) without, vLLM's MoE layers
    flattening TP across DP); the compute dtype is the workspace's (TritonExperts.workspace_dtype: the activations'
    dtype). The kernel is TritonExperts, vLLM's default for unquantised weights; an fp8 block checkpoint on Hopper
    may run DeepGEMM or CUTLASS experts, which size their own workspaces."""

    dispatch: GatheredDispatch
    width: int
    gated: bool
    dp_ep: bool
    chunk: int = FUSED_MOE_CHUNK_SIZE

    def _shapes(self, chunk: int) -> tuple[int, int]:
        """(workspace13, workspace2) elements at `chunk` tokens: TritonExperts.workspace_shapes."""
        k, h = self.dispatch.top_k or 1, self.dispatch.hidden
        n = 2 * self.width if self.gated else self.width
        out = n // 2 if self.gated else n  # adjust_N_for_activation
        return chunk * k * max(out, h), chunk * k * max(n, h)

    def request(self, tokens: int) -> int:
        """Bytes of `_allocate_buffers`' request at M_full = `tokens` (each tensor rounded up to 256 B)."""
        size, h = self.dispatch.dtype_size, self.dispatch.hidden
        chunk = min(tokens, self.chunk)
        w13, w2 = self._shapes(chunk)
        out = tokens * h
        pieces = (max(w13, out), w2) if tokens <= self.chunk else (w13, w2, out)
        return sum(_round_up(p * size) for p in pieces)

    def profile_request(self) -> int:
        """The profile run's worst case under DP+EP: workspace_shapes at VLLM_FUSED_MOE_CHUNK_SIZE, the three apart."""
        w13, w2 = self._shapes(self.chunk)
        size = self.dispatch.dtype_size
        return sum(_round_up(p * size) for p in (w13, w2, self.chunk * self.dispatch.hidden))

    def at(self, batch: int, seq: int) -> int:
        held = self.request(self.dispatch.tokens(batch, seq))
        return max(held, self.profile_request()) if self.dp_ep else held

    def arithmetic(self, batch: int, seq: int) -> str:
        m = self.dispatch.tokens(batch, seq)
        k, h, size = self.dispatch.top_k or 1, self.dispatch.hidden, self.dispatch.dtype_size
        n = 2 * self.width if self.gated else self.width
        out = n // 2 if self.gated else n
        if self.dp_ep and self.profile_request() >= self.request(m):
            c = self.chunk
            return (f"the profile run's worst case under DP+EP at VLLM_FUSED_MOE_CHUNK_SIZE {c:,} tokens: "
                    f"{c:,} × top-k {k} × (max({out:,}, {h:,}) + max({n:,}, {h:,})) × {size} B + output {c:,} × "
                    f"{h:,} × {size} B, each rounded up to 256 B (the {m:,} gathered tokens ask less)")
        chunk = min(m, self.chunk)
        if m <= self.chunk:
            return (f"{m:,} gathered tokens (one chunk) × top-k {k} × (max({out:,}, {h:,}) + max({n:,}, {h:,})) × "
                    f"{size} B, each rounded up to 256 B (the output shares workspace13)")
        return (f"chunks of {chunk:,} of the {m:,} gathered tokens × top-k {k} × (max({out:,}, {h:,}) + "
                f"max({n:,}, {h:,})) × {size} B + the output over all {m:,} × {h:,} × {size} B, each rounded up to "
                "256 B")

    def words(self, batch: int, seq: int) -> str:
        where = "whole (--ep: vLLM's MoE TP size 1)" if self.dp_ep else "/ (tp × dp) (vLLM's flatten_tp_across_dp)"
        return ("vLLM's fused experts' workspace over the gathered tokens is in each GPU's peak: "
                "FusedMoEModularKernel (modular_kernel.py: _chunk_info, _allocate_buffers) sizes TritonExperts' "
                "intermediate caches (fused_moe.py: workspace_shapes) by the gathered M, chunked by "
                f"VLLM_FUSED_MOE_CHUNK_SIZE ({self.chunk:,}, envs.py), the expert's width {self.width:,} on the rank "
                f"{where}, in vLLM's WorkspaceManager (v1/worker/workspace.py), one buffer grown to the largest "
                "request and kept beside every moment" + (", at least the profile run's worst case at a full chunk "
                                                          "under DP+EP (is_dp_ep)" if self.dp_ep else "")
                + f": {self.arithmetic(batch, seq)} = {self.at(batch, seq):,} B at the asked point; the convention: "
                "TritonExperts, vLLM's kernel for unquantised experts (DeepGEMM, CUTLASS or FlashInfer experts, "
                "as an fp8 checkpoint may run, size their own); not traced (transformers' prefill runs no fused "
                "kernel), held to vLLM's arithmetic")


def gathered_dispatch(text: Any, dp: int, dtype_size: int, tp_chunks: int = 1) -> GatheredDispatch | None:
    """The dispatch's gathered tensors under `dp` replicas (None with one replica or without a hidden size);
    `tp_chunks`: tp under vLLM's sequence-parallel MoE."""
    from ..dims import dim

    hidden = dim(text, "hidden")
    if dp < 2 or not hidden:
        return None
    return GatheredDispatch(dp, hidden, dim(text, "top_k") or 0, dtype_size, tp_chunks)


def fused_experts_workspace(dispatch: GatheredDispatch | None, params: Any, *, tp: int, dp: int,
                            ep: int) -> FusedExpertsWorkspace | None:
    """The fused experts' workspace over `dispatch`'s gathered tokens (None without a dispatch, or where the routed
    experts' width cannot be read off their tensors): the expert's width read off the module's own expert tensors
    (the smallest of expert_widths: the down projection's input i, beside a fused gate-up's 2i), whole under
    expert parallelism, / (tp × dp) without; gated where a fused gate-up (2i) or a gate projection is among them
    (vLLM fuses gate and up into w13, [E, 2i, h])."""
    if dispatch is None:
        return None
    widths = expert_widths(params, dispatch.hidden)
    if not widths:
        return None
    width = min(widths)
    gated = 2 * width in widths or any(_GATE.search(p.name) for p in params if p.role == "moe.experts")
    return FusedExpertsWorkspace(dispatch, width if ep > 1 else width // (tp * dp), gated, ep > 1 and dp > 1,
                                 FUSED_MOE_CHUNK_SIZE)


__all__ = ["FUSED_MOE_CHUNK_SIZE", "FusedExpertsWorkspace", "GatheredDispatch", "SEQUENCE_PARALLEL_MOE", "SHARED_WHOLE",
           "expert_parallel", "expert_ranges", "expert_widths", "experts_of", "flattened_words",
           "fused_experts_workspace", "gathered_dispatch", "notes", "rule_words", "sequence_parallel_moe",
           "workspace_experts_whole"]
