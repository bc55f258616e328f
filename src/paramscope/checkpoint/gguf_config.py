"""A transformers config built from a GGUF header's metadata (never its tensors), as transformers builds it.

transformers loads a GGUF with `from_pretrained(..., gguf_file=...)`: `modeling_gguf_pytorch_utils.load_gguf_checkpoint`
renames the architecture (qwen2moe → qwen2_moe, gemma3 → gemma3_text, ...), maps `{arch}.{key}` metadata to config
fields with `integrations.ggml.GGUF_CONFIG_MAPPING`, applies `GGUF_CONFIG_DEFAULTS_MAPPING`, ties the head when the
file has no `output.weight`, and takes the vocabulary from `tokenizer.ggml.tokens` when no vocab_size is written. It
reads the file with gguf.GGUFReader (a numpy array per field, 18 s on a 262k-token vocabulary), so it is not called:
its tables are, over the metadata our bounded parser read (gguf_read.py), and its few steps are followed here.

Where transformers' table leaves out a field llama.cpp's convert_hf_to_gguf.py writes and the class needs for its
shapes (Qwen2-MoE's expert widths, a Mixtral written as `llama` with experts), a short supplement completes it; each
supplemented field is named in `notes`, so the output says which figures did not come from transformers' table.
For deepseek2 (DeepSeek-V2/V3, Kimi-K2), mamba2, jamba, lfm2moe, qwen3next, granitehybrid (Granite-4.0-H),
nemotron_h (Nemotron-H, dense), nemotron_h_moe (Nemotron-3 Nano/Super: transformers' one NemotronH class, its "moe"
layers) and falcon-h1, which transformers reads no GGUF of, the whole table is paramscope's
(OWN_MAPPINGS, from the converter's keys), and `notes` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SourceError
from ..errors import short_repr as _q
from ..frozen import thaw
from .gguf_read import GGUFCheckpoint

# load_gguf_checkpoint's renames: llama.cpp's architecture name → transformers' model_type.
_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2",
            "lfm2moe": "lfm2_moe", "qwen3next": "qwen3_next", "granitehybrid": "granitemoehybrid",
            "falcon-h1": "falcon_h1", "nemotron_h_moe": "nemotron_h"}
# After the mapping, transformers builds the text backbone alone for these (the file holds no vision tower).
_TEXT_ONLY = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
# Fields transformers' GGUF_CONFIG_MAPPING leaves out that llama.cpp writes and the class's shapes need:
# model_type → {metadata key after "{arch}.": config field}.
SUPPLEMENT: dict[str, dict[str, str]] = {
    "qwen2_moe": {"expert_feed_forward_length": "moe_intermediate_size",
                  "expert_shared_feed_forward_length": "shared_expert_intermediate_size"},
    "qwen3_moe": {"expert_feed_forward_length": "moe_intermediate_size"},
    "mixtral": {"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok"},
    "gemma2": {"attn_logit_softcapping": "attn_logit_softcapping",
               "final_logit_softcapping": "final_logit_softcapping"},
}
# Architectures transformers reads no GGUF of (no GGUF_CONFIG_MAPPING entry) whose config is built here, from the
# keys convert_hf_to_gguf.py writes (DeepseekV2Model.set_gguf_parameters, for DeepSeek-V2/V3 and Kimi-K2) to the
# transformers config's fields; said in `notes`.
OWN_MAPPINGS: dict[str, dict[str, str]] = {
    "deepseek2": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                  "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                  "attention.head_count": "num_attention_heads", "rope.freq_base": "rope_theta",
                  "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
                  "attention.q_lora_rank": "q_lora_rank", "attention.kv_lora_rank": "kv_lora_rank",
                  "rope.dimension_count": "qk_rope_head_dim", "expert_count": "n_routed_experts",
                  "expert_used_count": "num_experts_per_tok", "expert_shared_count": "n_shared_experts",
                  "expert_feed_forward_length": "moe_intermediate_size",
                  "leading_dense_block_count": "first_k_dense_replace", "expert_weights_scale": "routed_scaling_factor",
                  "expert_weights_norm": "norm_topk_prob", "expert_group_count": "n_group",
                  "expert_group_used_count": "topk_group"},
    # Mamba2Model.set_gguf_parameters (Mamba-Codestral, Mamba-2): the heads and widths are derived (_mamba2_fields)
    "mamba2": {"embedding_length": "hidden_size", "block_count": "num_hidden_layers",
               "ssm.conv_kernel": "conv_kernel", "ssm.state_size": "state_size", "ssm.group_count": "n_groups",
               "attention.layer_norm_rms_epsilon": "layer_norm_epsilon", "vocab_size": "vocab_size"},
    # JambaModel.set_gguf_parameters: its layer pattern (attention and expert layers) is derived (_jamba_fields)
    "jamba": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
              "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
              "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
              "ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
              "ssm.time_step_rank": "mamba_dt_rank", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
              "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"},
    # LFM2MoeModel.set_gguf_parameters (LFM2-8B-A1B): LFM2's keys and its experts'; layer kinds derived (_lfm2moe_fields)
    "lfm2moe": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
                "rope.freq_base": "rope_theta", "attention.layer_norm_rms_epsilon": "norm_eps",
                "vocab_size": "vocab_size", "shortconv.l_cache": "conv_L_cache", "expert_count": "num_experts",
                "expert_used_count": "num_experts_per_tok", "expert_feed_forward_length": "moe_intermediate_size",
                "leading_dense_block_count": "num_dense_layers"},
    # Qwen3NextModel.set_gguf_parameters (Qwen2MoeModel's keys and the gated delta net's as ssm.*); the value head
    # width, layer kinds and rotary fraction are derived (_qwen3next_fields)
    "qwen3next": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                  "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                  "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
                  "attention.key_length": "head_dim", "rope.freq_base": "rope_theta",
                  "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
                  "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
                  "expert_feed_forward_length": "moe_intermediate_size",
                  "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
                  "ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
                  "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads"},
    # GraniteHybridModel.set_gguf_parameters (Granite-4.0-H, Bamba): GraniteMoeModel's keys (Granite's multipliers
    # written as *_scale) and Mamba-2's as ssm.*; layer kinds, KV heads and the SSM widths derived
    # (_granitehybrid_fields)
    "granitehybrid": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                      "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                      "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
                      "rope.freq_base": "rope_theta", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
                      "vocab_size": "vocab_size", "expert_count": "num_local_experts",
                      "expert_used_count": "num_experts_per_tok",
                      "expert_shared_feed_forward_length": "shared_intermediate_size",
                      "attention.scale": "attention_multiplier", "embedding_scale": "embedding_multiplier",
                      "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling",
                      "ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
                      "ssm.group_count": "mamba_n_groups", "ssm.time_step_rank": "mamba_n_heads"},
    # NemotronHModel.set_gguf_parameters (Nemotron-H, dense): GraniteHybridModel's keys with per-layer FFN widths
    # (0 off an MLP layer) beside the per-layer KV heads, and the attention head width as key_length; layer kinds
    # and the SSM head width derived (_nemotron_h_fields)
    "nemotron_h": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                   "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                   "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
                   "attention.key_length": "head_dim", "attention.layer_norm_rms_epsilon": "layer_norm_epsilon",
                   "vocab_size": "vocab_size", "ssm.conv_kernel": "conv_kernel", "ssm.state_size": "ssm_state_size",
                   "ssm.group_count": "n_groups", "ssm.time_step_rank": "mamba_num_heads"},
    # FalconH1Model.set_gguf_parameters (Mamba2Model's keys, the attention's heads and head width, the FFN width):
    # every layer runs attention and Mamba-2 side by side; the SSM head width derived, the multipliers 1
    # (_falcon_h1_fields)
    "falcon-h1": {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
                  "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
                  "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
                  "attention.key_length": "head_dim", "rope.freq_base": "rope_theta",
                  "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
                  "ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
                  "ssm.group_count": "mamba_n_groups", "ssm.inner_size": "mamba_d_ssm",
                  "ssm.time_step_rank": "mamba_n_heads"},
}
# NemotronHModel.set_gguf_parameters with is_moe (Nemotron-3 Nano 30B-A3B, Super): the dense keys, the expert width per
# layer as feed_forward_length (0 off an MoE layer), the experts' keys and moe_latent_size; layer kinds and the SSM
# head width derived as for nemotron_h (_nemotron_h_fields)
OWN_MAPPINGS["nemotron_h_moe"] = {
    **OWN_MAPPINGS["nemotron_h"], "expert_count": "n_routed_experts", "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "moe_shared_expert_intermediate_size",
    "expert_shared_count": "n_shared_experts", "expert_weights_norm": "norm_topk_prob",
    "expert_weights_scale": "routed_scaling_factor", "expert_group_count": "n_group",
    "moe_latent_size": "moe_latent_size"}
# The largest figures a config built here may carry: past them the header is no model (a hostile file).
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 24


@dataclass(frozen=True)
class GGUFConfig:
    """The config dict transformers would build from a GGUF's metadata, and how it was built."""

    config: dict[str, Any]
    architecture: str  # llama.cpp's, as the file names it
    model_type: str
    class_name: str  # the causal-LM class transformers' AutoModelForCausalLM picks for model_type
    notes: tuple[str, ...]  # each step that is not a plain GGUF_CONFIG_MAPPING lookup, in words


