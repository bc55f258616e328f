"""DeepSeek-V3 (MLA; the first k layers dense, the rest MoE with a shared expert), bf16-mixed and bf16-pure only,
        per token: 24h (16h bf16-pure) + 8r_q + 8r_kv + 8·heads·nope + 8·heads·rope + 6·heads·v + 16, + 8i (dense)
        or + Mixtral-like routed terms (MoE), + 4·B·heads·S² (its q and k are wider than v, so CPU sdpa runs the
        math kernel, in fp32). fp32 is traced: there the kernel's inputs are views or copies depending on shapes.
"""

from __future__ import annotations

from typing import Any

from ...dims import config_int, missing
from .layout import Layout, causal_backward_start, causal_loss_working

# DeepSeek-V3 (multi-head latent attention, the first k layers dense, the rest MoE with a shared expert and
# group-limited sigmoid routing), fitted in bf16-mixed and bf16-pure. Per token, by kind:
# attention (h, r_q, r_kv, heads·nope, heads·rope, heads·v, 1), the dense MLP's ·i, and the MoE's
# (·h extra, 1 extra, k·i_e, k·h, shared·i_e, E, k); (E, E·h) per MoE layer whatever the tokens.
# Its q and k are wider than v (192 and 128), so CPU sdpa runs the math kernel, which upcasts 16-bit inputs and
# keeps fp32 q, k, v and probabilities: 4·B·heads·S².
_MLA = {"bf16-pure": (16, 8, 8, 8, 8, 6, 16), "mixed": (24, 8, 8, 8, 8, 6, 16)}
_MLA_DENSE_I = 8
_MLA_MOE = {"bf16-pure": (4, 4, 8, 4, 8, 4, 40), "mixed": (2, 2, 16, 8, 8, 2, 36)}
_MLA_MOE_LAYER = {"bf16-pure": (4, 0), "mixed": (4, 2)}
_MLA_OUTSIDE = {"bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)}  # (T·h, T·V, S·rope, T)


def deepseek_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:

    names = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
             "num_experts_per_tok", "n_shared_experts", "vocab_size", "num_hidden_layers")
    values = {name: config_int(config, name) for name in names}
    if None in values.values():
        return missing(**values)
    h, heads, rq, rkv, nope, rope, v, inner, expert, experts, top_k, shared, vocab, layers = values.values()
    dense = getattr(config, "first_k_dense_replace", 0)
    if kind == "fp32":
        return "fp32 (fitted in bf16-mixed and bf16-pure: in fp32 the math kernel's inputs are views or copies " \
               "by shape)"
    if nope + rope <= v:
        return "q and k no wider than v (fitted: wider, so CPU sdpa runs its math kernel)"
    if getattr(config, "rope_interleave", True) is not True or getattr(config, "norm_topk_prob", True) is not True \
            or getattr(config, "moe_layer_freq", 1) != 1 or not isinstance(dense, int) or not 0 <= dense <= layers:
        return "another rotary layout, routing normalisation or MoE layer spacing (fitted: DeepSeek-V3's)"
    tokens = batch * seq
    a = _MLA[kind]
    attention = a[0] * h + a[1] * rq + a[2] * rkv + a[3] * heads * nope + a[4] * heads * rope + a[5] * heads * v + a[6]
    scores = 4 * batch * heads * seq * seq
    dense_layer = tokens * (attention + _MLA_DENSE_I * inner) + scores
    m = _MLA_MOE[kind]
    routed = m[0] * h + m[1] + m[2] * top_k * expert + m[3] * top_k * h + m[4] * shared * expert + m[5] * experts + \
        m[6] * top_k
    e_layer, eh_layer = _MLA_MOE_LAYER[kind]
    moe_layer = tokens * (attention + routed) + scores + e_layer * experts + eh_layer * experts * h
    th, tv, srope, t = _MLA_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + srope * seq * rope + t * tokens
    attention_text = (f"{a[0]}h + {a[1]}r_q + {a[2]}r_kv + {a[3]}·heads·nope + {a[4]}·heads·rope + "
                      f"{a[5]}·heads·v + {a[6]}")
    stack = dense * dense_layer + (layers - dense) * moe_layer
    stack_text = (f"{dense} dense layers × (T × ({attention_text} + {_MLA_DENSE_I}i) + 4·B·heads·S²) = "
                  f"{dense_layer:,} B + {layers - dense} MoE layers × (T × ({attention_text} + {m[0]}h + {m[1]} + "
                  f"{m[2]}k·i_e + {m[3]}k·h + {m[4]}·shared·i_e + {m[5]}E + {m[6]}k) + 4·B·heads·S² + {e_layer}E"
                  + (f" + the router's 16-bit copy {eh_layer}·E·h" if eh_layer else "") + f") = {moe_layer:,} B")
    return Layout(moe_layer, f"{moe_layer:,} B each (MoE)", outside,
                   f"{th}·T·h + {tv}·T·V + {srope}·S·rope + {t}·T = {outside:,} B", h, vocab, layers,
                   stack=(stack, stack_text),
                   # the training cache keeps each layer's compressed keys and values and its rotary key in fp32
                   loss_working=causal_loss_working(kind, batch, seq, h, layers, rkv + rope),
                   backward_start=causal_backward_start(batch, seq))
