"""Canonical roles: one per parameter, from its canonical name and the types of the modules that hold it.

The rules are data: per-family tables of `Rule`s, tried in order; the first match wins. Order matters where
names nest (BERT's `attention.output.dense` is attention, a layer's bare `output.dense` is the MLP) and where one
family's name means something else in another (BART's per-layer `final_layer_norm` is the MLP's norm, T5's
stack-level one is the final norm). Whole modules whose insides look like attention or embeddings (SAM's mask
decoder, a projector, an indexer) are claimed first. After the family tables comes a generic classifier that
works from module types (`*Embedding`, `*Norm`, `*Experts`, `*Router`, `Conv2d`, `BatchNorm2d`, `LSTM`) and
common name fragments (`attn`, `mlp`, `q_proj`, …). It never guesses a name that could be wrong (a batch norm is
no final norm); a parameter that nothing recognises gets the role `other`, and reports list it by name.

`role_of(name, types)` takes the parameter's canonical name and, optionally, the class names of the modules on
its path from the root to the module that owns it (`types[-1]` is the owner). Rules that need types never
match without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OTHER = "other"

# (role, description) in display order; docs/roles.md documents the same list.
ROLES: tuple[tuple[str, str], ...] = (
    ("embeddings.word", "token (word) embedding matrix, V×E"),
    ("embeddings.position", "learned absolute position embeddings, L×E"),
    ("embeddings.token_type", "segment (token type) embeddings, T×E"),
    ("embeddings.projection", "factorised-embedding projection from embedding width E to hidden width D (ALBERT)"),
    ("embeddings.norm", "normalisation applied to the summed embeddings"),
    ("vision.patch_embedding", "patch embedding: the convolution or linear map from image patches to the model width"),
    ("vision.class_token", "learned class (and distillation) tokens prepended to the patch sequence"),
    ("vision.mask_token", "learned token that replaces masked patches (DINOv2, BEiT)"),
    ("vision.neck", "convolutional neck after a vision encoder, with its norms (SAM)"),
    ("vision.patch_merging", "patch merging between stages of a hierarchical vision encoder: 2×2 patches "
     "concatenated, normalised and projected (Swin's downsample)"),
    ("audio.conv", "convolutional audio front-end over the spectrogram or waveform, with its norms"),
    ("audio.feature_projection", "projection of the convolutional features to the encoder width, with its norm"),
    ("audio.position_conv", "convolutional relative position embedding (wav2vec2 pos_conv_embed)"),
    ("audio.mask_embedding", "learned vector that replaces masked time steps (wav2vec2 masked_spec_embed)"),
    ("projector", "multimodal projector or merger from an encoder's features into the language model's width"),
    ("attention.query", "query projection"),
    ("attention.key", "key projection"),
    ("attention.value", "value projection"),
    ("attention.qkv", "fused query/key/value projection"),
    ("attention.q_down", "low-rank query down-projection D→r_q (MLA, DeepSeek q_a_proj)"),
    ("attention.q_up", "low-rank query up-projection r_q→H·d (MLA, DeepSeek q_b_proj)"),
    ("attention.kv_down", "joint key/value down-projection to the latent plus the shared RoPE key (MLA kv_a_proj_with_mqa)"),
    ("attention.kv_up", "key/value up-projection from the latent (MLA kv_b_proj)"),
    ("attention.latent_norm", "normalisation of the MLA query/key-value latents"),
    ("attention.output", "attention output projection"),
    ("attention.relative_bias", "learned relative-position bias, buckets×heads (T5)"),
    ("attention.relative_position", "relative-position embeddings shared by every layer's attention, and the "
     "projections that read them (DeBERTa)"),
    ("attention.temperature", "learned per-head temperature of cosine attention (Swin v2 logit_scale)"),
    ("attention.sinks", "learned per-head attention-sink logits (gpt-oss)"),
    ("attention.indexer", "attention indexer that scores keys to pick the ones each query attends to (DeepSeek-V3.2)"),
    ("attention.norm", "normalisation around the attention block (pre-, post- or q/k-norm)"),
    ("cross_attention.query", "cross-attention query projection (decoder attending to the encoder)"),
    ("cross_attention.key", "cross-attention key projection"),
    ("cross_attention.value", "cross-attention value projection"),
    ("cross_attention.output", "cross-attention output projection"),
    ("cross_attention.norm", "normalisation around the cross-attention block"),
    ("mlp.gate", "gate projection of a gated MLP (SwiGLU/GeGLU)"),
    ("mlp.up", "MLP up projection (BERT 'intermediate')"),
    ("mlp.gate_up", "fused gate and up projections"),
    ("mlp.down", "MLP down projection (BERT 'output.dense')"),
    ("mlp.norm", "normalisation around the MLP block"),
    ("moe.router", "mixture-of-experts router: token→expert scores (and its bias)"),
    ("moe.experts", "routed experts' MLPs, all E of them (fused [E, …] tensors or per-expert modules)"),
    ("moe.shared_experts", "shared experts every token passes through, with their gate (DeepSeek, Qwen2-MoE)"),
    ("mixer.norm", "normalisation before a hybrid layer's token mixer, whichever kind the layer runs"),
    ("mixer.conv", "short-convolution token mixer: gating input projection, causal depthwise convolution, output "
     "projection (LFM2)"),
    ("linear_attention.in_proj", "linear-attention input projections: queries, keys, values, output gate, "
     "beta and decay gates (Gated DeltaNet)"),
    ("linear_attention.conv", "linear attention's causal depthwise convolution over queries, keys and values"),
    ("linear_attention.decay", "per-head decay parameters of linear attention (A_log, dt_bias)"),
    ("linear_attention.norm", "linear attention's gated output normalisation"),
    ("linear_attention.output", "linear-attention output projection"),
    ("ssm.in_proj", "state-space input projection (Mamba in_proj: the x and gate branches)"),
    ("ssm.conv", "state-space block's causal depthwise convolution"),
    ("ssm.x_proj", "projection to the input-dependent step, B and C (Mamba x_proj)"),
    ("ssm.dt_proj", "step-size (Δ) projection, with its bias (Mamba dt_proj)"),
    ("ssm.state", "per-channel state-space parameters: A (A_log), the skip D, the step bias dt_bias"),
    ("ssm.norm", "normalisation around or inside a state-space block"),
    ("ssm.output", "state-space output projection"),
    ("recurrent.input", "input-to-hidden weights and biases of LSTM/GRU/RNN layers, all gates stacked"),
    ("recurrent.hidden", "hidden-to-hidden (recurrent) weights and biases of LSTM/GRU/RNN layers, and LSTM "
     "projections"),
    ("conv.stem", "the stem: the first convolutions (or patchify layer) and their norms, before the first stage"),
    ("conv.layer", "convolutions of the body: weights and biases"),
    ("conv.norm", "normalisation inside convolutional blocks (batch norm, or ConvNeXt's layer norm)"),
    ("conv.downsample", "downsampling between stages: a residual shortcut projection or a strided convolution, "
     "with its norm"),
    ("segmentation.prompt_encoder", "prompt encoder: point, box and mask prompt embeddings (SAM)"),
    ("segmentation.mask_decoder", "mask decoder: its two-way transformer, output tokens, upscaling convolutions, "
     "hypernetwork MLPs and IoU head (SAM)"),
    ("layer_scale", "learned per-channel scale of a residual block's output (ConvNeXt, DINOv2, BEiT)"),
    ("encoder.conv", "convolution branch beside the first encoder layer, with its norm (DeBERTa-v2 conv_kernel_size)"),
    ("norm.final", "final normalisation after the last layer"),
    ("pooler", "pooler: dense layer over the first token, or attention pooling (SigLIP's head)"),
    ("head.transform", "dense transform inside a head (MLM transform, pre-classifier)"),
    ("head.transform_norm", "normalisation inside a head's transform"),
    ("head.decoder", "untied MLM decoder weight (vocabulary projection)"),
    ("head.bias", "MLM output (vocabulary) bias"),
    ("head.lm", "language-modelling head (vocabulary projection)"),
    ("head.nsp", "next-sentence or sentence-order prediction head"),
    ("head.classifier", "task classifier (sequence or token classification, multiple choice, ELECTRA's detector)"),
    ("head.qa", "question-answering span head"),
    ("head.auxiliary", "auxiliary classifiers used in training only (GoogLeNet aux1/aux2, Inception AuxLogits)"),
    ("head.contrastive", "contrastive image–text head: projections into the joint space, learned logit scale and "
     "bias (CLIP, SigLIP)"),
    (OTHER, "parameters no rule recognised; listed by name"),
)
ROLE_ORDER = {role: i for i, (role, _) in enumerate(ROLES)}


@dataclass(frozen=True)
class Rule:
    """`pattern` searched in the canonical name; `owner`/`within` searched in module class names."""

    pattern: str
    role: str
    owner: str | None = None  # must match the owning module's class name (types[-1])
    parent: str | None = None  # must match the owner's parent's class name (types[-2])
    within: str | None = None  # must match some module on the path (any of types)

    def compiled(self) -> "_Compiled":
        return _Compiled(
            re.compile(self.pattern),
            self.role,
            re.compile(self.owner) if self.owner else None,
            re.compile(self.parent) if self.parent else None,
            re.compile(self.within) if self.within else None,
        )


@dataclass(frozen=True)
class _Compiled:
    pattern: re.Pattern
    role: str
    owner: re.Pattern | None
    parent: re.Pattern | None
    within: re.Pattern | None

    def matches(self, name: str, types: tuple[str, ...]) -> bool:
        if not self.pattern.search(name):
            return False
        if self.owner is not None and not (types and self.owner.search(types[-1])):
            return False
        if self.parent is not None and not (len(types) > 1 and self.parent.search(types[-2])):
            return False
        if self.within is not None and not any(self.within.search(t) for t in types):
            return False
        return True


# Attention-module attribute names, as they appear in front of the projections.
_ATTN = r"(?:attention\.self|attention|self_attn|self_attention|attn|SelfAttention|self)"
_CROSS = r"(?:encoder_attn|EncDecAttention|crossattention\.self|crossattention|cross_attn|cross_attention)"
# Decoder layers that put norms on both sides of each block ("sandwich"): their post_attention_layernorm
# normalises the attention output, not the MLP input.
_SANDWICH_LAYERS = r"^(?:Gemma2|Gemma3|Gemma3n|T5Gemma|Olmo2|Olmo3|Cohere2|Exaone4)\w*(?:DecoderLayer|Layer)$"

# Hybrid layers whose token mixer (attention, linear attention, short convolution) varies by layer under one
# layer class: their pre-mixer norm cannot be told apart by type, so it is the mixer's norm, not attention's.
# Falcon-H1's one norm feeds its attention and Mamba-2 side by side.
_HYBRID_LAYERS = r"^(?:Qwen3Next|Qwen3_5|Qwen3_5Moe|Lfm2|Lfm2Moe|GraniteMoeHybrid|FalconH1)DecoderLayer$"
# Speech encoders of the wav2vec2 line (HuBERT, WavLM, Data2Vec-audio, UniSpeech share its layout).
_SPEECH = r"^(?:Wav2Vec2|Wav2Vec2Conformer|Hubert|WavLM|Data2VecAudio|UniSpeech|UniSpeechSat|SEW)"
_CONV_MODULE = r"^\w*(?:Conv|ConvTranspose)[123]d$"  # torch's and subclasses (EfficientNetDepthwiseConv2d)
_CONV_NORM = r"^(?:BatchNorm[123]d|SyncBatchNorm|LazyBatchNorm[123]d|GroupNorm|InstanceNorm[123]d|\w*BatchNorm\w*)$"

# Whole modules whose parts are named like attention or embeddings but belong to one larger unit: SAM's prompt
# encoder and mask decoder, attention-pooling heads, multimodal projectors, attention indexers. Tried first.
MODULE_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)prompt_encoder\.", "segmentation.prompt_encoder", within=r"PromptEncoder$"),
    Rule(r"(^|\.)mask_decoder\.", "segmentation.mask_decoder", within=r"MaskDecoder$"),
    Rule(r"(^|\.)head\.", "pooler", within=r"MultiheadAttentionPoolingHead$"),  # SigLIP: probe, attention, MLP
    Rule(r"(^|\.)(multi_modal_projector|mm_projector)\.|(^|\.)visual\.(merger|deepstack_merger_list)\."
         r"|(^|\.)connector\.modality_projection\.",
         "projector"),
    Rule(r"\.indexer\.", "attention.indexer"),  # DeepSeek-V3.2 lightning indexer: wq_b, wk, k_norm, weights_proj
    Rule(r"(^|\.)(aux\d*|AuxLogits|aux_classifier)\.", "head.auxiliary"),
)

VISION_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)(patch_embeddings?|patch_embed)\.(projection|proj)\.|(^|\.)patch_embedding\.",
         "vision.patch_embedding"),
    # Fuyu has no vision encoder: vision_embed_tokens maps raw pixel patches straight to the decoder's width
    Rule(r"(^|\.)vision_embed_tokens\.", "vision.patch_embedding"),
    Rule(r"(^|\.)(cls_token|class_embedding|class_token|distillation_token)$", "vision.class_token"),
    Rule(r"(^|\.)embeddings\.mask_token$", "vision.mask_token"),
    Rule(r"(^|\.)neck\.", "vision.neck"),
    Rule(r"\.downsample\.(reduction|norm)\.", "vision.patch_merging", within=r"PatchMerging$"),
    # Swin's windowed attention keeps a learned bias per relative offset and head, as T5 does per bucket; Swin v2
    # computes it with a small MLP from log-spaced offsets, and scales cosine attention by a learned temperature
    Rule(r"\.relative_position_bias_table$|\.continuous_position_bias_mlp\.", "attention.relative_bias"),
    Rule(r"\.attention\.self\.logit_scale$", "attention.temperature"),
    # CLIP's pre_layrnorm (sic) normalises the summed patch, class and position embeddings
    Rule(r"(^|\.)(pre_layrnorm|pre_layernorm)\.", "embeddings.norm"),
)

AUDIO_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)(encoder|audio_tower)\.conv[12]\.", "audio.conv"),  # Whisper, Voxtral, Qwen2-Audio
    Rule(r"(^|\.)feature_extractor\.conv_layers\.", "audio.conv"),  # wav2vec2 and its kin
    Rule(r"(^|\.)feature_projection\.", "audio.feature_projection"),
    Rule(r"(^|\.)pos_conv_embed\.", "audio.position_conv"),
    Rule(r"(^|\.)masked_spec_embed$", "audio.mask_embedding"),
    # wav2vec2 (not its stable-layer-norm variant) normalises the embeddings before the first layer
    Rule(r"(^|\.)encoder\.layer_norm\.", "embeddings.norm", parent=_SPEECH + r"Encoder$"),
    Rule(r"\.layers\.\d+\.layer_norm\.", "attention.norm", parent=_SPEECH + r"EncoderLayer"),
)

# Token mixers of hybrid and recurrent models: short convolutions, Gated DeltaNet linear attention, Mamba.
MIXER_RULES: tuple[Rule, ...] = (
    Rule(r"\.(input_layernorm|operator_norm)\.", "mixer.norm", parent=_HYBRID_LAYERS),
    # Nemotron-H: one block class holds a Mamba-2, attention or MLP `mixer` behind its one `norm`; its attention's
    # projections sit under `mixer.`, which no attention rule names
    Rule(r"(^|\.)layers\.\d+\.norm\.", "mixer.norm", parent=r"^NemotronHBlock$"),
    Rule(r"\.mixer\.q_proj\.", "attention.query", within=r"^NemotronHAttention$"),
    Rule(r"\.mixer\.k_proj\.", "attention.key", within=r"^NemotronHAttention$"),
    Rule(r"\.mixer\.v_proj\.", "attention.value", within=r"^NemotronHAttention$"),
    Rule(r"\.mixer\.o_proj\.", "attention.output", within=r"^NemotronHAttention$"),
    Rule(r"\.conv\.(in_proj|conv|out_proj)\.", "mixer.conv", within=r"ShortConv$"),
    Rule(r"\.linear_attn\.in_proj\w*\.", "linear_attention.in_proj"),
    Rule(r"\.linear_attn\.conv1d\.", "linear_attention.conv"),
    Rule(r"\.linear_attn\.(A_log|dt_bias)$", "linear_attention.decay"),
    Rule(r"\.linear_attn\.norm\.", "linear_attention.norm"),
    Rule(r"\.linear_attn\.out_proj\.", "linear_attention.output"),
    Rule(r"(^|\.)layers\.\d+\.norm\.", "ssm.norm", parent=r"^Mamba2?Block$"),
    Rule(r"\.input_layernorm\.", "ssm.norm", parent=r"MambaDecoderLayer$"),  # Jamba's Mamba layers
    Rule(r"\.(mamba|mixer)\.in_proj\.", "ssm.in_proj", within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.conv1d\.", "ssm.conv", within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.x_proj\.", "ssm.x_proj", within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.dt_proj\.", "ssm.dt_proj", within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.(A_log|D|dt_bias)$", "ssm.state", within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.(norm|dt_layernorm|b_layernorm|c_layernorm)\.", "ssm.norm",
         within=r"(?i)mamba|mixer$"),
    Rule(r"\.(mamba|mixer)\.out_proj\.", "ssm.output", within=r"(?i)mamba|mixer$"),
    # nn.LSTM/GRU/RNN name their tensors per layer (`weight_ih_l0`, `_reverse`); their *Cell twins do not
    Rule(r"(^|\.)(weight|bias)_ih_l\d+(_reverse)?$", "recurrent.input"),
    Rule(r"(^|\.)((weight|bias)_hh|weight_hr)_l\d+(_reverse)?$", "recurrent.hidden"),
    Rule(r"(^|\.)(weight|bias)_ih$", "recurrent.input", owner=r"^(LSTM|GRU|RNN)Cell$"),
    Rule(r"(^|\.)(weight|bias)_hh$", "recurrent.hidden", owner=r"^(LSTM|GRU|RNN)Cell$"),
)

# Convolutional networks: transformers' ResNet and ConvNeXt, and torchvision's layout (conv1/bn1 stem,
# layerN blocks with downsample, fc classifier).
CONV_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)embedder\.|(^|\.)stem\.", "conv.stem", within=r"(?i)resnet|regnet|convnext|stem"),
    Rule(r"(^|\.)embeddings\.(patch_embeddings|layernorm)\.", "conv.stem", within=r"^ConvNextV?2?Embeddings$"),
    # torchvision: root-level conv1/bn1 (ResNet), conv1–conv3 BasicConv2d (GoogLeNet), Conv2d_1a_3x3 (Inception)
    Rule(r"(?i)^(conv|bn|stem)\w*\.([^.]+\.)?(weight|bias)$", "conv.stem", owner=_CONV_MODULE + "|" + _CONV_NORM),
    Rule(r"(^|\.)(downsample|downsampling_layer|shortcut)\.", "conv.downsample",
         owner=_CONV_MODULE + "|" + _CONV_NORM + r"|^ConvNextV?2?LayerNorm$"),
    # ConvNeXt layer_scale_parameter, torchvision CNBlock layer_scale, DINOv2 layer_scale1.lambda1, BEiT lambda_1
    Rule(r"\.(layer_scale_parameter|layer_scale|lambda_[12])$|\.layer_scale\d\.lambda1$", "layer_scale"),
    Rule(r"\.pwconv1\.", "mlp.up"),  # ConvNeXt's pointwise convolutions are Linear layers: an inverted MLP
    Rule(r"\.pwconv2\.", "mlp.down"),
    Rule(r"\.layernorm\.|\.grn\.", "conv.norm", parent=r"^ConvNextV?2?Layer$"),  # V2: global response norm
    Rule(r"^fc\.(weight|bias)$", "head.classifier", owner=r"^Linear$"),  # torchvision classifiers
)

EMBEDDING_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)(word_embeddings|embed_tokens|wte|embed_in|tok_embeddings)\.weight$", "embeddings.word"),
    Rule(r"(^|\.)shared\.weight$", "embeddings.word"),  # T5, BART: the encoder/decoder share it
    Rule(r"(^|\.)(position_embeddings|wpe|embed_positions)\.weight$", "embeddings.position"),
    Rule(r"(^|\.)(position_embeddings|pos_embed|position_embedding)$", "embeddings.position"),  # bare tables (ViT)
    Rule(r"(^|\.)token_type_embeddings\.weight$", "embeddings.token_type"),
    Rule(r"(^|\.)(embedding_hidden_mapping_in|embeddings_project|embed_proj)\.", "embeddings.projection"),
    Rule(r"(^|\.)embeddings\.(LayerNorm|layer_norm|norm)\.|(^|\.)(layernorm_embedding|word_embeddings_layernorm"
         r"|emb_ln|embed_norm)\.", "embeddings.norm"),
)

# Encoder–decoder cross-attention (BART encoder_attn, T5 EncDecAttention, BERT-as-decoder crossattention).
CROSS_ATTENTION_RULES: tuple[Rule, ...] = (
    Rule(rf"\.{_CROSS}\.(q_proj|q|query)\.", "cross_attention.query"),
    Rule(rf"\.{_CROSS}\.(k_proj|k|key)\.", "cross_attention.key"),
    Rule(rf"\.{_CROSS}\.(v_proj|v|value)\.", "cross_attention.value"),
    Rule(rf"\.{_CROSS}\.(out_proj|o|o_proj|output\.dense)\.", "cross_attention.output"),
    Rule(r"\.(encoder_attn_layer_norm|cross_attn_layer_norm|crossattention\.output\.LayerNorm)\.",
         "cross_attention.norm"),
    Rule(r"\.layer_norm\.", "cross_attention.norm", parent=r"LayerCrossAttention$"),  # T5 layer.1 in a decoder
)

# Multi-head latent attention (DeepSeek-V2/V3).
MLA_RULES: tuple[Rule, ...] = (
    Rule(r"\.q_a_proj\.", "attention.q_down"),
    Rule(r"\.q_b_proj\.", "attention.q_up"),
    Rule(r"\.kv_a_proj_with_mqa\.", "attention.kv_down"),
    Rule(r"\.kv_b_proj\.", "attention.kv_up"),
    Rule(r"\.(q_a_layernorm|kv_a_layernorm)\.", "attention.latent_norm"),
)

SELF_ATTENTION_RULES: tuple[Rule, ...] = (
    Rule(rf"\.{_ATTN}\.(query|q_proj|q_lin|q|query_proj|wq|to_q)\.", "attention.query"),
    Rule(rf"\.{_ATTN}\.(key|k_proj|k_lin|k|key_proj|wk|to_k)\.", "attention.key"),
    Rule(rf"\.{_ATTN}\.(value|v_proj|v_lin|v|value_proj|wv|to_v)\.", "attention.value"),
    Rule(rf"\.{_ATTN}\.(c_attn|qkv_proj|query_key_value|Wqkv|qkv|wqkv|in_proj)\.|\.{_ATTN}\.in_proj_(weight|bias)$",
         "attention.qkv"),
    Rule(r"\.attention\.self\.(q_bias|v_bias)$", "attention.qkv"),  # DeBERTa: biases of the fused in_proj
    Rule(r"\.attention\.self\.(pos_proj|pos_q_proj|pos_key_proj|pos_query_proj)\.", "attention.relative_position"),
    Rule(rf"\.{_ATTN}\.sinks$", "attention.sinks"),
    Rule(rf"\.{_ATTN}\.rel_pos_[hw]$", "attention.relative_position"),  # SAM's decomposed relative positions
    Rule(rf"\.{_ATTN}\.gru_rel_pos_(const|linear)\b", "attention.relative_position"),  # WavLM's gated bias
    Rule(rf"\.attention\.output\.dense\.|\.{_ATTN}\.(out_lin|dense|c_proj|out_proj|o_proj|Wo|o|wo|to_out|proj)\.",
         "attention.output"),
    Rule(r"\.relative_attention_bias\.weight$", "attention.relative_bias"),
    Rule(r"(^|\.)rel_embeddings\.weight$", "attention.relative_position"),
    # DeBERTa-v2 normalises the shared relative-position embeddings with encoder.LayerNorm
    Rule(r"(^|\.)encoder\.LayerNorm\.", "attention.norm", within=r"^DebertaV2Encoder$"),
    Rule(r"\.post_attention_layernorm\.", "attention.norm", parent=_SANDWICH_LAYERS),
    Rule(r"\.norm_attn_norm\.norm_2\.", "mlp.norm"),  # DBRX: the second norm feeds the MoE block
    Rule(rf"\.attention\.output\.LayerNorm\.|\.attention\.LayerNorm\.|\.{_ATTN}\.(q_norm|k_norm|q_layernorm"
         r"|k_layernorm)\.|\.(sa_layer_norm|input_layernorm|ln_1|self_attn_layer_norm|attn_norm"
         r"|pre_attention_layernorm|attention_norm|attn_layer_norm)\.", "attention.norm"),
    Rule(r"\.layer_norm\.", "attention.norm", parent=r"LayerSelfAttention$"),  # T5 layer.0
    # vision encoder blocks: ViT layernorm_before, CLIP/SigLIP/SAM layer_norm1, Qwen-VL norm1
    Rule(r"(^|\.)(layers?|blocks)\.\d+\.(layernorm_before|layer_norm1|norm1)\.", "attention.norm"),
)

MOE_RULES: tuple[Rule, ...] = (
    Rule(r"\.(shared_experts?|shared_expert_gate|shared_mlp)\.", "moe.shared_experts"),
    Rule(r"\.experts\.", "moe.experts"),
    Rule(r"\.experts\.[^.]+$", "moe.experts"),
    # A `gate`/`router` is MoE routing only inside a sparse block or as a router class; Llama's gate_proj is not.
    Rule(r"\.(gate|router)\.[^.]+$", "moe.router", owner=r"(?i)router|gate"),
    Rule(r"\.(gate|router)\.[^.]+$", "moe.router", parent=r"(?i)moe|sparse|expert"),
    Rule(r"\.(block_sparse_moe|moe)\.(gate|router)\.[^.]+$", "moe.router"),
    Rule(r"\.router\.", "moe.router", within=r"(?i)router$"),  # Switch Transformers: router.classifier
)

MLP_RULES: tuple[Rule, ...] = (
    Rule(r"\.(mlp|feed_forward|ffn)\.(gate_proj|w1)\.|\.(gate_proj|wi_0)\.", "mlp.gate"),
    Rule(r"\.(gate_up_proj|Wi)\.", "mlp.gate_up"),
    Rule(r"\.intermediate\.dense\.|\.ffn\.lin1\.|\.(mlp|feed_forward)\.(up_proj|c_fc|dense_h_to_4h|fc_in|fc1|w3)\."
         r"|\.(fc1|wi|wi_1|up_proj)\.|\.ffn\.(weight|bias)$", "mlp.up"),
    Rule(r"\.(layer|blocks)\.\d+\.output\.dense\.|\.ffn\.lin2\.|\.(mlp|feed_forward)\.(down_proj|c_proj|dense_4h_to_h"
         r"|fc_out|fc2|Wo|w2)\.|\.(fc2|wo|down_proj|ffn_output)\.", "mlp.down"),
    Rule(r"\.layer\.\d+\.output\.LayerNorm\.|\.(output_layer_norm|post_attention_layernorm|ln_2"
         r"|pre_feedforward_layernorm|post_feedforward_layernorm|mlp_norm|full_layer_layer_norm|ffn_norm"
         r"|ffn_layer_norm)\.|\.layers?\.\d+\.final_layer_norm\.", "mlp.norm"),
    Rule(r"\.layer_norm\.", "mlp.norm", parent=r"LayerFF$"),  # T5's feed-forward sublayer
    Rule(r"(^|\.)(layers?|blocks)\.\d+\.(layernorm_after|layer_norm2|norm2)\.|\.pre_ff_layernorm\.", "mlp.norm"),
    Rule(r"\.feed_forward\.intermediate_dense\.", "mlp.up"),  # wav2vec2
    Rule(r"\.feed_forward\.output_dense\.", "mlp.down"),
    Rule(r"\.mlp\.lin1\.", "mlp.up"),  # SAM
    Rule(r"\.mlp\.lin2\.", "mlp.down"),
)

ENCODER_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)encoder\.conv\.", "encoder.conv"),
)

FINAL_NORM_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)(ln_f|final_layer_norm|final_norm|norm_f|final_layernorm)\.", "norm.final"),
    Rule(r"^norm\.|(^|\.)(model|decoder|encoder|transformer|language_model|gpt_neox)\.(norm|layer_norm)\.",
         "norm.final"),
    Rule(r"(^|\.)embedding_norm\.", "norm.final", parent=r"^Lfm2\w*Model$"),  # LFM2 applies it after the last layer
)

HEAD_RULES: tuple[Rule, ...] = (
    Rule(r"(^|\.)pooler\.", "pooler"),
    # BERT, RoBERTa, DistilBERT, DeBERTa-v2, ModernBERT, ALBERT, ELECTRA generator
    Rule(r"(^|\.)cls\.predictions\.transform\.dense\.|(^|\.)lm_head\.dense\.|(^|\.)vocab_transform\."
         r"|^lm_predictions\.lm_head\.dense\.|^head\.dense\.|^predictions\.dense\.|^generator_predictions\.dense\."
         r"|^discriminator_predictions\.dense\.", "head.transform"),
    Rule(r"(^|\.)pre_classifier\.", "head.transform"),
    Rule(r"(^|\.)cls\.predictions\.transform\.LayerNorm\.|(^|\.)lm_head\.layer_norm\.|(^|\.)vocab_layer_norm\."
         r"|^lm_predictions\.lm_head\.LayerNorm\.|^head\.norm\.|^predictions\.LayerNorm\."
         r"|^generator_predictions\.LayerNorm\.", "head.transform_norm"),
    Rule(r"(^|\.)cls\.predictions\.decoder\.weight$|(^|\.)lm_head\.decoder\.weight$|^predictions\.decoder\.weight$"
         r"|^generator_lm_head\.weight$", "head.decoder"),
    # a root-level `decoder` is an MLM head's only inside a masked-LM model (ModernBERT); an LSTM's is not
    Rule(r"^decoder\.weight$", "head.decoder", within=r"For(MaskedLM|PreTraining)$"),
    Rule(r"(^|\.)vocab_projector\.weight$", "head.decoder"),
    # RoBERTa's lm_head is a head module with its own bias; GPT-J's lm_head is a Linear whose bias is head.lm
    Rule(r"(^|\.)lm_head\.bias$", "head.bias", owner=r"(?i)head$"),
    Rule(r"(^|\.)cls\.predictions\.(decoder\.)?bias$|(^|\.)lm_head\.decoder\.bias$|(^|\.)vocab_projector\.bias$"
         r"|^lm_predictions\.lm_head\.bias$|^predictions\.(decoder\.)?bias$"
         r"|^generator_lm_head\.bias$", "head.bias"),
    Rule(r"^decoder\.bias$", "head.bias", within=r"For(MaskedLM|PreTraining)$"),
    Rule(r"(^|\.)cls\.seq_relationship\.|(^|\.)sop_classifier\.", "head.nsp"),
    Rule(r"^(lm_head|embed_out|output)\.", "head.lm"),
    Rule(r"(^|\.)(classifier|classification_head|score|discriminator_predictions|multiple_choice_head)\.",
         "head.classifier"),
    Rule(r"(^|\.)qa_outputs\.", "head.qa"),
    Rule(r"^(logit_scale|logit_bias)$|(^|\.)(visual_projection|text_projection)\.|(^|\.)text_model\.head\.",
         "head.contrastive"),
)

# The generic classifier: module types first, then name fragments. Kept last so that family rules win.
GENERIC_RULES: tuple[Rule, ...] = (
    Rule(r"(?i)pos", "embeddings.position", owner=r"Embedding$"),
    Rule(r"(?i)token_type|segment", "embeddings.token_type", owner=r"Embedding$"),
    Rule(r"\.weight$", "embeddings.word", owner=r"^(Embedding|\w*(Word|Token)Embedding)$"),
    Rule(r".", "moe.experts", owner=r"Experts?$"),
    Rule(r".", "moe.router", owner=r"Router$"),
    Rule(r".", "conv.norm", owner=_CONV_NORM),  # batch norm is a convolutional network's, never a final norm
    Rule(r".", "conv.layer", owner=_CONV_MODULE),
    Rule(r"(?i)(^|\.)embed\w*\.", "embeddings.norm", owner=r"(?i)norm"),
    Rule(r"(?i)(^|\.)(cross|encdec)\w*\.", "cross_attention.norm", owner=r"(?i)norm"),
    Rule(r"(?i)(^|\.)\w*(attn|attention)\w*\.", "attention.norm", owner=r"(?i)norm"),
    Rule(r"(?i)(^|\.)\w*(mlp|ffn|feed_?forward)\w*\.", "mlp.norm", owner=r"(?i)norm"),
    # a layer or RMS norm outside any numbered layer, unless its name says it comes first
    Rule(r"(?i)^([^.]*\.)?(?!\w*(pre|embed|stem|input|patch))[^.\d][^.]*\.[^.]+$", "norm.final",
         owner=r"(?i)(layer|rms)_?norm"),
    Rule(r"(?i)\.\w*(attn|attention)\w*\.\w*(qkv)\w*\.", "attention.qkv"),
    Rule(r"(?i)\.\w*(attn|attention)\w*\.(\w+_)?q(uery)?(_\w+)?\.(weight|bias)$", "attention.query"),
    Rule(r"(?i)\.\w*(attn|attention)\w*\.(\w+_)?k(ey)?(_\w+)?\.(weight|bias)$", "attention.key"),
    Rule(r"(?i)\.\w*(attn|attention)\w*\.(\w+_)?v(alue)?(_\w+)?\.(weight|bias)$", "attention.value"),
    Rule(r"(?i)\.\w*(attn|attention)\w*\.(\w+_)?o(ut|utput)?(_\w+)?\.(weight|bias)$", "attention.output"),
    Rule(r"(?i)\.\w*(mlp|ffn|feed_?forward)\w*\.\w*gate\w*\.", "mlp.gate"),
    Rule(r"(?i)\.\w*(mlp|ffn|feed_?forward)\w*\.(\w+_)?(up|fc_?1|in|lin_?1|w_?1)(_\w+)?\.", "mlp.up"),
    Rule(r"(?i)\.\w*(mlp|ffn|feed_?forward)\w*\.(\w+_)?(down|fc_?2|out|lin_?2|w_?2)(_\w+)?\.", "mlp.down"),
)

# Family tables in the order they are tried.
RULE_TABLES: tuple[tuple[str, tuple[Rule, ...]], ...] = (
    ("whole modules", MODULE_RULES),
    ("vision front-end", VISION_RULES),
    ("audio front-end", AUDIO_RULES),
    ("token mixers", MIXER_RULES),
    ("convolutional networks", CONV_RULES),
    ("embeddings", EMBEDDING_RULES),
    ("cross-attention", CROSS_ATTENTION_RULES),
    ("multi-head latent attention", MLA_RULES),
    ("mixture of experts", MOE_RULES),
    ("self-attention", SELF_ATTENTION_RULES),
    ("MLP", MLP_RULES),
    ("encoder extras", ENCODER_RULES),
    ("final norm", FINAL_NORM_RULES),
    ("heads", HEAD_RULES),
    ("generic", GENERIC_RULES),
)
_COMPILED = tuple(rule.compiled() for _, table in RULE_TABLES for rule in table)


def role_of(name: str, types: tuple[str, ...] = ()) -> str:
    """The canonical role of the parameter called `name`, or `other`.

    `types` are the class names of the modules from the root to the parameter's owner, when known.
    """
    for rule in _COMPILED:
        if rule.matches(name, types):
            return rule.role
    return OTHER


def buffer_role(name: str, types: tuple[str, ...] = ()) -> str | None:
    """The role of a buffer that holds learned values (a router's score-correction bias), else None."""
    if re.search(r"\.e_score_correction_bias$", name):
        return "moe.router"
    return None


def role_sort_key(role: str) -> tuple[int, str]:
    return (ROLE_ORDER.get(role, len(ROLE_ORDER) - 1), role)


def role_group(role: str) -> str:
    """`attention.query` → `attention`; used for subtotals."""
    return role.split(".", 1)[0]


# Display titles of role groups (the part before the dot), shared by every renderer.
GROUP_TITLES = {
    "embeddings": "embeddings",
    "attention": "attention",
    "cross_attention": "cross-attention",
    "mlp": "feed-forward (MLP)",
    "moe": "mixture of experts",
    "vision": "vision front-end",
    "audio": "audio front-end",
    "projector": "multimodal projector",
    "mixer": "hybrid token mixers",
    "linear_attention": "linear attention",
    "ssm": "state-space (Mamba)",
    "recurrent": "recurrent layers",
    "conv": "convolutional network",
    "segmentation": "segmentation (SAM)",
    "layer_scale": "layer scale",
    "encoder": "encoder extras",
    "norm": "final norm",
    "pooler": "pooler",
    "head": "heads",
    "other": "unclassified",
}
