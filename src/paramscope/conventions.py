"""The parameter counts people quote, each under the name of the convention that defines it.

"How many parameters?" has several honest answers. Papers and model cards pick one without saying which;
paramscope gives each with its label and a one-line definition, so that a figure can be matched to its source:

- nanoGPT's non-embedding count (`GPT.get_num_params(non_embedding=True)`): the total minus learned position
  embeddings. Token embeddings stay in, because nanoGPT ties them to the LM head, which does real work.
- transformers' `model.num_parameters(exclude_embeddings=True)`: the total minus the `.weight` of every
  `nn.Embedding` module (subclasses included: BART's learned positions, T5's relative-attention bias), by the
  modules' first names. Mirrored here line for line, so the figures agree exactly.
- with / without the LM head: the total counts an untied vocabulary projection; "without" removes it (Llama-3-8B:
  8,030,261,248 with, 7,504,924,672 without). A tied head shares the token embeddings' tensor, so removing it
  removes nothing, and the pair is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .count import ParameterInfo, TiedGroup

# Roles of a vocabulary projection (the LM head, or an untied MLM decoder).
LM_HEAD_ROLES = ("head.lm", "head.decoder")


@dataclass(frozen=True)
class Convention:
    key: str  # stable identifier, used as the JSON key
    label: str  # what to call the figure
    value: int
    definition: str  # one line: what is in, what is out

    @property
    def text(self) -> str:
        return f"{self.label}: {self.value:,} ({self.definition})"


def named_counts(params: tuple[ParameterInfo, ...], tied: tuple[TiedGroup, ...], total: int,
                 module: Any = None) -> tuple[Convention, ...]:
    """Every convention that applies to this model, in a fixed order.

    The LM-head pair appears only when the model has an untied vocabulary projection: a tied head shares the
    token embeddings' tensor, so "with" and "without" would both be the total.
    """
    out: list[Convention] = []
    position = sum(p.numel for p in params if p.role == "embeddings.position")
    out.append(Convention(
        "non_embedding_nanogpt",
        "non-embedding (nanoGPT)",
        total - position,
        f"total − learned position embeddings ({position:,}); token embeddings, a tied head, stay in",
    ))
    if module is not None:
        value, excluded = exclude_embeddings(module, params)
        out.append(Convention(
            "exclude_embeddings_transformers",
            "non-embedding (transformers)",
            value,
            f"num_parameters(exclude_embeddings=True): total − every nn.Embedding weight "
            f"({excluded} {'tensor' if excluded == 1 else 'tensors'})",
        ))
    untied = sum(p.numel for p in params if p.role in LM_HEAD_ROLES)
    if untied:
        out.append(Convention("with_lm_head", "with LM head", total,
                              f"total, the untied LM head ({untied:,}) included"))
        out.append(Convention("without_lm_head", "without LM head", total - untied,
                              f"total − the untied LM head's vocabulary projection ({untied:,})"))
    return tuple(out)


def embedding_weight_names(module: Any) -> set[str]:
    """`{name}.weight` of every nn.Embedding module, by its first name (named_modules()); a template's stand-in
    modules say which are embeddings themselves, so no torch is needed for them."""
    if getattr(module, "paramscope_stub", False):
        return {f"{name}.weight" for name, sub in module.named_modules() if sub.is_embedding}
    import torch

    return {f"{name}.weight" for name, sub in module.named_modules() if isinstance(sub, torch.nn.Embedding)}


def exclude_embeddings(module: Any, params: tuple[ParameterInfo, ...] | None = None) -> tuple[int, int]:
    """(count, tensors excluded), exactly as `PreTrainedModel.num_parameters(exclude_embeddings=True)` computes it
    (transformers 5.23, modeling_utils): embedding names come from `named_modules()` (first name of each module),
    parameters from `named_parameters()` (first name of each tensor); a name in both is left out.

    `params`, when given, are the module's counted parameters: each under its first name, as named_parameters()
    yields them, so the module need not be walked a second time."""
    embedding_param_names = embedding_weight_names(module)
    named = ((p.name, p.numel) for p in params) if params is not None else (
        (name, param.numel()) for name, param in module.named_parameters())
    total = 0
    excluded = 0
    for name, numel in named:
        if name in embedding_param_names:
            excluded += 1
            continue
        total += numel
    return int(total), excluded
