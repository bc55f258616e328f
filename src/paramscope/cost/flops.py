"""FLOPs, analytic: from the built module's matmul weights and the config's attention shape, with the arithmetic.

Convention (FlopCounterMode's and PaLM's): a matmul of m×k by k×n costs 2mnk; attention scores (q·kᵀ) and the
weighted sum (p·v) are counted in full, 2·B·S²·heads·(d_qk + d_v) per attention layer, whatever the mask keeps
(`causal="half"` halves them, Megatron's convention); elementwise ops, norms, softmax and embedding lookups are
not counted. T = batch × seq tokens.

    forward  = 2·T·(matmul weights a token meets) + attention
      - every nn.Linear (and GPT-2's Conv1D) weight, once per use: a tied lm_head counts as a matmul;
      - routed experts at top-k of E: each token meets k of them (numel × k / E); shared experts and the router
        in full.
    backward = 2 × forward for what trains (the input's gradient and the weight's; a frozen matmul only passes
               the input's gradient on, 1 ×; attention's backward is 2 × its forward)
    recompute (hardware FLOPs, not model FLOPs): flash attention's backward recomputes the scores (½ × the
               attention forward), and full gradient checkpointing reruns each layer's forward.

MFU divides model FLOPs (forward + backward) by time and the accelerator's dense peak; HFU adds the recompute.
The traced engine (flop_count.py) is the check: on every preset family the two agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .activations import attention_dropout, hidden_dropout
from ..display import HtmlDisplay
from .kv_cache import config_int, layer_kinds, text_config

_NO_ATTENTION = ("none", "linear_attention", "mamba", "conv", "recurrent", "shared")
# Layouts whose matmuls the module structure does not give: DeBERTa's disentangled attention adds position
# matmuls. The traced engine answers for them.
_NOT_ANALYTIC = ("deberta", "deberta-v2")


@dataclass(frozen=True)
class FlopTerm:
    role: str
    flops: int  # forward
    arithmetic: str


@dataclass(frozen=True)
class FlopEstimate(HtmlDisplay):
    engine: str  # "analytic" | "traced"
    batch: int
    seq: int
    causal: str  # "full" | "half"
    forward: int
    attention: int  # the forward's attention-score term (grows with S²)
    terms: tuple[FlopTerm, ...]  # by role, summing to forward
    backward: int | None  # model FLOPs of the backward (training)
    recompute: int | None  # hardware FLOPs beyond the model's (training)
    notes: tuple[str, ...] = field(default=())
    # The forward at other context lengths, same batch: (seq, forward, attention) from the same analytic count
    # (FlopOptions.context_curve); empty when not asked or when the traced engine answered.
    by_context: tuple[tuple[int, int, int], ...] = field(default=())

    @property
    def by_role(self) -> dict[str, int]:
        return {t.role: t.flops for t in self.terms}

    @property
    def step(self) -> int | None:
        return None if self.backward is None else self.forward + self.backward

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def _html(self, fragment: bool) -> str:
        from ..render.html.cost import render_flops_html

        return render_flops_html(None, self, None, fragment=fragment)


def analytic_flops(view: Any, params: Any, *, batch: int, seq: int, training: bool, checkpointing: bool = False,
                   causal: str = "full", frozen: frozenset[str] = frozenset()) -> FlopEstimate | None:
    """The analytic FLOPs of the model `view` shows (model_view.ModelView: the meta build, or facts recorded from
    it), or None where its attention has no closed form here."""
    from .flop_count import module_roles

    config = text_config(view.config)
    if config is None or getattr(config, "model_type", None) in _NOT_ANALYTIC:
        return None
    uses = _shared_uses(view.root, config)
    if uses is None:
        return None
    tokens = batch * seq
    roles = module_roles(params)
    top_k, experts = routing(config)
    by_role: dict[str, list[int]] = {}  # role → [flops, numel met per token]
    frozen_flops = 0
    layer_flops = 0
    last_in_layer: dict[str, tuple[int, str]] = {}  # layer → (FLOPs, role) of its last matmul in registration order
    seen_frozen: set[str] = set(frozen)
    for param in params:  # a frozen tensor is frozen under every name it has (a tied lm_head)
        if param.name in frozen:
            seen_frozen.update(param.aliases)
    if training and frozen and frozen_prefix(params, frozen):
        return None
    for path, sub in view.root.named_modules():
        runs = _runs(uses, path)
        if view.is_matmul(sub):
            numel = sub._parameters["weight"].numel() * runs
            role = roles.get(path, "other")
            if role.startswith("embeddings"):  # a head tied to the input embedding: its matmul is the head's
                role = "head.lm"
            if role.startswith("moe.experts") and experts:
                numel = numel * top_k // experts
            _add(by_role, role, 2 * tokens * numel, numel)
            if f"{path}.weight" in seen_frozen:
                frozen_flops += 2 * tokens * numel
            if _in_layer(path):
                layer_flops += 2 * tokens * numel
                down = role.startswith("moe.shared") and path.endswith(("down_proj", "w2"))
                last_in_layer[_layer_of(path)] = (2 * tokens * numel, "moe.shared_experts.down" if down else role)
            continue
        for name, param in sub._parameters.items():
            if param is None:
                continue
            full = f"{path}.{name}" if path else name
            role = roles.get(path, "other")
            if name == "weight" and len(param.shape) == 2 and role.startswith("moe.router"):  # a router's F.linear
                _add(by_role, role, 2 * tokens * param.numel(), param.numel())  # (routers are never shared)
                if full in seen_frozen:
                    frozen_flops += 2 * tokens * param.numel()
                layer_flops += 2 * tokens * param.numel()
                last_in_layer[_layer_of(path)] = (2 * tokens * param.numel(), role)
            elif len(param.shape) == 3 and role.startswith("moe.experts"):  # fused experts: E × in × out
                numel = param.numel() * top_k // max(param.shape[0], 1)
                _add(by_role, role, 2 * tokens * numel, numel)
                if full in seen_frozen:
                    frozen_flops += 2 * tokens * numel
                layer_flops += 2 * tokens * numel
                last_in_layer[_layer_of(path)] = (2 * tokens * numel, role)
    if getattr(config, "is_encoder_decoder", False):
        attention, text = _encoder_decoder_attention(config, batch, seq)
    else:
        attention, text = _attention(config, batch, seq, causal)
    if attention is None:
        return None
    terms = [FlopTerm(role, flops, f"2 × {tokens:,} tokens × {numel:,} weights"
                      + (f" (top-{top_k} of {experts} experts)" if role.startswith("moe.experts") else ""))
             for role, (flops, numel) in sorted(by_role.items(), key=lambda kv: -kv[1][0])]
    if attention:
        terms.append(FlopTerm("attention.scores", attention, text))
    forward = sum(t.flops for t in terms)
    backward = recompute = None
    notes = []
    if training:
        backward = 2 * forward - frozen_flops  # a frozen weight's gradient is not computed
        # a fused (flash) attention backward recomputes q·kᵀ; with attention dropout, torch's CPU kernels cannot
        # fuse and run the math path, which keeps the scores instead
        implementation = getattr(view.config, "_attn_implementation", "sdpa") or "sdpa"
        # eager attention keeps its scores; so does sdpa where torch's CPU kernels cannot fuse (attention dropout,
        # or MLA's query and value head sizes differing)
        fused = implementation == "sdpa" and not attention_dropout(config) and _same_head_sizes(config)
        recompute = attention // 2 if fused else 0
        if checkpointing:
            # non-reentrant checkpointing reruns a layer only until backward has what it saved. A layer's last
            # matmul is not rerun when nothing after it saves its output: not so when a dropout follows (its
            # mask is regenerated), a norm takes the MLP's output (Gemma-2's post-feedforward norm saves its input)
            # or the last matmul is the routed experts', whose outputs the router's weights multiply
            post_norm = any("post_feedforward" in path for path, _ in view.root.named_modules())
            dropout = hidden_dropout(config) > 0
            # (or a gate whose sigmoid saves its output, as Qwen2-MoE's shared-expert gate): only a down projection
            # ending the layer is skipped
            skipped = sum(flops for flops, role in last_in_layer.values()
                          if not (dropout or post_norm) and role in ("mlp.down", "moe.shared_experts.down"))
            recompute += layer_flops - skipped + attention
        if frozen_flops:
            notes.append(f"frozen matmuls skip their weight gradients: backward is 2 × forward − {frozen_flops:,}")
    return FlopEstimate("analytic", batch, seq, causal, forward, attention, tuple(terms), backward, recompute,
                        tuple(notes))


def frozen_prefix(params: Any, frozen: frozenset[str]) -> str | None:
    """Why the backward of this freezing is not 2 × forward less the frozen weights' gradients, or None.

    That rule holds while every matmul's input requires grad: the embeddings train, or the first layer opens with a
    trainable norm (pre-LN: Llama, GPT-2, T5). Where the network's first part is frozen through to a matmul
    (frozen embeddings with their own norm, as BERT and BART have, or frozen first layers), autograd skips the
    input gradients up to the first trainable tensor; where that ends depends on the layer's dataflow, which the
    traced engine follows."""
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


def _same_head_sizes(config: Any) -> bool:
    if config_int(config, "kv_lora_rank") is None:
        return True
    d_qk = (config_int(config, "qk_nope_head_dim") or 0) + (config_int(config, "qk_rope_head_dim") or 0)
    return d_qk == (config_int(config, "v_head_dim") or d_qk)


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
    experts = config_int(config, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts") or 0
    top_k = config_int(config, "num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts") or 1
    return top_k, experts


def _encoder_decoder_attention(config: Any, batch: int, seq: int) -> tuple[int | None, str]:
    """Encoder self-attention, decoder self-attention and cross-attention, the encoder and the decoder both at
    `seq` tokens (as the traced step runs them): 2·B·S²·heads·(d_qk + d_v) per attention."""
    encoder_layers = config_int(config, "encoder_layers", "num_layers")
    decoder_layers = config_int(config, "decoder_layers", "num_decoder_layers") or encoder_layers
    hidden = config_int(config, "d_model", "hidden_size") or 0
    parts = []
    for what, layers, heads in (
            ("encoder self", encoder_layers, config_int(config, "encoder_attention_heads", "num_heads")),
            ("decoder self", decoder_layers, config_int(config, "decoder_attention_heads", "num_heads")),
            ("cross", decoder_layers, config_int(config, "decoder_attention_heads", "num_heads"))):
        if not layers or not heads:
            return None, ""
        d = config_int(config, "d_kv", "head_dim") or hidden // heads
        parts.append((what, layers, heads, d))
    flops = sum(layers * 2 * batch * seq * seq * heads * 2 * d for _, layers, heads, d in parts)
    text = " + ".join(f"{what} {layers} × 2 × {batch} × {seq:,}² × {heads} heads × ({d} + {d})"
                      for what, layers, heads, d in parts)
    return flops, text


def _attention(config: Any, batch: int, seq: int, causal: str) -> tuple[int | None, str]:
    """2·B·S²·heads·(d_qk + d_v) per attention layer (halved for causal="half")."""
    heads = config_int(config, "num_attention_heads", "n_head", "num_heads")
    if not heads:
        return None, ""
    if config_int(config, "kv_lora_rank") is not None:  # MLA: queries and keys carry a rope part
        d_qk = (config_int(config, "qk_nope_head_dim") or 0) + (config_int(config, "qk_rope_head_dim") or 0)
        d_v = config_int(config, "v_head_dim") or d_qk
    else:
        hidden = config_int(config, "hidden_size", "n_embd", "d_model") or 0
        d_qk = d_v = config_int(config, "head_dim") or hidden // heads
    try:
        layers = sum(1 for kind, _ in layer_kinds(config) if kind not in _NO_ATTENTION)
    except Exception:
        layers = config_int(config, "num_hidden_layers", "n_layer") or 0
    layers *= config_int(config, "inner_group_num") or 1  # ALBERT: each pass runs a group of layers
    flops = layers * 2 * batch * seq * seq * heads * (d_qk + d_v)
    text = (f"{layers} layers × 2 × {batch} × {seq:,}² × {heads} heads × ({d_qk} + {d_v})")
    if causal == "half":
        flops //= 2
        text += " ÷ 2 (causal half)"
    return flops, text
