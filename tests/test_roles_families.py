"""Roles on the families of issue 9: vision and audio encoders, multimodal projectors, hybrid mixers, attention
indexers, CNNs and recurrent networks. Every model leaves at most 0.1% in `other` (all of them: none), totals are
exact, and key roles are checked by hand arithmetic in the comments.

The configs are shipped under tests/configs/families (README there says which are public configs and which are
transformers' defaults). The CNN and LSTM cases are live modules shaped like torchvision's and PyTorch's examples.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import paramscope
from paramscope.roles import GROUP_TITLES, ROLES, role_group, role_of

CONFIGS = Path(__file__).parent / "configs" / "families"
KNOWN_ROLES = {role for role, _ in ROLES}

# config file → (total, {role: figure})
FAMILIES = {
    "google--vit-base-patch16-224": (86_567_656, {
        "vision.patch_embedding": 768 * 3 * 16 * 16 + 768,  # 590,592: Conv2d 16×16 patches
        "vision.class_token": 768,
        "embeddings.position": (14 * 14 + 1) * 768,  # 151,296: a bare table, 196 patches + the class token
        "attention.norm": 12 * 2 * 768,  # layernorm_before
        "mlp.norm": 12 * 2 * 768,  # layernorm_after
        "head.classifier": 768 * 1000 + 1000,
    }),
    "google--siglip-base-patch16-224": (203_155_970, {
        "vision.patch_embedding": 768 * 3 * 16 * 16 + 768,
        "attention.norm": 2 * 12 * 2 * 768,  # layer_norm1 in the text and vision towers
        # the attention-pooling head: probe + MultiheadAttention (in_proj, out_proj) + LayerNorm + MLP
        "pooler": 768 + (3 * 768 * 768 + 3 * 768) + (768 * 768 + 768) + 2 * 768
        + (768 * 3072 + 3072) + (3072 * 768 + 768),  # 7,087,104
        "head.contrastive": 1 + 1 + 768 * 768 + 768,  # logit_scale, logit_bias, text_model.head
    }),
    "Qwen--Qwen2.5-VL-7B-Instruct": (8_292_166_656, {
        "vision.patch_embedding": 1280 * 3 * 2 * 14 * 14,  # Conv3d over 2 frames × 14 × 14, no bias: 1,505,280
        # merger: RMSNorm ln_q, then Linear(4·1280 → 5120) and Linear(5120 → 3584), with biases
        "projector": 1280 + (5120 * 5120 + 5120) + (5120 * 3584 + 3584),  # 44,574,464
        "attention.output": 32 * (1280 * 1280 + 1280) + 28 * 3584 * 3584,  # vision attn.proj + language o_proj
        "head.lm": 152064 * 3584,
    }),
    "facebook--sam-vit-base": (93_735_728, {
        "embeddings.position": 64 * 64 * 768 + 2 * 128,  # pos_embed, and the prompt's random Fourier features
        "vision.patch_embedding": 768 * 3 * 16 * 16 + 768,
        # rel_pos_h and rel_pos_w: (2·size − 1) × head_dim; 4 global layers (size 64), 8 windowed (size 14)
        "attention.relative_position": 4 * 2 * 127 * 64 + 8 * 2 * 27 * 64,  # 92,672
        "vision.neck": 768 * 256 + 2 * 256 + 256 * 256 * 3 * 3 + 2 * 256,  # two convolutions, no bias: 787,456
        "segmentation.prompt_encoder": 6_220,
        "segmentation.mask_decoder": 4_058_340,
    }),
    "adept--fuyu-8b": (9_408_238_592, {
        "vision.patch_embedding": 30 * 30 * 3 * 4096 + 4096,  # vision_embed_tokens: raw 30×30 patches → D
        "head.lm": 262144 * 4096,
    }),
    "openai--whisper-small": (241_734_912, {
        # conv1: 80 mel bins → 768, kernel 3; conv2: 768 → 768, kernel 3; with biases
        "audio.conv": (80 * 768 * 3 + 768) + (768 * 768 * 3 + 768),  # 1,955,328
        "embeddings.position": 1500 * 768 + 448 * 768,
    }),
    "facebook--wav2vec2-base-960h": (94_396_320, {
        # seven bias-free convolutions (512 channels, kernels 10,3,3,3,3,2,2), the first one's GroupNorm
        "audio.conv": 512 * 10 + 512 * 512 * (4 * 3 + 2 * 2) + 2 * 512,  # 4,200,448
        "audio.feature_projection": 2 * 512 + 512 * 768 + 768,  # its LayerNorm, then 512 → 768
        # weight-normed grouped conv (16 groups, kernel 128): v, g (over the kernel dim), bias
        "audio.position_conv": 768 * 48 * 128 + 128 + 768,  # 4,719,488
        "audio.mask_embedding": 768,
        "embeddings.norm": 2 * 768,  # encoder.layer_norm, applied before the first layer
        "head.lm": 768 * 32 + 32,  # the CTC head over 32 characters
    }),
    "defaults--voxtral": (4_273_617_920, {
        "audio.conv": (128 * 1280 * 3 + 1280) + (1280 * 1280 * 3 + 1280),  # 5,409,280
        "projector": 5120 * 3072 + 3072 * 3072,  # four stacked frames → text width, no biases
    }),
    "defaults--llava": (6_931_830_784, {
        "vision.class_token": 1024,
        "vision.patch_embedding": 1024 * 3 * 14 * 14,  # CLIP ViT-L/14, no bias
        "projector": (1024 * 4096 + 4096) + (4096 * 4096 + 4096),  # 20,979,712
    }),
    "defaults--lfm2_vl": (2_812_857_088, {
        # LayerNorm over 2×2 merged patches (4 × 768), Linear 3072 → 2560, Linear 2560 → 2560, with biases
        "projector": 2 * 3072 + (3072 * 2560 + 2560) + (2560 * 2560 + 2560),  # 14,429,184
        "pooler": 7_087_104,  # the SigLIP2 tower's attention-pooling head, as SigLIP-base's
        "mixer.norm": 32 * 2560,  # operator_norm of 32 layers
    }),
    "LiquidAI--LFM2-1.2B": (1_170_340_608, {
        # 10 short-convolution layers: in_proj D → 3D, depthwise conv (kernel 3), out_proj D → D; no biases
        "mixer.conv": 10 * (2048 * 3 * 2048 + 2048 * 3 + 2048 * 2048),  # 167,833,600
        "mixer.norm": 16 * 2048,  # operator_norm before every layer's mixer
        "norm.final": 2048,  # embedding_norm, applied after the last layer
    }),
    "Qwen--Qwen3-Next-80B-A3B-Instruct": (79_674_391_296, {
        # 36 Gated DeltaNet layers (every 4th of 48 is full attention); key dim 16×128, value dim 32×128
        "linear_attention.in_proj": 36 * (2048 * (2 * 2048 + 2 * 4096) + 2048 * 2 * 32),  # qkvz + ba: 910,688,256
        "linear_attention.conv": 36 * (2 * 2048 + 4096) * 4,  # depthwise over q, k, v, kernel 4
        "linear_attention.decay": 36 * (32 + 32),  # A_log, dt_bias per value head
        "linear_attention.output": 36 * 4096 * 2048,
        "mixer.norm": 48 * 2048,
    }),
    "defaults--qwen3_5_moe": (34_605_702_000, {
        "linear_attention.decay": 30 * (32 + 32),  # 30 of 40 layers are Gated DeltaNet
        # merger: LayerNorm(1152), Linear 4·1152 → 4608, Linear 4608 → 3584, with biases
        "projector": 2 * 1152 + (4608 * 4608 + 4608) + (4608 * 3584 + 3584),  # 37,759,232
        "vision.patch_embedding": 1152 * 3 * 2 * 16 * 16 + 1152,  # Conv3d with bias
    }),
    "ai21labs--Jamba-v0.1": (51_570_323_328, {
        # 28 Mamba layers (attention every 8th from 4); d_inner 8192, d_state 16, dt_rank 256
        "ssm.in_proj": 28 * 4096 * 2 * 8192,
        "ssm.x_proj": 28 * 8192 * (256 + 2 * 16),
        "ssm.dt_proj": 28 * (256 * 8192 + 8192),
        "ssm.state": 28 * (8192 * 16 + 8192),  # A_log and D
        "ssm.norm": 28 * (4096 + 256 + 16 + 16),  # input_layernorm of the Mamba layers, dt/B/C norms
        "ssm.output": 28 * 8192 * 4096,
    }),
    "state-spaces--mamba-130m-hf": (129_135_360, {
        "ssm.in_proj": 24 * 768 * 2 * 1536,
        "ssm.conv": 24 * (1536 * 4 + 1536),
        "ssm.x_proj": 24 * 1536 * (48 + 2 * 16),
        "ssm.dt_proj": 24 * (48 * 1536 + 1536),
        "ssm.state": 24 * (1536 * 16 + 1536),
        "ssm.norm": 24 * 768,
        "embeddings.word": 50280 * 768,  # tied to the LM head
    }),
    "microsoft--swin-tiny-patch4-window7-224": (28_288_354, {
        # patch merging after stages 1–3 at width C = 96, 192, 384: LayerNorm(4C) + Linear(4C → 2C, no bias)
        "vision.patch_merging": sum(2 * 4 * c + 4 * c * 2 * c for c in (96, 192, 384)),  # 1,553,664
        # a (2·7 − 1)² table per head of every block: depths [2, 2, 6, 2] × heads [3, 6, 12, 24]
        "attention.relative_bias": 13 * 13 * (2 * 3 + 2 * 6 + 6 * 12 + 2 * 24),  # 23,322
        "head.classifier": 768 * 1000 + 1000,
    }),
    "defaults--swinv2": (27_578_154, {
        # Swin v2 normalises after the reduction: Linear(4C → 2C, no bias) + LayerNorm(2C)
        "vision.patch_merging": sum(4 * c * 2 * c + 2 * 2 * c for c in (96, 192, 384)),  # 1,550,976
        # the continuous position-bias MLP per block: Linear(2 → 512) + Linear(512 → heads, no bias)
        "attention.relative_bias": 12 * (2 * 512 + 512) + 512 * (2 * 3 + 2 * 6 + 6 * 12 + 2 * 24),  # 89,088
        "attention.temperature": 2 * 3 + 2 * 6 + 6 * 12 + 2 * 24,  # one logit scale per head: 138
    }),
    "defaults--mamba2": (7_151_185_920, {
        "ssm.state": 64 * (128 * 3),  # A_log, D, dt_bias per head
        "ssm.output": 2_147_483_648,
    }),
    "defaults--deepseek_v32": (670_951_250_176, {
        # lightning indexer per layer: wq_b 1536 → 64×128, wk 7168 → 128, k_norm (LayerNorm), weights_proj → 64
        "attention.indexer": 61 * (1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64),  # 851,524,864
    }),
    "microsoft--resnet-50": (25_557_032, {
        "conv.stem": 7 * 7 * 3 * 64 + 2 * 64,  # 9,536
        "conv.downsample": sum(a * b + 2 * b for a, b in ((64, 256), (256, 512), (512, 1024), (1024, 2048))),
        "head.classifier": 2048 * 1000 + 1000,
    }),
    "facebook--convnext-tiny-224": (28_589_128, {
        "conv.stem": 4 * 4 * 3 * 96 + 96 + 2 * 96,  # patchify conv and its LayerNorm
        "layer_scale": 3 * 96 + 3 * 192 + 9 * 384 + 3 * 768,  # one per channel per block
        "conv.downsample": sum(2 * a + a * b * 4 + b for a, b in ((96, 192), (192, 384), (384, 768))),
        "head.classifier": 768 * 1000 + 1000,
    }),
}


@pytest.fixture(scope="module")
def reports():
    return {}


def _report(name: str, cache: dict):
    if name not in cache:
        cache[name] = paramscope.inspect(str(CONFIGS / f"{name}.json"))
    return cache[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_config_is_classified_with_exact_figures(name, reports):
    total, roles = FAMILIES[name]
    report = _report(name, reports)
    assert report.total == total
    assert sum(report.breakdown.values()) == total
    assert report.breakdown.get("other", 0) <= total // 1000, report.unclassified[:20]
    assert report.unclassified == ()
    assert set(report.breakdown) <= KNOWN_ROLES
    for role, figure in roles.items():
        assert report.breakdown[role] == figure, role


def test_every_shipped_config_is_tested():
    assert {path.stem for path in CONFIGS.glob("*.json")} == set(FAMILIES)


def test_every_role_group_has_a_title_and_every_role_is_documented():
    assert {role_group(role) for role, _ in ROLES} <= set(GROUP_TITLES)
    doc = (Path(__file__).parent.parent / "docs" / "roles.md").read_text()
    assert [role for role, _ in ROLES if f"| `{role}` |" not in doc] == []


def test_vision_tower_blocks_reuse_attention_and_mlp_roles(reports):
    roles = {p.name: p.role for p in _report("Qwen--Qwen2.5-VL-7B-Instruct", reports).params}
    assert roles["model.visual.blocks.0.attn.qkv.weight"] == "attention.qkv"
    assert roles["model.visual.blocks.0.attn.proj.weight"] == "attention.output"
    assert roles["model.visual.blocks.0.norm1.weight"] == "attention.norm"
    assert roles["model.visual.blocks.0.norm2.weight"] == "mlp.norm"
    assert roles["model.visual.merger.ln_q.weight"] == "projector"


def test_sam_mask_decoder_tokens_are_not_word_embeddings(reports):
    roles = {p.name: p.role for p in _report("facebook--sam-vit-base", reports).params}
    assert roles["mask_decoder.iou_token.weight"] == "segmentation.mask_decoder"
    assert roles["prompt_encoder.point_embed.0.weight"] == "segmentation.prompt_encoder"
    assert roles["vision_encoder.layers.0.mlp.lin2.weight"] == "mlp.down"  # not mlp.up for the "in" in "lin"


def test_hybrid_layers_pre_mixer_norm(reports):
    jamba = {p.name: p.role for p in _report("ai21labs--Jamba-v0.1", reports).params}
    assert jamba["model.layers.0.input_layernorm.weight"] == "ssm.norm"  # a Mamba layer
    assert jamba["model.layers.4.input_layernorm.weight"] == "attention.norm"  # the attention layer
    assert jamba["model.layers.0.pre_ff_layernorm.weight"] == "mlp.norm"


@pytest.mark.parametrize("name, role", [
    # transformers 4 ViT checkpoints (5.x renamed the blocks to layers.N.attention.q_proj, mlp.fc1)
    ("vit.encoder.layer.0.attention.attention.query.weight", "attention.query"),
    ("vit.encoder.layer.0.attention.output.dense.weight", "attention.output"),
    ("vit.encoder.layer.0.intermediate.dense.weight", "mlp.up"),
    ("vit.encoder.layer.0.output.dense.weight", "mlp.down"),
    ("vit.encoder.layer.0.layernorm_before.weight", "attention.norm"),
    ("vit.encoder.layer.0.layernorm_after.bias", "mlp.norm"),
    ("vit.embeddings.cls_token", "vision.class_token"),
    ("vit.embeddings.position_embeddings", "embeddings.position"),
    ("vit.embeddings.patch_embeddings.projection.weight", "vision.patch_embedding"),
    ("model.visual.blocks.3.attn.proj.bias", "attention.output"),
    ("model.layers.0.self_attn.indexer.weights_proj.weight", "attention.indexer"),
    ("model.layers.1.linear_attn.in_proj_ba.weight", "linear_attention.in_proj"),
    ("multi_modal_projector.linear_1.weight", "projector"),
    ("rnn.weight_hh_l1_reverse", "recurrent.hidden"),
    ("aux2.fc1.weight", "head.auxiliary"),
    ("decoder.weight", "other"),  # without a masked-LM model class around it, no head.decoder
])
def test_role_of_by_name_alone(name, role):
    assert role_of(name) == role


# ---------------------------------------------------------------- live modules: CNNs shaped like torchvision's

class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample


class _ResNet(nn.Module):
    """torchvision.models.resnet.ResNet's layout: conv1/bn1 stem, layer1–4, avgpool, fc."""

    def __init__(self, block: type, layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)


