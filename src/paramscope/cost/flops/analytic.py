"""FLOPs, analytic: from the built module's matmul weights and the config's attention shape, with the arithmetic.

Convention (FlopCounterMode's and PaLM's): a matmul of m×k by k×n costs 2mnk; attention scores (q·kᵀ) and the
weighted sum (p·v) are counted in full, 2·B·S²·heads·(d_qk + d_v) per attention layer, whatever the mask keeps
(`causal="half"` halves them, Megatron's convention); elementwise ops, norms, softmax and embedding lookups are
not counted. T = batch × seq tokens.

    forward  = 2·T·(matmul weights a token meets) + attention
      - every nn.Linear (and GPT-2's Conv1D) weight, once per use: a tied lm_head counts as a matmul; ALBERT's
        shared layer groups once per pass that runs them;
      - routed experts at top-k of E: each token meets k of them (numel × k / E); shared experts and the router
        in full;
      - an encoder-decoder: encoder and decoder both at S tokens, attention = encoder self + decoder self + cross;
      - DeBERTa-v2: each layer also projects 2 × span relative-position embeddings (whatever B and S), and its
        c2p and p2c scores cost 2·B·heads·S·d·(2 × span) each, counted with the attention.
    backward = 2 × forward for what trains (the input's gradient and the weight's; a frozen matmul only passes
               the input's gradient on, 1 ×; attention's backward is 2 × its forward). Where freezing leaves a
               frozen prefix, autograd computes no input gradient before the first trainable tensor: no closed
               form here (skipped_input_gradients), the traced engine answers.
    recompute (hardware FLOPs, not model FLOPs): flash attention's backward recomputes the scores (½ × the
               attention forward), and full gradient checkpointing reruns each layer's forward.

MFU divides model FLOPs (forward + backward) by time and the accelerator's dense peak; HFU adds the recompute.
The traced engine (traced/flops.py) is the check: on every preset family the two agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dims import attention_dropout, config_int, dim, hidden_dropout, same_head_sizes, text_config
from ..model_view import towers_not_run
from ..memory.kv import layer_kinds
from .result import FlopEstimate, FlopTerm

_NO_ATTENTION = ("none", "linear_attention", "mamba", "conv", "recurrent", "shared")
# Layouts whose matmuls the module structure does not give here: DeBERTa (v1)'s disentangled attention with its
# fused in_proj. The traced engine answers for it.
_NOT_ANALYTIC = ("deberta",)


@dataclass
class Parts:
    """What `analytic_flops` counted, weight by weight, when asked (`parts=`): what a per-device split
    (cost/parallel/flops.py) cuts. The same FLOPs as the terms, not a second table: each matmul's forward FLOPs as
    counted there, under the weight's name."""

    # (weight name, role as counted, forward FLOPs, inside a layer, runs on one token of each sequence)
    matmuls: list[tuple[str, str, int, bool, bool]] = field(default_factory=list)
    not_rerun: set[str] = field(default_factory=set)  # weights full checkpointing does not rerun (a layer's last)
    fused_attention: bool = False  # the backward recomputes the scores (½ × the attention forward)
    unsplit: str | None = None  # why these parts do not split per device (shared layers, relative positions, …)


