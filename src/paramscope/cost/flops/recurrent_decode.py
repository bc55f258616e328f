"""generate()'s FLOPs in recurrent (selective state-space) layers beyond their nn.Linear projections.

Convention: FlopCounterMode's, as the rest of flops/: matmuls and convolutions count (2 a multiply-add);
the discretisation (exp, softplus), the gate, the D skip and other elementwise ops do not. The projections (in_proj,
x_proj, dt_proj, out_proj) are nn.Linear and counted with every other weight (2·T·numel). What is left, per Mamba
(selective SSM, Mamba-1) mixer with I inner channels (conv1d's rows), kernel K and state size N (A_log's columns):

    prefill of S tokens  conv  2·B·I·K·(S' + K − 1)  causal_conv1d_fn: depthwise, padded K − 1 each side,
                                                     all S' + K − 1 outputs computed, the first S kept; S' =
                                                     max(S, K): the cache pads a prompt shorter than K to K
                         scan  2·B·S·I·N             each token's state read out by its C (a matmul)
    decode step          conv  2·B·I·K·L             L: the outputs transformers' decode path computes: 2
                                                       (causal_conv1d_update: the K cached columns and the new
                                                       one, unpadded) in mamba, falcon_mamba and jamba
                         scan  2·B·I·N               the new state read out by C
    — independent of the context: a recurrent layer's step costs the same at any C.

A Mamba-2 (SSD) mixer (Falcon-H1's) with H heads of P channels, state N, G groups, its conv over
C = H·P + 2·G·N channels and chunks of Q (c = ⌈S/Q⌉ chunks, the prompt padded to whole chunks):

    prefill  conv  2·B·C·K·(S' + K − 1)
             scan  B·(2·c·Q²·H·(N + P) + 4·c·Q·H·N·P + 2·H·(c + 1)²·P·N): within-chunk C·Bᵀ and its
                   product with x, each chunk's state and its read-out, the states passed chunk to chunk
    decode   conv  2·B·C·K·2 (causal_conv1d_update), scan 2·B·H·P·N

The same Mamba-2 mixer in Mamba-2 itself, Bamba, Nemotron-H and Granite-4.0-H (transformers' recurrent form a step:
the conv by causal_conv1d_update, L = 2, the state read out by C in a bmm).

A short convolution (LFM2's and LFM2-MoE's): a depthwise conv over D channels (the hidden size), kernel K, gated by
elementwise products (not counted):

    prefill  conv  2·B·D·K·(S' + K − 1)        decode  conv  2·B·D·K·2

A gated DeltaNet layer (the linear attention of Qwen3-Next and of Qwen3.5's text models, dense and MoE): a conv over
C = 2·Hk·dk + Hv·dv channels, Hv value heads of dk × dv state, the prompt in chunks of Q = 64
(torch_chunk_gated_delta_rule's default; c = ⌈S/Q⌉):

    prefill  conv  2·B·C·K·(S' + K − 1)
             rule  B·Hv·c·(4·Q²·dk + 2·Q²·dv + 6·Q·dk·dv): within-chunk k_β·kᵀ and q·kᵀ, their product with the new
                   values, each chunk's read of the state by its decayed keys and its queries, the state's update
                   (the triangular solves have no FlopCounterMode formula: not counted)
    decode   conv  2·B·C·K·2; the delta rule's step (the state's decay, its read by k and q, the rank-1 update) runs
             as elementwise products in transformers' torch path: 0 in FlopCounterMode's count; a fused kernel
             spends them as 3 × 2·B·Hv·dk·dv multiply-adds, named beside the bound (DeltaNetMixer.elementwise)

Each formula was held against FlopCounterMode on a real decode step of tiny cuts (K 3 to 5, N 4 and 8, B 1 and 2,
S 5 to 19, Q 8 and 16) and is held again per config by flops/check.py's generation check before serve uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dims import config_int

# the model types whose recurrent layers each formula was held against (their own class's cached decode)
_MAMBA1 = ("mamba", "falcon_mamba", "jamba")
_MAMBA2 = ("falcon_h1", "mamba2", "bamba", "nemotron_h", "granitemoehybrid")
DECODE_CONV_OUTPUTS = 2  # L: causal_conv1d_update's outputs over the K cached columns and the new one
_SHORT_CONV = ("lfm2", "lfm2_moe")  # model types whose "conv" layers are LFM2's gated short convolution
# model types whose linear attention is a gated DeltaNet (Qwen3.5's: its text config's, which serve reads)
_DELTA_NET = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
DELTA_NET_CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size (its callers leave the default)
# layer kinds (memory/kv.py's layer_kinds) that hold a recurrent state; a hybrid layer holds attention beside it
RECURRENT_KINDS = ("linear_attention", "mamba", "mamba2", "conv", "recurrent", "ssm", "attention_free", "hybrid",
                   "hybrid_sliding")


@dataclass(frozen=True)
class MambaMixer:
    path: str
    inner: int  # I
    kernel: int  # K
    state: int  # N
    decode_outputs: int  # L

    def prefill(self, batch: int, seq: int) -> int:
        return _conv_prefill(batch, self.inner, self.kernel, seq) + 2 * batch * seq * self.inner * self.state

    def step(self, batch: int) -> int:
        return 2 * batch * self.inner * (self.kernel * self.decode_outputs + self.state)

    def shape(self) -> str:
        return (f"Mamba (I {self.inner:,}, K {self.kernel}, N {self.state}): conv 2·B·I·K·{self.decode_outputs} "
                "+ scan 2·B·I·N")


@dataclass(frozen=True)
class Mamba2Mixer:
    """A Mamba-2 (SSD) mixer: H heads of P channels, state N, conv over I + 2·G·N channels, chunks of Q."""

    path: str
    conv: int  # the conv's channels, I + 2·G·N
    kernel: int  # K
    heads: int  # H
    head_dim: int  # P
    state: int  # N
    chunk: int  # Q
    decode_outputs: int  # L

    def _ssd(self, batch: int, seq: int) -> int:
        chunks = -(-seq // self.chunk)
        h, p, n, q = self.heads, self.head_dim, self.state, self.chunk
        return batch * (2 * chunks * q * q * h * (n + p) + 4 * chunks * q * h * n * p
                        + 2 * h * (chunks + 1) ** 2 * p * n)

    def prefill(self, batch: int, seq: int) -> int:
        return _conv_prefill(batch, self.conv, self.kernel, seq) + self._ssd(batch, seq)

    def step(self, batch: int) -> int:
        return 2 * batch * (self.conv * self.kernel * self.decode_outputs + self.heads * self.head_dim * self.state)

    def shape(self) -> str:
        return (f"Mamba-2 (H {self.heads}, P {self.head_dim}, N {self.state}, conv {self.conv:,} × K {self.kernel}, "
                f"Q {self.chunk}): conv 2·B·conv·K·{self.decode_outputs} + scan 2·B·H·P·N")


def _conv_prefill(batch: int, channels: int, kernel: int, seq: int) -> int:
    """causal_conv1d_fn over the cache's columns: a prompt shorter than K padded to K, then K − 1 each side."""
    return 2 * batch * channels * kernel * (max(seq, kernel) + kernel - 1)