def _on_meta(factory):
    with torch.device("meta"):
        return factory()


def test_torchvision_shaped_resnet50_roles():
    report = paramscope.inspect(_on_meta(lambda: _ResNet(_Bottleneck, [3, 4, 6, 3])))
    assert report.total == 25_557_032  # torchvision's resnet50
    assert report.unclassified == ()
    roles = {p.name: p.role for p in report.params}
    assert roles["bn1.weight"] == "conv.stem"  # the stem's batch norm, never norm.final
    assert roles["layer1.0.bn1.weight"] == "conv.norm"
    assert roles["layer1.0.conv2.weight"] == "conv.layer"
    assert roles["layer1.0.downsample.1.weight"] == "conv.downsample"
    b = report.breakdown
    assert b["conv.stem"] == 7 * 7 * 3 * 64 + 2 * 64
    assert b["conv.downsample"] == sum(a * c + 2 * c for a, c in ((64, 256), (256, 512), (512, 1024), (1024, 2048)))
    assert b["head.classifier"] == 2048 * 1000 + 1000
    assert "norm.final" not in b


def test_torchvision_shaped_resnet152_is_fully_classified():
    report = paramscope.inspect(_on_meta(lambda: _ResNet(_Bottleneck, [3, 8, 36, 3])))
    assert report.total == 60_192_808  # torchvision's resnet152
    assert report.unclassified == ()