def gguf_model_type(ck: GGUFCheckpoint) -> tuple[str, str]:
    """(llama.cpp's architecture, transformers' model_type) of a GGUF, as load_gguf_checkpoint renames it."""
    arch = ck.architecture
    if not arch:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: its metadata has no general.architecture")
    name = ck.metadata.get("general.name")
    if arch == "llama" and isinstance(name, str) and "mistral" in name.lower():
        return arch, "mistral"
    if arch == "llama" and _int(ck.metadata.get("llama.expert_count")):
        return arch, "mixtral"  # convert_hf_to_gguf.py writes Mixtral as llama with experts
    if arch == "deepseek2":  # DeepSeek-V2 and V3 alike; only V3's sigmoid router learns a score-correction bias
        return arch, "deepseek_v3" if any(t.name.endswith(".exp_probs_b.bias") for t in ck.tensors) else "deepseek_v2"
    return arch, _RENAMES.get(arch, arch)


def gguf_config(ck: GGUFCheckpoint) -> GGUFConfig:
    """The config transformers builds from `ck`'s metadata, or SourceError naming why none can be built."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch, model_type = gguf_model_type(ck)
    table_key = "llama" if model_type == "mixtral" else model_type
    mapping = GGUF_CONFIG_MAPPING.get(table_key) or OWN_MAPPINGS.get(arch)
    if mapping is None:
        known = ", ".join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")))
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: transformers has no config mapping for "
                          f"architecture {_q(arch)} (its GGUF_CONFIG_MAPPING knows {known}), nor has paramscope a "
                          f"table of its own for it yet (it has {', '.join(sorted(OWN_MAPPINGS))})")
    config: dict[str, Any] = {"model_type": model_type}
    notes: list[str] = []
    for key, field in mapping.items():
        value = ck.metadata.get(f"{arch}.{key}")
        if field is not None and field != -1 and value is not None:
            config[field] = _plain(thaw(value), f"{arch}.{key}", ck.path)
    for key, field in SUPPLEMENT.get(model_type, {}).items():
        value = ck.metadata.get(f"{arch}.{key}")
        if value is not None and field not in config:
            config[field] = _plain(thaw(value), f"{arch}.{key}", ck.path)
            notes.append(f"{field} from {arch}.{key} (not in transformers' GGUF_CONFIG_MAPPING for {table_key})")
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, {}).items():
        config.setdefault(key, value)
    if model_type == "lfm2":
        notes.append(_lfm2_layers(config, arch, ck.path))
    if arch in OWN_MAPPINGS and table_key not in GGUF_CONFIG_MAPPING:
        notes.append(_DERIVED[arch](config, ck, arch))
    if model_type in _TEXT_ONLY:
        config["model_type"] = model_type = _TEXT_ONLY[model_type]
    names = {t.name: t for t in ck.tensors}
    if "vocab_size" not in config:
        vocab = ck.hparams().get("vocab_size")
        if isinstance(vocab, int):
            config["vocab_size"] = vocab
            notes.append(f"vocab_size {vocab:,} from the length of tokenizer.ggml.tokens (as transformers takes it)")
        elif "token_embd.weight" in names and len(names["token_embd.weight"].shape) == 2:
            # transformers would fall back to the class's default vocabulary; the embedding's rows are the file's
            config["vocab_size"] = vocab = names["token_embd.weight"].shape[0]
            notes.append(f"vocab_size {vocab:,} from token_embd.weight's rows (the file has no tokenizer.ggml.tokens)")
    config["tie_word_embeddings"] = "output.weight" not in names or arch in ("falcon", "bloom")
    if config["tie_word_embeddings"] and arch not in ("falcon", "bloom"):
        notes.append("tie_word_embeddings: the file has no output.weight (llama.cpp reads token_embd for the head)")
    if model_type == "mixtral":
        notes.append("model_type mixtral: llama.cpp writes Mixtral as architecture llama with llama.expert_count")
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not isinstance(class_name, str):
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: transformers has no causal-LM class for "
                          f"model_type {_q(model_type)}")
    config["architectures"] = [class_name]
    _check_bounds(config, ck.path)
    return GGUFConfig(config=config, architecture=arch, model_type=model_type, class_name=class_name,
                      notes=tuple(notes))


def _lfm2_layers(config: dict[str, Any], arch: str, path: str) -> str:
    """load_gguf_checkpoint's LFM2 step: llama.cpp writes one KV-head count a layer (0 on a short-convolution layer);
    the class takes the layers with heads as full_attn_idxs, the largest count as num_key_value_heads, and the
    file's feed_forward_length as already adjusted (block_auto_adjust_ff_dim off)."""
    heads = config.get("num_key_value_heads")
    if isinstance(heads, (list, tuple)):
        counts = list(heads)
        if not counts or any(type(n) is not int or not 0 <= n <= MAX_WIDTH for n in counts):
            raise SourceError(f"{path}: cannot build a model from this GGUF: {arch}.attention.head_count_kv = "
                              f"{_q(heads)} is no list of head counts")
        config["num_key_value_heads"] = max(counts)
        config["full_attn_idxs"] = [i for i, n in enumerate(counts) if n > 0]
    config["block_auto_adjust_ff_dim"] = False
    layers = (f"full_attn_idxs {config['full_attn_idxs']} (the layers with KV heads in {arch}.attention."
              "head_count_kv), num_key_value_heads the largest count, " if "full_attn_idxs" in config else "")
    return f"{layers}block_auto_adjust_ff_dim off (feed_forward_length is the adjusted width): transformers' LFM2 step"


