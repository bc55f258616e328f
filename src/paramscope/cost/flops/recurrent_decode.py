"""generate()'s FLOPs in recurrent (selective state-space) layers beyond their nn.Linear projections.

Convention: FlopCounterMode's, as the rest of flops/: matmuls and convolutions count (2 a multiply-add);
the discretisation (exp, softplus), the gate, the D skip and other elementwise ops do not. The projections (in_proj,
x_proj, dt_proj, out_proj) are nn.Linear and counted with every other weight (2·T·numel). What is left, per Mamba
(selective SSM, Mamba-1) mixer with I inner channels (conv1d's rows), kernel K and state size N (A_log's columns):

    prefill of S tokens  conv  2·B·I·K·(S + K − 1)   causal_conv1d_fn: depthwise, padded K − 1 each side,
                                                     all S + K − 1 outputs computed, the first S kept
                         scan  2·B·S·I·N             each token's state read out by its C (a matmul)
    decode step          conv  2·B·I·K·L             L: the outputs transformers' decode path computes:
                                                       mamba, falcon_mamba: 2K − 1 (the cache hands its K-column
                                                         window back to causal_conv1d_fn, padded K − 1)
                                                       jamba: 2 (causal_conv1d_update: K + 1 columns, unpadded)
                         scan  2·B·I·N               the new state read out by C
    — independent of the context: a recurrent layer's step costs the same at any C.

A Mamba-2 (SSD) mixer (Falcon-H1's) with H heads of P channels, state N, G groups, its conv over
C = H·P + 2·G·N channels and chunks of Q (c = ⌈S/Q⌉ chunks, the prompt padded to whole chunks):

    prefill  conv  2·B·C·K·(S + K − 1)
             scan  B·(2·c·Q²·H·(N + P) + 4·c·Q·H·N·P + 2·H·(c + 1)²·P·N): within-chunk C·Bᵀ and its
                   product with x, each chunk's state and its read-out, the states passed chunk to chunk
    decode   conv  2·B·C·K·2 (causal_conv1d_update), scan 2·B·H·P·N

Each formula was held against FlopCounterMode on a real decode step of tiny cuts (K 3 to 5, N 4 and 8, B 1 and 2,
S 5 to 19, Q 8 and 16) and is held again per config by flops/check.py's generation check before serve uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dims import config_int

# model_type → the decode conv's outputs as a function of K (see the module's docstring)
_DECODE_CONV_OUTPUTS = {"mamba": lambda k: 2 * k - 1, "falcon_mamba": lambda k: 2 * k - 1, "jamba": lambda k: 2}
# Mamba-2 mixers: model_type → the decode conv's outputs as a function of K. Not mamba2 itself: transformers'
# torch decode runs its chunked scan on the one token padded to chunk_size Q (measured: Q²-sized matmuls a step),
# a count no server spends, so no bound is drawn from it
_MAMBA2 = {"falcon_h1": lambda k: 2}
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
        conv = 2 * batch * self.inner * self.kernel * (seq + self.kernel - 1)
        return conv + 2 * batch * seq * self.inner * self.state

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
        return 2 * batch * self.conv * self.kernel * (seq + self.kernel - 1) + self._ssd(batch, seq)

    def step(self, batch: int) -> int:
        return 2 * batch * (self.conv * self.kernel * self.decode_outputs + self.heads * self.head_dim * self.state)

    def shape(self) -> str:
        return (f"Mamba-2 (H {self.heads}, P {self.head_dim}, N {self.state}, conv {self.conv:,} × K {self.kernel}, "
                f"Q {self.chunk}): conv 2·B·conv·K·{self.decode_outputs} + scan 2·B·H·P·N")


@dataclass(frozen=True)
class RecurrentFlops:
    """The recurrent layers' FLOPs outside their nn.Linear weights, layer by layer."""

    mixers: tuple[Any, ...]  # MambaMixer | Mamba2Mixer

    def prefill(self, batch: int, seq: int) -> int:
        return sum(m.prefill(batch, seq) for m in self.mixers)

    def step(self, batch: int) -> int:
        return sum(m.step(batch) for m in self.mixers)

    def words(self) -> str:
        shapes = sorted({m.shape() for m in self.mixers})
        return "; ".join(f"{sum(1 for m in self.mixers if m.shape() == s)} mixers {s} = "
                         f"{next(m for m in self.mixers if m.shape() == s).step(1):,} × B a step each"
                         for s in shapes)


class NoRecurrentFormula(Exception):
    """A recurrent layer whose decode FLOPs have no formula here (Mamba-2, gated DeltaNet, short convolutions)."""


def recurrent_flops(view: Any, config: Any) -> RecurrentFlops | None:
    """The Mamba mixers' conv and scan FLOPs; None where the model has no recurrent layer. Raises
    NoRecurrentFormula where it has one with no formula here."""
    from ..memory.kv import layer_kinds

    recurrent = [kind for kind, _ in layer_kinds(config) if kind in RECURRENT_KINDS]
    if not recurrent:
        return None
    outputs = _DECODE_CONV_OUTPUTS.get(str(getattr(config, "model_type", "")))
    if outputs is None and str(getattr(config, "model_type", "")) not in _MAMBA2:
        raise NoRecurrentFormula(str(getattr(config, "model_type", "")))
    model_type = str(getattr(config, "model_type", ""))
    mixers: list[Any] = []
    for path, sub in view.root.named_modules():
        children = dict(sub.named_children()) if hasattr(sub, "named_children") else {}
        a_log = sub._parameters.get("A_log") if hasattr(sub, "_parameters") else None
        if a_log is None or "conv1d" not in children:
            continue
        weight = children["conv1d"]._parameters["weight"]
        conv, kernel = int(weight.shape[0]), int(weight.shape[-1])
        if {"x_proj", "dt_proj"} <= set(children) and model_type in _DECODE_CONV_OUTPUTS:
            mixers.append(MambaMixer(path, conv, kernel, int(a_log.shape[-1]), outputs(kernel)))
        elif len(a_log.shape) == 1 and model_type in _MAMBA2:
            heads = int(a_log.shape[0])
            state = config_int(config, "mamba_d_state", "state_size")
            groups = config_int(config, "mamba_n_groups", "n_groups") or 1
            chunk = config_int(config, "mamba_chunk_size", "chunk_size")
            if not state or not chunk or (conv - 2 * groups * state) % heads:
                raise NoRecurrentFormula(model_type)
            mixers.append(Mamba2Mixer(path, conv, kernel, heads, (conv - 2 * groups * state) // heads, state, chunk,
                                      _MAMBA2[model_type](kernel)))
    if len(mixers) != len(recurrent):  # a layer not read as a Mamba mixer: no guess
        raise NoRecurrentFormula(str(getattr(config, "model_type", "")))
    return RecurrentFlops(tuple(mixers))





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
__all__ = ["MambaMixer", "NoRecurrentFormula", "RecurrentFlops", "attention_free_linears", "recurrent_flops"]