def test_torchvision_shaped_resnet18_basic_blocks():
    report = paramscope.inspect(_on_meta(lambda: _ResNet(_BasicBlock, [2, 2, 2, 2])))
    assert report.total == 11_689_512  # torchvision's resnet18
    assert report.unclassified == ()
    assert report.breakdown["conv.downsample"] == sum(a * c + 2 * c for a, c in ((64, 128), (128, 256), (256, 512)))


class _BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, **kwargs) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)


class _Inception(nn.Module):
    def __init__(self, cin: int, ch1: int, ch3red: int, ch3: int, ch5red: int, ch5: int, pool: int) -> None:
        super().__init__()
        self.branch1 = _BasicConv2d(cin, ch1, kernel_size=1)
        self.branch2 = nn.Sequential(_BasicConv2d(cin, ch3red, kernel_size=1),
                                     _BasicConv2d(ch3red, ch3, kernel_size=3, padding=1))
        self.branch3 = nn.Sequential(_BasicConv2d(cin, ch5red, kernel_size=1),
                                     _BasicConv2d(ch5red, ch5, kernel_size=3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _BasicConv2d(cin, pool, kernel_size=1))


class _InceptionAux(nn.Module):
    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.conv = _BasicConv2d(cin, 128, kernel_size=1)
        self.fc1 = nn.Linear(2048, 1024)
        self.fc2 = nn.Linear(1024, num_classes)


class _GoogLeNet(nn.Module):
    """torchvision.models.googlenet.GoogLeNet with aux_logits=True."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = _BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.conv2 = _BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = _BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.inception3a = _Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = _Inception(256, 128, 128, 192, 32, 96, 64)
        self.inception4a = _Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = _Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = _Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = _Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = _Inception(528, 256, 160, 320, 32, 128, 128)
        self.inception5a = _Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = _Inception(832, 384, 192, 384, 48, 128, 128)
        self.aux1 = _InceptionAux(512, num_classes)
        self.aux2 = _InceptionAux(528, num_classes)
        self.fc = nn.Linear(1024, num_classes)


def test_googlenet_auxiliary_classifiers_are_not_mlp():
    report = paramscope.inspect(_on_meta(_GoogLeNet))
    assert report.unclassified == ()
    roles = {p.name: p.role for p in report.params}
    assert roles["aux1.fc1.weight"] == roles["aux2.fc2.bias"] == roles["aux1.conv.bn.weight"] == "head.auxiliary"
    assert roles["conv2.bn.weight"] == "conv.stem"
    assert roles["inception3a.branch2.1.conv.weight"] == "conv.layer"
    b = report.breakdown
    aux = lambda cin: cin * 128 + 2 * 128 + 2048 * 1024 + 1024 + 1024 * 1000 + 1000  # noqa: E731
    assert b["head.auxiliary"] == aux(512) + aux(528)  # 6,379,984
    assert report.total - b["head.auxiliary"] == 6_624_904  # torchvision's googlenet without its aux heads
    assert not any(role.startswith("mlp.") for role in b)


# ---------------------------------------------------------------- live modules: recurrent networks

class _RNNModel(nn.Module):
    """PyTorch's word_language_model example: encoder (Embedding), rnn, decoder (Linear to the vocabulary)."""

    def __init__(self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=0.5)
        self.decoder = nn.Linear(nhid, ntoken)


def test_lstm_word_language_model_roles_and_conventions():
    ntoken, ninp, nhid = 33278, 200, 200  # WikiText-2 vocabulary, the example's defaults
    report = paramscope.inspect(_on_meta(lambda: _RNNModel("LSTM", ntoken, ninp, nhid, 2)))
    roles = {p.name: p.role for p in report.params}
    assert roles["encoder.weight"] == "embeddings.word"
    assert roles["rnn.weight_ih_l0"] == roles["rnn.bias_ih_l1"] == "recurrent.input"
    assert roles["rnn.weight_hh_l1"] == roles["rnn.bias_hh_l0"] == "recurrent.hidden"
    # the decoder is no transformers MLM head: no head.decoder, and no "with/without LM head" pair
    assert roles["decoder.weight"] == roles["decoder.bias"] == "other"
    assert report.unclassified == ("decoder.weight", "decoder.bias")
    assert report.convention("with_lm_head") is None and report.convention("without_lm_head") is None
    b = report.breakdown
    assert b["recurrent.input"] == 4 * nhid * ninp + 4 * nhid * nhid + 2 * 4 * nhid  # layer 1 reads layer 0's h
    assert b["recurrent.hidden"] == 2 * (4 * nhid * nhid + 4 * nhid)
    assert report.total == ntoken * ninp + b["recurrent.input"] + b["recurrent.hidden"] + nhid * ntoken + ntoken


def test_bidirectional_gru_and_projected_lstm():
    gru = paramscope.inspect(_on_meta(lambda: nn.GRU(16, 32, num_layers=1, bidirectional=True)))
    assert gru.breakdown == {"recurrent.input": 2 * (3 * 32 * 16 + 3 * 32),
                             "recurrent.hidden": 2 * (3 * 32 * 32 + 3 * 32)}
    lstm = paramscope.inspect(_on_meta(lambda: nn.LSTM(16, 32, proj_size=8)))
    assert lstm.unclassified == ()
    assert lstm.breakdown["recurrent.hidden"] == 4 * 32 * 8 + 4 * 32 + 8 * 32  # weight_hh reads h (8), weight_hr


def test_masked_lm_decoder_keeps_its_role():
    config = {"model_type": "modernbert", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_hidden_layers": 2, "vocab_size": 100, "tie_word_embeddings": False,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
    report = paramscope.inspect(config, model_class="ModernBertForMaskedLM")
    roles = {p.name: p.role for p in report.params}
    assert roles["decoder.weight"] == "head.decoder"
    assert roles["decoder.bias"] == "head.bias"