def analytic_flops(view: Any, params: Any, *, batch: int, seq: int, training: bool, checkpointing: bool = False,
                   causal: str = "full", frozen: frozenset[str] = frozenset(),
                   parts: Parts | None = None) -> FlopEstimate | None:
    """The analytic FLOPs of the model `view` shows (model_view.ModelView: the meta build, or facts recorded from
    it), or None where its attention has no closed form here. `parts`, when given, is filled with the count weight by
    weight (Parts)."""
    from ..traced.flops import module_roles

    config = text_config(view.config)
    if config is None or getattr(config, "model_type", None) in _NOT_ANALYTIC:
        return None
    uses = _shared_uses(view.root, config)
    if uses is None:
        return None
    idle = towers_not_run(view)
    tokens = batch * seq
    roles = module_roles(params)
    top_k, experts = routing(config)
    by_role: dict[str, list[int]] = {}  # role → [flops, numel met per token]
    frozen_flops = 0
    layer_flops = 0
    last_in_layer: dict[str, tuple[int, str, str]] = {}  # layer → (FLOPs, role, weight) of its last matmul
    seen_frozen: set[str] = set(frozen)
    for param in params:  # a frozen tensor is frozen under every name it has (a tied lm_head)
        if param.name in frozen:
            seen_frozen.update(param.aliases)
    if training and frozen and skipped_input_gradients(params, seen_frozen, config):
        return None
    positions = _relative_positions(config)  # DeBERTa-v2: (2 × span rows, shared projections, c2p/p2c)
    if parts is not None:
        parts.unsplit = ("ALBERT's layers share weights across passes" if uses else
                         "DeBERTa's relative-position projections run outside the token count" if positions else
                         "an encoder-decoder runs two stacks" if getattr(config, "is_encoder_decoder", False)
                         else None)
    once: dict[str, str] = {}  # role → why its matmuls run on one token of each sequence (the pooler, …)
    unused_pooler = False
    unused_flops = 0
    for path, sub in view.root.named_modules():
        if any(path == tower or path.startswith(tower + ".") for tower in idle):
            continue
        runs = _runs(uses, path)
        if view.is_matmul(sub):
            numel = sub._parameters["weight"].numel() * runs
            rows, used = _position_rows(positions, path)
            if rows:  # a projection of the relative-position embeddings: 2 × span rows, whatever the batch
                flops = 2 * rows * numel
                _add(by_role, "attention.position", flops, numel)
                layer_flops += flops
                if not used:  # computed, then not used by any score: no gradient reaches it
                    unused_flops += flops
                elif f"{path}.weight" in seen_frozen:
                    frozen_flops += flops
                if path.endswith(("pos_key_proj", "pos_query_proj")):  # runs only on the positions
                    continue
            role = roles.get(path, "other")
            why_once = once_per_sequence(role, path, view.class_name)
            if role.startswith("embeddings"):  # a head tied to the input embedding: its matmul is the head's
                role = "head.lm"
            if role.startswith("moe.experts") and experts:
                numel = numel * top_k // experts
            rows = tokens
            if why_once:
                rows = batch
                once[role] = why_once
            _add(by_role, role, 2 * rows * numel, numel)
            if parts is not None:
                parts.matmuls.append((f"{path}.weight", role, 2 * rows * numel, _in_layer(path), bool(why_once)))
            if f"{path}.weight" in seen_frozen:
                frozen_flops += 2 * rows * numel
            elif why_once and role.startswith("pooler") and "For" not in view.class_name:
                # a bare model trains on the sum of its last hidden state (the traced step's convention): the
                # pooler runs, but its output is in no loss, so no gradient reaches it
                unused_flops += 2 * rows * numel
                unused_pooler = True
            if _in_layer(path):
                layer_flops += 2 * tokens * numel
                down = role.startswith("moe.shared") and path.endswith(("down_proj", "w2"))
                last_in_layer[_layer_of(path)] = (2 * tokens * numel, "moe.shared_experts.down" if down else role,
                                                  f"{path}.weight")
            continue
        for name, param in sub._parameters.items():
            if param is None:
                continue
            full = f"{path}.{name}" if path else name
            role = roles.get(path, "other")
            if name == "weight" and len(param.shape) == 2 and role.startswith("moe.router"):  # a router's F.linear
                _add(by_role, role, 2 * tokens * param.numel(), param.numel())  # (routers are never shared)
                if parts is not None:
                    parts.matmuls.append((full, role, 2 * tokens * param.numel(), _in_layer(path), False))
                if full in seen_frozen:
                    frozen_flops += 2 * tokens * param.numel()
                layer_flops += 2 * tokens * param.numel()
                last_in_layer[_layer_of(path)] = (2 * tokens * param.numel(), role, full)
            elif len(param.shape) == 3 and role.startswith("moe.experts"):  # fused experts: E × in × out
                numel = param.numel() * top_k // max(param.shape[0], 1)
                _add(by_role, role, 2 * tokens * numel, numel)
                if parts is not None:
                    parts.matmuls.append((full, role, 2 * tokens * numel, _in_layer(path), False))
                if full in seen_frozen:
                    frozen_flops += 2 * tokens * numel
                layer_flops += 2 * tokens * numel
                last_in_layer[_layer_of(path)] = (2 * tokens * numel, role, full)
    if getattr(config, "is_encoder_decoder", False):
        attention, text = _encoder_decoder_attention(config, batch, seq)
    else:
        attention, text = _attention(config, batch, seq, causal)
    if attention is None:
        return None
    if positions:
        relative, relative_text = _position_scores(config, positions, batch, seq)
        attention += relative
        text += f" + {relative_text}"
    terms = [FlopTerm(role, flops, _term_text(role, numel, tokens, top_k, experts, positions, batch, once.get(role)))
             for role, (flops, numel) in sorted(by_role.items(), key=lambda kv: -kv[1][0])]
    if attention:
        terms.append(FlopTerm("attention.scores", attention, text))
    forward = sum(t.flops for t in terms)
    backward = recompute = None
    notes = []
    if idle:
        held = sum(p.numel for p in params if any(p.name.startswith(tower + ".") for tower in idle))
        notes.append(f"a text input runs the language model only: {', '.join(idle)} ({held:,} parameters) do not "
                     "run and are not counted (--image-tokens N, --images K or --audio-seconds T adds them, for Gemma-3, "
                     "LLaVA, Qwen2.5-VL, Llama-3.2-Vision and Whisper)")
    if training:
        backward = 2 * (forward - unused_flops) - frozen_flops  # a frozen weight's gradient is not computed
        # a fused (flash) attention backward recomputes q·kᵀ; with attention dropout, torch's CPU kernels cannot
        # fuse and run the math path, which keeps the scores instead
        implementation = getattr(view.config, "_attn_implementation", "sdpa") or "sdpa"
        # eager attention keeps its scores; so does sdpa where torch's CPU kernels cannot fuse (attention dropout,
        # or MLA's query and value head sizes differing)
        fused = implementation == "sdpa" and not attention_dropout(config) and same_head_sizes(config)
        recompute = attention // 2 if fused else 0
        if parts is not None:
            parts.fused_attention = fused
        if checkpointing:
            # non-reentrant checkpointing reruns a layer only until backward has what it saved. A layer's last
            # matmul is not rerun when nothing after it saves its output: not so when a dropout follows (its
            # mask is regenerated), a norm takes the MLP's output (Gemma-2's post-feedforward norm saves its input)
            # or the last matmul is the routed experts', whose outputs the router's weights multiply
            post_norm = any("post_feedforward" in path for path, _ in view.root.named_modules())
            dropout = hidden_dropout(config) > 0
            # (or a gate whose sigmoid saves its output, as Qwen2-MoE's shared-expert gate): only a down projection
            # ending the layer is skipped
            not_rerun = [(flops, name) for flops, role, name in last_in_layer.values()
                         if not (dropout or post_norm) and role in ("mlp.down", "moe.shared_experts.down")]
            skipped = sum(flops for flops, _ in not_rerun)
            if parts is not None:
                parts.not_rerun.update(name for _, name in not_rerun)
            recompute += layer_flops - skipped + attention
            roles = sorted({role for _, role, _ in last_in_layer.values() if not (dropout or post_norm)
                            and role in ("mlp.down", "moe.shared_experts.down")})
            notes.append(
                f"recompute {recompute:,} = the checkpointed layers' forward rerun in backward, their matmuls "
                f"{layer_flops:,} + their attention scores {attention:,}"
                + (f", less each layer's last matmul ({', '.join(roles)}: {len(not_rerun)} of them, {skipped:,}), "
                   "which is not rerun: torch's non-reentrant checkpoint stops a layer's rerun once backward has "
                   "every tensor the layer saved, and nothing after that matmul saves its output" if skipped else "")
                + (f"; + flash attention's backward recomputing the scores, ½ × {attention:,} = {attention // 2:,}"
                   if fused else "")
                + "; the head and the embeddings are outside the layers and not rerun")
        if unused_pooler:
            notes.append("a bare model trains on the sum of its last hidden state: the pooler runs in the forward, "
                         "but no gradient reaches it")
        if frozen_flops:
            notes.append(f"frozen matmuls skip their weight gradients: backward is 2 × forward − {frozen_flops:,}")
    return FlopEstimate("analytic", batch, seq, causal, forward, attention, tuple(terms), backward, recompute,
                        tuple(notes))