def _mla_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """MLA's head widths, which the converter writes in two layouts: today key_length_mla = qk_nope + qk_rope and
    value_length_mla = v_head_dim (key_length and value_length then hold the latent's kv_lora_rank + rope and
    kv_lora_rank); before those keys, key_length = qk_nope + qk_rope and value_length = v_head_dim. It writes one KV
    head (MLA as MQA); the class takes as many as query heads. No q_lora_rank: the class's plain q_proj (V2-Lite)."""
    meta = ck.metadata
    key = meta.get(f"{arch}.attention.key_length_mla", meta.get(f"{arch}.attention.key_length"))
    value = meta.get(f"{arch}.attention.value_length_mla", meta.get(f"{arch}.attention.value_length"))
    rope = config.get("qk_rope_head_dim")
    for field, v in (("attention.key_length(_mla)", key), ("attention.value_length(_mla)", value),
                     ("rope.dimension_count", rope)):
        if type(v) is not int or not 0 < v <= MAX_WIDTH:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no "
                              "head width")
    if key <= rope:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.attention.key_length(_mla) = {key} "
                          f"leaves no qk_nope_head_dim beside the rope's {rope}")
    config["qk_nope_head_dim"], config["v_head_dim"] = key - rope, value
    config.setdefault("q_lora_rank", None)
    if "num_attention_heads" in config:
        config["num_key_value_heads"] = config["num_attention_heads"]
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; qk_nope_head_dim {key - rope} and v_head_dim {value} from attention.key_length(_mla) and "
            "value_length(_mla), num_key_value_heads = num_attention_heads (the file's one KV head is MLA as MQA)")