@dataclass(frozen=True)
class ShortConvMixer:
    """LFM2's gated short convolution: a depthwise conv over D channels, kernel K."""

    path: str
    channels: int  # D
    kernel: int  # K

    def prefill(self, batch: int, seq: int) -> int:
        return _conv_prefill(batch, self.channels, self.kernel, seq)

    def step(self, batch: int) -> int:
        return 2 * batch * self.channels * self.kernel * 2

    def shape(self) -> str:
        return f"short conv (D {self.channels:,}, K {self.kernel}): conv 2·B·D·K·2"


@dataclass(frozen=True)
class DeltaNetMixer:
    """A gated DeltaNet layer: a conv over C channels, Hv value heads with a dk × dv state each."""

    path: str
    conv: int  # C = 2·Hk·dk + Hv·dv
    kernel: int  # K
    heads: int  # Hv
    key_dim: int  # dk
    value_dim: int  # dv
    chunk: int = DELTA_NET_CHUNK  # Q

    def prefill(self, batch: int, seq: int) -> int:
        chunks = -(-seq // self.chunk)
        q, k, v = self.chunk, self.key_dim, self.value_dim
        rule = batch * self.heads * chunks * (4 * q * q * k + 2 * q * q * v + 6 * q * k * v)
        return _conv_prefill(batch, self.conv, self.kernel, seq) + rule

    def step(self, batch: int) -> int:
        return 2 * batch * self.conv * self.kernel * 2

    def elementwise(self, batch: int) -> int:
        """The delta rule's step as a fused kernel spends it (read by k, rank-1 update, read by q), not in step()."""
        return 3 * 2 * batch * self.heads * self.key_dim * self.value_dim

    def shape(self) -> str:
        return (f"gated DeltaNet (Hv {self.heads}, dk {self.key_dim}, dv {self.value_dim}, conv {self.conv:,} × "
                f"K {self.kernel}): conv 2·B·C·K·2 (the delta rule's step: elementwise, not counted)")


@dataclass(frozen=True)
class RecurrentFlops:
    """The recurrent layers' FLOPs outside their nn.Linear weights, layer by layer."""

    mixers: tuple[Any, ...]  # MambaMixer | Mamba2Mixer | ShortConvMixer | DeltaNetMixer

    def prefill(self, batch: int, seq: int) -> int:
        return sum(m.prefill(batch, seq) for m in self.mixers)

    def step(self, batch: int) -> int:
        return sum(m.step(batch) for m in self.mixers)

    def elementwise(self, batch: int) -> int:
        """A step's multiply-adds that transformers' torch path runs elementwise (gated DeltaNet's delta rule)."""
        return sum(m.elementwise(batch) for m in self.mixers if isinstance(m, DeltaNetMixer))

    def words(self) -> str:
        shapes = sorted({m.shape() for m in self.mixers})
        return "; ".join(f"{sum(1 for m in self.mixers if m.shape() == s)} mixers {s} = "
                         f"{next(m for m in self.mixers if m.shape() == s).step(1):,} × B a step each"
                         for s in shapes)


class NoRecurrentFormula(Exception):
    """A recurrent layer whose decode FLOPs have no formula here (a model type none of the tables name)."""


def recurrent_flops(view: Any, config: Any) -> RecurrentFlops | None:
    """The recurrent layers' conv and scan FLOPs; None where the model has no recurrent layer. Raises
    NoRecurrentFormula where it has one with no formula here."""
    from ..memory.kv import layer_kinds

    recurrent = [kind for kind, _ in layer_kinds(config) if kind in RECURRENT_KINDS]
    if not recurrent:
        return None
    model_type = str(getattr(config, "model_type", ""))
    if model_type not in (*_MAMBA1, *_MAMBA2, *_SHORT_CONV, *_DELTA_NET):
        raise NoRecurrentFormula(model_type)
    mixers: list[Any] = []
    for path, sub in view.root.named_modules():
        # _modules: what a torch module and the template's stand-in for one (facts' view) both hold
        children = dict(getattr(sub, "_modules", None) or {})
        a_log = sub._parameters.get("A_log") if hasattr(sub, "_parameters") else None
        if model_type in _SHORT_CONV and a_log is None and {"conv", "in_proj", "out_proj"} <= set(children):
            weight = children["conv"]._parameters["weight"]
            mixers.append(ShortConvMixer(path, int(weight.shape[0]), int(weight.shape[-1])))
            continue
        if a_log is None or "conv1d" not in children:
            continue
        if model_type in _DELTA_NET:
            mixers.append(_delta_net(path, children["conv1d"]._parameters["weight"], a_log, config, model_type))
            continue
        weight = children["conv1d"]._parameters["weight"]
        conv, kernel = int(weight.shape[0]), int(weight.shape[-1])
        if {"x_proj", "dt_proj"} <= set(children) and model_type in _MAMBA1:
            mixers.append(MambaMixer(path, conv, kernel, int(a_log.shape[-1]), DECODE_CONV_OUTPUTS))
        elif len(a_log.shape) == 1 and model_type in _MAMBA2:
            heads = int(a_log.shape[0])
            state = config_int(config, "mamba_d_state", "ssm_state_size", "state_size")
            groups = config_int(config, "mamba_n_groups", "n_groups") or 1
            chunk = config_int(config, "mamba_chunk_size", "chunk_size")
            if not state or not chunk or (conv - 2 * groups * state) % heads:
                raise NoRecurrentFormula(model_type)
            mixers.append(Mamba2Mixer(path, conv, kernel, heads, (conv - 2 * groups * state) // heads, state, chunk,
                                      DECODE_CONV_OUTPUTS))
    if len(mixers) != len(recurrent):  # a layer not read as a Mamba mixer: no guess
        raise NoRecurrentFormula(str(getattr(config, "model_type", "")))
    return RecurrentFlops(tuple(mixers))


def _delta_net(path: str, weight: Any, a_log: Any, config: Any, model_type: str) -> DeltaNetMixer:
    """A gated DeltaNet layer from its conv's and A_log's shapes and the config's head sizes, which must agree."""
    conv, kernel, heads = int(weight.shape[0]), int(weight.shape[-1]), int(a_log.shape[0])
    key_heads = config_int(config, "linear_num_key_heads")
    key_dim, value_dim = config_int(config, "linear_key_head_dim"), config_int(config, "linear_value_head_dim")
    if not key_heads or not key_dim or not value_dim or conv != 2 * key_heads * key_dim + heads * value_dim:
        raise NoRecurrentFormula(model_type)
    return DeltaNetMixer(path, conv, kernel, heads, key_dim, value_dim)


def attention_free_linears(view: Any, params: Any, config: Any) -> tuple[int, int] | None:
    """(matmul weights a token meets, of which the head's) in a model without attention (analytic.py's forward
    needs an attention shape): every nn.Linear once, a tied head too; None with routed experts (no count here)."""
    from .analytic import routing

    if routing(config)[1]:
        return None
    weights = head = 0
    for path, sub in view.root.named_modules():
        if view.is_matmul(sub):
            numel = sub._parameters["weight"].numel()
            weights += numel
            if path.rsplit(".", 1)[-1] in ("lm_head", "head"):
                head += numel
    return (weights, head) if head else None


__all__ = ["MambaMixer", "Mamba2Mixer", "ShortConvMixer", "DeltaNetMixer", "NoRecurrentFormula", "RecurrentFlops",
           "attention_free_linears", "recurrent_flops"]