def skipped_input_gradients(params: Any, frozen: Any, config: Any) -> str | None:
    """Why the backward of this freezing is not 2 × forward less the frozen weights' gradients, or None.

    That rule holds while every matmul's input requires grad: the embeddings train, or the first layer opens with a
    trainable norm (pre-LN: Llama, GPT-2, T5). Where the network's first part is frozen through to a matmul
    (frozen embeddings with their own norm, as BERT and BART have, or frozen first layers), autograd skips the
    input gradients up to the first trainable tensor; where that ends depends on the layer's dataflow, which the
    traced engine follows."""
    if _relative_positions(config) and _frozen_positions(params, frozen):
        return ("DeBERTa's relative-position embeddings are frozen with their norm, so the position projections "
                "skip input gradients")
    embeddings = [p for p in params if p.role.startswith("embeddings")]
    if not embeddings or any(p.name not in frozen for p in embeddings):
        return None
    if any(p.role == "embeddings.norm" for p in params):
        return "the embeddings and their norm are frozen, so the first layer's projections skip input gradients"
    first = [p for p in params if _first_index(p.name) == "0"]
    if first and all(p.name not in frozen for p in first):
        return None
    return "the embeddings and the first layer are frozen, so autograd skips input gradients until the first " \
           "trainable tensor"