def _mamba2_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Mamba-2's heads from what the converter writes: ssm.time_step_rank is d_inner // head_dim, the number of
    heads (Mamba2Model.set_gguf_parameters), ssm.inner_size d_inner; the class takes num_heads, head_dim and
    expand = d_inner / hidden_size (an int in transformers' Mamba2Config; Mamba2Mixer's intermediate_size is
    expand · hidden_size)."""
    meta = ck.metadata
    heads, inner = meta.get(f"{arch}.ssm.time_step_rank"), meta.get(f"{arch}.ssm.inner_size")
    hidden = config.get("hidden_size")
    for field, v in (("ssm.time_step_rank", heads), ("ssm.inner_size", inner), ("embedding_length", hidden)):
        if type(v) is not int or not 0 < v <= MAX_WIDTH:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no width")
    if inner % heads or inner % hidden:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is no "
                          f"whole number of heads ({arch}.ssm.time_step_rank = {heads:,}) or of widths "
                          f"({arch}.embedding_length = {hidden:,}): the class takes an integer expand")
    config.update(num_heads=heads, head_dim=inner // heads, expand=inner // hidden)
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; num_heads {heads} from ssm.time_step_rank, head_dim {inner // heads} and expand {inner // hidden} "
            "from ssm.inner_size")


def _heads_per_layer(config: dict[str, Any], arch: str, path: str) -> list[int]:
    """The converter's per-layer KV-head counts (0 on a layer with no attention); the class takes the largest."""
    heads = config.get("num_key_value_heads")
    counts = list(heads) if isinstance(heads, (list, tuple)) else None
    layers = config.get("num_hidden_layers")
    if counts is None or len(counts) != layers or any(type(n) is not int or not 0 <= n <= MAX_WIDTH for n in counts):
        raise SourceError(f"{path}: cannot build a model from this GGUF: {arch}.attention.head_count_kv = {_q(heads)} "
                          f"is no list of {_q(layers)} per-layer head counts")
    config["num_key_value_heads"] = max(counts)
    return counts


