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

Each formula was held against FlopCounterMode on a real decode step of tiny cuts (K 3 to 5, N 4 and 8, B 1 and 2,
S 5 and 9) and is held again per config by flops/check.py's generation check before serve uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# model_type → the decode conv's outputs as a function of K (see the module's docstring)
_DECODE_CONV_OUTPUTS = {"mamba": lambda k: 2 * k - 1, "falcon_mamba": lambda k: 2 * k - 1, "jamba": lambda k: 2}
RECURRENT_KINDS = ("linear_attention", "mamba", "mamba2", "conv", "recurrent", "ssm", "attention_free")


@dataclass(frozen=True)
class MambaMixer:
    path: str
    inner: int  # I
    kernel: int  # K
    state: int  # N
    decode_outputs: int  # L


@dataclass(frozen=True)
class RecurrentFlops:
    """The recurrent layers' FLOPs outside their nn.Linear weights, layer by layer."""

    mixers: tuple[MambaMixer, ...]

    def prefill(self, batch: int, seq: int) -> int:
        return sum(2 * batch * m.inner * m.kernel * (seq + m.kernel - 1) + 2 * batch * seq * m.inner * m.state
                   for m in self.mixers)

    def step(self, batch: int) -> int:
        return sum(2 * batch * m.inner * (m.kernel * m.decode_outputs + m.state) for m in self.mixers)

    def words(self) -> str:
        shapes = sorted({(m.inner, m.kernel, m.state, m.decode_outputs) for m in self.mixers})
        parts = [f"{sum(1 for m in self.mixers if (m.inner, m.kernel, m.state, m.decode_outputs) == s)} Mamba "
                 f"mixers (I {s[0]:,}, K {s[1]}, N {s[2]}): conv 2·B·I·K·{s[3]} + scan 2·B·I·N a step "
                 f"= {2 * s[0] * (s[1] * s[3] + s[2]):,} × B each" for s in shapes]
        return "; ".join(parts)


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
    if outputs is None:
        raise NoRecurrentFormula(str(getattr(config, "model_type", "")))
    mixers = []
    for path, sub in view.root.named_modules():
        children = dict(sub.named_children()) if hasattr(sub, "named_children") else {}
        a_log = sub._parameters.get("A_log") if hasattr(sub, "_parameters") else None
        if a_log is None or not {"conv1d", "x_proj", "dt_proj"} <= set(children):
            continue
        inner, kernel = children["conv1d"]._parameters["weight"].shape[0], children["conv1d"]._parameters[
            "weight"].shape[-1]
        mixers.append(MambaMixer(path, int(inner), int(kernel), int(a_log.shape[-1]), outputs(int(kernel))))
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