def _first_index(name: str) -> str | None:
    import re

    match = re.search(r"\.(\d+)\.", f".{name}.")
    return match.group(1) if match else None


def _relative_positions(config: Any) -> tuple[int, bool, tuple[str, ...]] | None:
    """DeBERTa-v2's disentangled attention, as its DisentangledSelfAttention reads the config: (2 × the span of
    relative-position embeddings each layer projects, whether the content projections serve them too
    (share_att_key), the position terms "c2p"/"p2c"); None for any other attention."""
    if getattr(config, "model_type", None) != "deberta-v2" or not getattr(config, "relative_attention", False):
        return None
    buckets = getattr(config, "position_buckets", -1)
    span = getattr(config, "max_relative_positions", -1)
    if not isinstance(span, int) or span < 1:
        span = config_int(config, "max_position_embeddings") or 0
    if isinstance(buckets, int) and buckets > 0:
        span = buckets
    kinds = tuple(k for k in (getattr(config, "pos_att_type", None) or ()) if k in ("c2p", "p2c"))
    return 2 * span, bool(getattr(config, "share_att_key", False)), kinds


def _position_rows(positions: tuple[int, bool, tuple[str, ...]] | None, path: str) -> tuple[int, bool]:
    """(the relative-position rows a matmul module also runs on, 0 for none; whether a score uses its output).
    With shared keys both content projections run on the positions, whichever terms the scores use."""
    if positions is None:
        return 0, False
    rows, shared, kinds = positions
    if shared and path.endswith("attention.self.query_proj"):
        return rows, "p2c" in kinds
    if shared and path.endswith("attention.self.key_proj"):
        return rows, "c2p" in kinds
    if path.endswith("pos_key_proj") and "c2p" in kinds or path.endswith("pos_query_proj") and "p2c" in kinds:
        return rows, True
    return 0, False