def _period(layers: list[int], n: int) -> tuple[int, int] | None:
    """(period, offset) such that layer i is in `layers` exactly when i % period == offset (as JambaConfig lays its
    attention and expert layers out), or None when no such pattern holds them."""
    if not layers:
        return n + 1, n
    period = layers[1] - layers[0] if len(layers) > 1 else n
    offset = layers[0] % period
    return (period, offset) if [i for i in range(n) if i % period == offset] == layers else None


def _blocks_holding(ck: GGUFCheckpoint, suffix: str) -> list[int]:
    found = set()
    for t in ck.tensors:
        head, _, rest = t.name.partition(".")
        index, _, name = rest.partition(".")
        if head == "blk" and index.isdigit() and name == suffix:
            found.add(int(index))
    return sorted(found)


def _jamba_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Jamba's layer pattern, which JambaModel.set_gguf_parameters writes only as per-layer KV heads (attention
    layers: heads > 0) and the tensors hold (expert layers: ffn_gate_exps): JambaConfig's attn_layer_period/offset and
    expert_layer_period/offset, refused when no period fits; mamba_expand = ssm.inner_size / embedding_length (an
    int in JambaConfig); the conv and in_proj biases as the file holds them."""
    n = config.get("num_hidden_layers")
    if type(n) is not int or not 0 < n <= MAX_LAYERS:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.block_count = {_q(n)} is no "
                          "layer count")
    counts = _heads_per_layer(config, arch, ck.path)
    attention = [i for i, c in enumerate(counts) if c > 0]
    experts = _blocks_holding(ck, "ffn_gate_exps.weight")
    for what, layers, fields in (("attention", attention, ("attn_layer_period", "attn_layer_offset")),
                                 ("expert", experts, ("expert_layer_period", "expert_layer_offset"))):
        pattern = _period(layers, n)
        if pattern is None:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: its {what} layers {layers} follow no "
                              "period JambaConfig can lay out (layer i when i % period == offset)")
        config[fields[0]], config[fields[1]] = pattern
    inner, hidden = ck.metadata.get(f"{arch}.ssm.inner_size"), config.get("hidden_size")
    for field, v in (("ssm.inner_size", inner), ("embedding_length", hidden)):
        if type(v) is not int or not 0 < v <= MAX_WIDTH:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no width")
    if inner % hidden:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is no "
                          f"whole number of widths ({arch}.embedding_length = {hidden:,}): JambaConfig takes an "
                          "integer mamba_expand")
    names = {t.name for t in ck.tensors}
    mamba = [i for i in range(n) if i not in attention]
    config.update(mamba_expand=inner // hidden, use_mamba_kernels=False,
                  mamba_conv_bias=bool(mamba) and f"blk.{mamba[0]}.ssm_conv1d.bias" in names,
                  mamba_proj_bias=bool(mamba) and f"blk.{mamba[0]}.ssm_in.bias" in names)
    if not experts:
        config["num_experts"] = 1  # every layer's FFN dense: JambaConfig's one-expert layers are plain MLPs
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; attention layers {attention} (KV heads > 0 in attention.head_count_kv) as attn_layer_period "
            f"{config['attn_layer_period']}, offset {config['attn_layer_offset']}; expert layers {experts} (the blocks "
            f"holding ffn_gate_exps) as expert_layer_period {config['expert_layer_period']}, offset "
            f"{config['expert_layer_offset']}; mamba_expand {inner // hidden} from ssm.inner_size")


def _lfm2moe_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """LFM2-MoE's layer kinds from the converter's per-layer KV heads (0 on a short-convolution layer) as
    Lfm2MoeConfig's layer_types; the router's expert_bias (exp_probs_b) as the file holds it."""
    counts = _heads_per_layer(config, arch, ck.path)
    config["layer_types"] = ["full_attention" if c > 0 else "conv" for c in counts]
    config["use_expert_bias"] = any(t.name.endswith(".exp_probs_b.bias") for t in ck.tensors)
    if "rope_theta" in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    attention = [i for i, c in enumerate(counts) if c > 0]
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; layer_types: full_attention at {attention} (KV heads > 0 in attention.head_count_kv), conv "
            f"elsewhere; use_expert_bias {config['use_expert_bias']} (exp_probs_b in the file)")


def _qwen3next_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Qwen3-Next's value head width (ssm.inner_size / ssm.time_step_rank: the converter writes d_inner = value
    heads × width), its layer kinds (full attention where a block holds attn_q, the gated delta net elsewhere) and
    the rotary fraction (rope.dimension_count / head_dim)."""
    meta = ck.metadata
    inner, heads = meta.get(f"{arch}.ssm.inner_size"), config.get("linear_num_value_heads")
    layers = config.get("num_hidden_layers")
    for field, v in (("ssm.inner_size", inner), ("ssm.time_step_rank", heads), ("block_count", layers)):
        if type(v) is not int or not 0 < v <= MAX_WIDTH:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no width")
    if inner % heads:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is no "
                          f"whole number of value heads ({arch}.ssm.time_step_rank = {heads:,})")
    config["linear_value_head_dim"] = inner // heads
    full = set(_blocks_holding(ck, "attn_q.weight"))
    config["layer_types"] = ["full_attention" if i in full else "linear_attention" for i in range(layers)]
    rope, head_dim = meta.get(f"{arch}.rope.dimension_count"), config.get("head_dim")
    if type(rope) is int and type(head_dim) is int and 0 < rope <= head_dim:
        config["partial_rotary_factor"] = rope / head_dim
    if "rope_theta" in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta"),
                                     "partial_rotary_factor": config.get("partial_rotary_factor", 0.25)}
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; linear_value_head_dim {inner // heads} from ssm.inner_size / ssm.time_step_rank; full attention "
            f"at {sorted(full)} (the blocks holding attn_q), the gated delta net elsewhere")


def _granitehybrid_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Granite-4 hybrid's layer kinds from the converter's per-layer KV heads (0 on a Mamba-2 layer) as
    GraniteMoeHybridConfig's layer_types; mamba_expand = ssm.inner_size / embedding_length (the converter writes
    d_inner = expand × hidden) and mamba_d_head = ssm.inner_size / ssm.time_step_rank (the heads); no experts
    (expert_count 0 or absent, Granite-4.0-H-Micro): the shared MLP alone, written as a dense FFN, whose width the
    converter takes from shared_intermediate_size; the conv and in_proj biases as the file holds them."""
    counts = _heads_per_layer(config, arch, ck.path)
    meta = ck.metadata
    inner, hidden, heads = meta.get(f"{arch}.ssm.inner_size"), config.get("hidden_size"), config.get("mamba_n_heads")
    mamba = [i for i, c in enumerate(counts) if c == 0]
    if mamba:
        for field, v in (("ssm.inner_size", inner), ("embedding_length", hidden), ("ssm.time_step_rank", heads)):
            if type(v) is not int or not 0 < v <= MAX_WIDTH:
                raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no "
                                  "width")
        if inner % hidden or inner % heads:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is "
                              f"no whole number of widths ({arch}.embedding_length = {hidden:,}) and of heads "
                              f"({arch}.ssm.time_step_rank = {heads:,}): GraniteMoeHybridConfig takes an integer "
                              "mamba_expand and mamba_d_head")
        config.update(mamba_expand=inner // hidden, mamba_d_head=inner // heads)
    config["layer_types"] = ["attention" if c > 0 else "mamba" for c in counts]
    config.setdefault("num_local_experts", 0)
    if not config["num_local_experts"]:
        config["shared_intermediate_size"] = config.get("shared_intermediate_size") or config.get("intermediate_size")
    names = {t.name for t in ck.tensors}
    config.update(mamba_conv_bias=bool(mamba) and f"blk.{mamba[0]}.ssm_conv1d.bias" in names,
                  mamba_proj_bias=bool(mamba) and f"blk.{mamba[0]}.ssm_in.bias" in names)
    if meta.get(f"{arch}.rope.scaling.finetuned") is True:
        config["position_embedding_type"] = "rope"  # Bamba (or a hybrid with no Mamba layer): the converter's use_rope
    if "rope_theta" in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    attention = [i for i, c in enumerate(counts) if c > 0]
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; layer_types: attention at {attention} (KV heads > 0 in attention.head_count_kv), mamba elsewhere"
            + (f"; mamba_expand {config['mamba_expand']}, mamba_d_head {config['mamba_d_head']} from ssm.inner_size"
               if mamba else "")
            + ("" if config["num_local_experts"] else "; no experts: the shared MLP alone (ffn_gate/up/down)"))


def _nemotron_h_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Nemotron-H's layer kinds from the converter's per-layer KV heads (attention where > 0) and FFN widths (an
    MLP layer where > 0, an MoE layer in nemotron_h_moe; Mamba-2 where both are 0, as llama-model.cpp's
    recurrent_layer_arr) as NemotronHConfig's layers_block_type; the class takes the largest of each (an MoE file's
    widths are the experts' moe_intermediate_size, which the class's unused intermediate_size takes too);
    mamba_head_dim = ssm.inner_size / ssm.time_step_rank (the converter writes d_inner = heads × head width); the
    biases as the file holds them."""
    counts = _heads_per_layer(config, arch, ck.path)
    widths = config.get("intermediate_size")
    widths = list(widths) if isinstance(widths, (list, tuple)) else widths
    if not isinstance(widths, list) or len(widths) != len(counts) or any(
            type(n) is not int or not 0 <= n <= MAX_WIDTH for n in widths):
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.feed_forward_length = "
                          f"{_q(widths)} is no list of {len(counts)} per-layer widths")
    if any(c and w for c, w in zip(counts, widths)):
        mtp = ck.metadata.get(f"{arch}.nextn_predict_layers")
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: a layer has both KV heads and an FFN "
                          f"width in {arch}.attention.head_count_kv and feed_forward_length: Nemotron-H's layers hold "
                          "one mixer each" + (f" (the file holds {_q(mtp)} multi-token-prediction block(s), "
                                               f"{arch}.nextn_predict_layers, which transformers' class does not "
                                               "build)" if mtp else ""))
    moe = arch == "nemotron_h_moe"
    ffn = "moe" if moe else "mlp"
    kinds = ["attention" if c else ffn if w else "mamba" for c, w in zip(counts, widths)]
    config["layers_block_type"] = kinds
    config["intermediate_size"] = max(widths)
    moe_note = ""
    if moe:
        used = sorted({w for w in widths if w})
        expert = config.setdefault("moe_intermediate_size", used[0] if used else 0)
        if any(w != expert for w in used):
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.feed_forward_length's MoE "
                              f"widths {used} are not one expert width ({arch}.expert_feed_forward_length = "
                              f"{_q(expert)}): NemotronHConfig takes one moe_intermediate_size")
        if not config.get("n_routed_experts"):
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.expert_count = "
                              f"{_q(config.get('n_routed_experts'))}: an MoE layer needs experts")
        # llama.cpp's build_moe_ffn groups experts only for DeepSeek-style configs; the converter writes
        # expert_group_count and no group top-k: the class's topk_group follows n_group (all groups eligible)
        config.setdefault("n_group", 1)
        config["topk_group"] = config["n_group"]
        moe_note = (f"; moe_intermediate_size {expert} (the MoE layers' feed_forward_length), topk_group = n_group "
                    f"{config['n_group']} (the converter writes no group top-k)")
    mamba = [i for i, k in enumerate(kinds) if k == "mamba"]
    if mamba:
        inner, heads = ck.metadata.get(f"{arch}.ssm.inner_size"), config.get("mamba_num_heads")
        for field, v in (("ssm.inner_size", inner), ("ssm.time_step_rank", heads)):
            if type(v) is not int or not 0 < v <= MAX_WIDTH:
                raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no "
                                  "width")
        if inner % heads:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is "
                              f"no whole number of heads ({arch}.ssm.time_step_rank = {heads:,})")
        config["mamba_head_dim"] = inner // heads
    names = {t.name for t in ck.tensors}

    def first(kind: str, tensor: str) -> bool:
        return any(f"blk.{i}.{tensor}" in names for i, k in enumerate(kinds) if k == kind)

    config.update(use_conv_bias=first("mamba", "ssm_conv1d.bias"), use_bias=first("mamba", "ssm_in.bias"),
                  mlp_bias=first(ffn, "ffn_up.bias" if ffn == "mlp" else "ffn_up_shexp.bias"),
                  attention_bias=first("attention", "attn_q.bias"), use_mamba_kernels=False)
    where = {k: [i for i, x in enumerate(kinds) if x == k] for k in ("mamba", "attention", ffn)}
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; layers_block_type: attention at {where['attention']} (KV heads > 0 in attention.head_count_kv), "
            f"{ffn} at {where[ffn]} (feed_forward_length > 0), mamba at {where['mamba']}"
            + (f"; mamba_head_dim {config['mamba_head_dim']} from ssm.inner_size / ssm.time_step_rank"
               if mamba else "") + moe_note)