def _frozen_positions(params: Any, frozen: set[str]) -> bool:
    """DeBERTa-v2's relative-position embeddings frozen with their norm: the position projections' inputs need no
    gradient, which 2 × forward does not follow (the traced engine does)."""
    tables = [p.name for p in params if p.name.endswith("rel_embeddings.weight")]
    owners = {name.rpartition(".rel_embeddings")[0] for name in tables}
    norms = [p.name for p in params if any(p.name.startswith(f"{o}.LayerNorm.") for o in owners)]
    return bool(tables) and all(name in frozen for name in tables + norms)


def _position_scores(config: Any, positions: tuple[int, bool, tuple[str, ...]], batch: int,
                     seq: int) -> tuple[int, str]:
    """c2p (queries by projected positions) and p2c (keys by projected positions): 2·B·heads·S·d·(2 × span)
    each, per layer."""
    rows, _, kinds = positions
    layers = config_int(config, "num_hidden_layers") or 0
    heads = config_int(config, "num_attention_heads") or 1
    head_dim = config_int(config, "attention_head_size") or (config_int(config, "hidden_size") or 0) // heads
    flops = layers * len(kinds) * 2 * batch * heads * seq * head_dim * rows
    return flops, (f"{'/'.join(kinds)} {layers} layers × {len(kinds)} × 2 × {batch} × {heads} heads × {seq:,} × "
                   f"{head_dim} × {rows:,} positions")


def once_per_sequence(role: str, path: str, class_name: str) -> str | None:
    """Why a matmul runs on one token of each sequence, not on every token; None when it runs on every token.

    The pooler (BERT, RoBERTa, ALBERT, DeBERTa's context pooler) reads each sequence's first token, and so does
    next-sentence prediction on its output. A sequence classifier's head reads one token of each sequence (the
    pooled or first token of an encoder, the end-of-sequence token of BART and T5), except a decoder's `score`,
    which transformers runs on every token before it picks the last real one (GPT-2, Llama)."""
    if role == "pooler" or role.startswith("pooler."):
        return "the pooler reads each sequence's first token"
    if role == "head.nsp":
        return "next-sentence prediction reads each sequence's pooled first token"
    if (role.startswith("head.") and class_name.endswith("ForSequenceClassification")
            and path.rsplit(".", 1)[-1] != "score"):  # DistilBERT's pre_classifier (head.transform) too
        return "a sequence classifier reads one token of each sequence"
    return None


def _term_text(role: str, numel: int, tokens: int, top_k: int, experts: int, positions: Any, batch: int = 0,
               once: str | None = None) -> str:
    if once:
        return f"2 × {batch:,} sequences × {numel:,} weights (one token each: {once})"
    if role == "attention.position":
        return (f"2 × {positions[0]:,} relative positions × {numel:,} weights (the projections that run on the "
                "relative-position embeddings, each layer)")
    text = f"2 × {tokens:,} tokens × {numel:,} weights"
    return text + (f" (top-{top_k} of {experts} experts)" if role.startswith("moe.experts") else "")


def _shared_uses(root: Any, config: Any) -> dict[str, int] | None:
    """Module path → how many times its forward runs, where layers share weights; None where that is not known
    here (the traced engine answers). ALBERT: pass i of num_hidden_layers runs layer group
    int(i / (num_hidden_layers / num_hidden_groups)), transformers' own expression."""
    groups = config_int(config, "num_hidden_groups")
    paths = [path for path, _ in root.named_modules() if path.endswith("albert_layer_groups")]
    if not paths:
        return {}
    layers = config_int(config, "num_hidden_layers")
    if groups is None or layers is None or len(paths) != 1:
        return None
    counts = [0] * groups
    for i in range(layers):
        counts[int(i / (layers / groups))] += 1
    return {f"{paths[0]}.{g}": count for g, count in enumerate(counts)}