def _falcon_h1_fields(config: dict[str, Any], ck: GGUFCheckpoint, arch: str) -> str:
    """Falcon-H1's SSM head width (ssm.inner_size / ssm.time_step_rank), its gated norm, biases and multipliers:
    FalconH1Model.modify_tensors multiplies each multiplier into the weights it writes (embedding, lm_head,
    attention in/out, key, SSM in/out and the five zxbcdt slices of in_proj, the MLP's gate and down) and writes no
    key for any, so the class that computes what the file holds takes them all as 1."""
    inner, heads = config.get("mamba_d_ssm"), config.get("mamba_n_heads")
    for field, v in (("ssm.inner_size", inner), ("ssm.time_step_rank", heads)):
        if type(v) is not int or not 0 < v <= MAX_WIDTH:
            raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.{field} = {_q(v)} is no width")
    if inner % heads:
        raise SourceError(f"{ck.path}: cannot build a model from this GGUF: {arch}.ssm.inner_size = {inner:,} is no "
                          f"whole number of heads ({arch}.ssm.time_step_rank = {heads:,})")
    names = {t.name for t in ck.tensors}
    config.update(mamba_d_head=inner // heads, mamba_rms_norm="blk.0.ssm_norm.weight" in names,
                  mamba_conv_bias="blk.0.ssm_conv1d.bias" in names, mamba_proj_bias="blk.0.ssm_in.bias" in names,
                  attention_bias="blk.0.attn_q.bias" in names, projectors_bias="blk.0.ffn_up.bias" in names,
                  embedding_multiplier=1.0, lm_head_multiplier=1.0, attention_in_multiplier=1.0,
                  attention_out_multiplier=1.0, key_multiplier=1.0, ssm_in_multiplier=1.0, ssm_out_multiplier=1.0,
                  mlp_multipliers=[1.0, 1.0], ssm_multipliers=[1.0] * 5)
    if "rope_theta" in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    return (f"config from paramscope's table for {arch} (transformers reads no {arch} GGUF): convert_hf_to_gguf.py's "
            f"keys; mamba_d_head {inner // heads} from ssm.inner_size / ssm.time_step_rank; mamba_rms_norm "
            f"{config['mamba_rms_norm']} (ssm_norm in the file); every multiplier 1 (the converter multiplies them "
            "into the weights and writes no key for them)")


# How each architecture of OWN_MAPPINGS derives the fields its keys give no value of directly.
_DERIVED = {"deepseek2": _mla_fields, "mamba2": _mamba2_fields, "jamba": _jamba_fields,
            "lfm2moe": _lfm2moe_fields, "qwen3next": _qwen3next_fields, "granitehybrid": _granitehybrid_fields,
            "nemotron_h": _nemotron_h_fields, "nemotron_h_moe": _nemotron_h_fields, "falcon-h1": _falcon_h1_fields}


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _plain(value: Any, key: str, path: str) -> Any:
    if isinstance(value, dict):  # a long array the parser summarised: no config field takes one
        raise SourceError(f"{path}: metadata {key} is an array of {value.get('length', '?'):,} items, not a value a "
                          "config takes")
    return value


def _check_bounds(config: dict[str, Any], path: str) -> None:
    """A hostile header's 10^12 layers or widths would make the meta build itself the attack: refused in one line."""
    for field, bound in (("num_hidden_layers", MAX_LAYERS), ("hidden_size", MAX_WIDTH),
                         ("intermediate_size", MAX_WIDTH), ("num_attention_heads", MAX_WIDTH),
                         ("vocab_size", MAX_VOCAB), ("max_position_embeddings", MAX_CONTEXT),
                         ("num_experts", MAX_LAYERS), ("num_local_experts", MAX_LAYERS),
                         ("n_routed_experts", MAX_LAYERS), ("n_shared_experts", MAX_LAYERS),
                         ("first_k_dense_replace", MAX_LAYERS), ("kv_lora_rank", MAX_WIDTH),
                         ("q_lora_rank", MAX_WIDTH), ("moe_intermediate_size", MAX_WIDTH),
                         ("moe_shared_expert_intermediate_size", MAX_WIDTH),
                         ("moe_latent_size", MAX_WIDTH)):
        value = config.get(field)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if type(v) is not int or not 0 <= v <= bound:
                raise SourceError(f"{path}: cannot build a model from this GGUF: {field} = {_q(value)} from its "
                                  f"metadata is no count between 0 and {bound:,}")