def _runs(uses: dict[str, int], path: str) -> int:
    for prefix, count in uses.items():
        if path == prefix or path.startswith(prefix + "."):
            return count
    return 1


def _add(by_role: dict[str, list[int]], role: str, flops: int, numel: int) -> None:
    entry = by_role.setdefault(role, [0, 0])
    entry[0] += flops
    entry[1] += numel


def _in_layer(path: str) -> bool:
    import re

    return re.search(r"\.\d+(\.|$)", path) is not None


def _layer_of(path: str) -> str:
    import re

    match = re.search(r"^(.*?\.\d+)(\.|$)", path)
    return match.group(1) if match else path


def routing(config: Any) -> tuple[int, int]:
    """(top-k, routed experts) from the config; (1, 0) for a dense model."""
    experts = dim(config, "experts") or 0
    top_k = dim(config, "top_k") or 1
    return top_k, experts


def _encoder_decoder_attention(config: Any, batch: int, seq: int) -> tuple[int | None, str]:
    """Encoder self-attention, decoder self-attention and cross-attention, the encoder and the decoder both at
    `seq` tokens (as the traced step runs them): 2·B·S²·heads·(d_qk + d_v) per attention."""
    encoder_layers = config_int(config, "encoder_layers", "num_layers")
    decoder_layers = config_int(config, "decoder_layers", "num_decoder_layers") or encoder_layers
    hidden = dim(config, "hidden") or 0
    parts = []
    for what, layers, heads in (
            ("encoder self", encoder_layers, config_int(config, "encoder_attention_heads", "num_heads")),
            ("decoder self", decoder_layers, config_int(config, "decoder_attention_heads", "num_heads")),
            ("cross", decoder_layers, config_int(config, "decoder_attention_heads", "num_heads"))):
        if not layers or not heads:
            return None, ""
        d = dim(config, "head_dim") or hidden // heads
        parts.append((what, layers, heads, d))
    flops = sum(layers * 2 * batch * seq * seq * heads * 2 * d for _, layers, heads, d in parts)
    text = " + ".join(f"{what} {layers} × 2 × {batch} × {seq:,}² × {heads} heads × ({d} + {d})"
                      for what, layers, heads, d in parts)
    return flops, text


def _attention(config: Any, batch: int, seq: int, causal: str) -> tuple[int | None, str]:
    """2·B·S²·heads·(d_qk + d_v) per attention layer (halved for causal="half")."""
    heads = dim(config, "heads")
    if not heads:
        return None, ""
    if config_int(config, "kv_lora_rank") is not None:  # MLA: queries and keys carry a rope part
        d_qk = (config_int(config, "qk_nope_head_dim") or 0) + (config_int(config, "qk_rope_head_dim") or 0)
        d_v = config_int(config, "v_head_dim") or d_qk
    else:
        hidden = dim(config, "hidden") or 0
        d_qk = d_v = config_int(config, "head_dim") or hidden // heads
    # layer_kinds reads with defaults and cannot fail on a config; a gap in recorded facts (FactsGap) must reach
    # answer_from_facts_or_build, which builds instead, rather than be answered from another count here
    layers = sum(1 for kind, _ in layer_kinds(config) if kind not in _NO_ATTENTION)
    layers *= config_int(config, "inner_group_num") or 1  # ALBERT: each pass runs a group of layers
    flops = layers * 2 * batch * seq * seq * heads * (d_qk + d_v)
    text = (f"{layers} layers × 2 × {batch} × {seq:,}² × {heads} heads × ({d_qk} + {d_v})")
    if causal == "half":
        flops //= 2
        text += " ÷ 2 (causal half)"
    return flops, text
