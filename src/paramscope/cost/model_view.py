"""What the analytic memory and FLOP engines read of a model, from the meta build or from recorded facts.

The analytic engines need a little more than the report: the config as the class reads it (attribute maps,
defaults, fields its __init__ derives), which modules run as one matmul, which ones transformers' quantisers
replace, what the class keeps in fp32, whether it generates, and how many bytes its real cache holds after a
two-token prefill. A `ModelView` gives exactly that:

- `from_module`: read from the module built on meta (and, for the cache, a prefill run on it);
- `cost_facts.view_from_facts`: read from `CostFacts`, recorded from such a module for one config and checked
  against it (facts/record.py), with the template's stand-in modules for the structure. No torch, no
  transformers.

Both go through the same arithmetic, so the facts path answers what the build would, or refuses: a read the
facts do not hold raises `FactsGap`, and the caller builds instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable


class FactsGap(Exception):
    """The recorded facts do not hold something the engines asked for: the build answers instead.

    Deliberately not an AttributeError: `getattr(config, name, None)` must not read a gap as an absent field."""


def gap_words(error: Exception) -> str:
    """Why recorded facts did not answer, for the report's engine line. A FactsGap names what they lack; anything
    else means facts that break the arithmetic (a tampered cache): the build answers either way."""
    if isinstance(error, FactsGap):
        return str(error)
    return f"the recorded cost facts could not answer ({type(error).__name__}); built instead"


@dataclass(frozen=True)
class ModelView:
    class_name: str
    config: Any  # attribute access as transformers' config object gives it
    root: Any  # named_modules() of modules with `_parameters`: the nn.Module, or the template's stand-ins
    can_generate: bool
    supports_checkpointing: bool  # transformers' supports_gradient_checkpointing
    matmul_classes: frozenset[str]  # module classes whose forward is one matmul by `weight` (nn.Linear, Conv1D)
    linear_classes: frozenset[str]  # module classes transformers' quantisers replace (exactly nn.Linear, Conv1D)
    default_skips: tuple[str, ...]  # transformers' get_keys_to_not_convert
    keep_fp32: Callable[[str], tuple[str, ...] | None]  # compute dtype → globs of the names kept in fp32, or None
    probe: Callable[[str], int | None]  # build dtype → the real cache's bytes after a 2-token prefill, or None
    module: Any = None  # the built module (traces); None from facts

    def check_checkpointing(self) -> None:
        """One line for --grad-checkpointing full on a class that cannot checkpoint (as the traced step says)."""
        if not self.supports_checkpointing:
            from ..errors import UnsupportedError

            raise UnsupportedError("{name} does not support gradient checkpointing ({0} full)", "grad_checkpointing",
                                   name=self.class_name)

    def is_matmul(self, sub: Any) -> bool:
        if self.module is not None:
            return is_matmul_module(sub)
        return type(sub).__name__ in self.matmul_classes

    def linear_modules(self) -> list[str]:
        """Module paths whose weight transformers' "linear" quantisers would replace, in module order."""
        if self.module is not None:
            return [path for path, sub in self.root.named_modules() if _is_linear(sub)]
        return [path for path, sub in self.root.named_modules() if type(sub).__name__ in self.linear_classes]

    def kept_in_fp32(self, dtype: str, names: list[str]) -> frozenset[str]:
        """Of `names`, those transformers keeps in float32 when loading in `dtype`: globs paramscope compiles and
        matches with bounded work (facts/globs.py), never a regular expression from a cache."""
        from .facts.globs import match_any

        try:
            globs = self.keep_fp32(dtype)
        except FactsGap:  # a class's own list no glob expresses: the build asks transformers' own matcher
            if self.module is None:
                raise
            return _kept_by_transformers(self.module, dtype, names)
        if not globs:
            return frozenset()
        return frozenset(name for name in names if match_any(globs, name))


def from_module(module: Any, build_dtype: str | None = None) -> ModelView:
    """The view of a module built on meta (or a live module), read as the libraries read it."""
    import functools

    return ModelView(
        class_name=type(module).__name__,
        config=getattr(module, "config", None),
        root=module,
        can_generate=_can_generate(module),
        supports_checkpointing=bool(getattr(module, "supports_gradient_checkpointing", False)),
        matmul_classes=frozenset(type(sub).__name__ for _, sub in module.named_modules() if is_matmul_module(sub)),
        linear_classes=frozenset(type(sub).__name__ for _, sub in module.named_modules() if _is_linear(sub)),
        default_skips=_default_skips(module),
        keep_fp32=functools.lru_cache(maxsize=None)(lambda dtype: _keep_fp32_globs(module, dtype)),
        probe=functools.lru_cache(maxsize=None)(lambda dtype: _probe(module)),
        module=module,
    )


def _can_generate(module: Any) -> bool:
    """A model that generates (transformers' `can_generate`) serves with a KV cache."""
    can_generate = getattr(module, "can_generate", None)
    try:
        return bool(can_generate()) if callable(can_generate) else False
    except (TypeError, NotImplementedError):  # a live module's own can_generate that wants arguments, or has none
        return False


def is_matmul_module(sub: Any) -> bool:
    """A module whose forward is one matmul by its `weight`: nn.Linear and its subclasses, GPT-2's Conv1D."""
    import torch

    return isinstance(sub, torch.nn.Linear) or type(sub).__name__ == "Conv1D"


def _is_linear(sub: Any) -> bool:
    """What transformers' quantisers replace: exactly nn.Linear, or transformers' Conv1D."""
    import torch

    if type(sub) is torch.nn.Linear:
        return True
    if type(sub).__name__ != "Conv1D":
        return False
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is absent: only torch modules
        return False
    return isinstance(sub, Conv1D)


def _default_skips(module: Any) -> tuple[str, ...]:
    """transformers' `get_keys_to_not_convert`: tied weights, the last module, the output embeddings."""
    try:
        from transformers.quantizers.base import get_keys_to_not_convert

        return tuple(sorted(get_keys_to_not_convert(module)))  # a set underneath: sorted, so facts are stable
    except ImportError:  # a transformers without the helper: nothing is skipped by default
        return ()
    except (AttributeError, IndexError):  # not a PreTrainedModel (a live torch module), or one with no parameter
        return ()


def _keep_fp32_globs(module: Any, dtype: str) -> tuple[str, ...] | None:
    """Globs of the names transformers keeps in float32 when loading in `dtype` (`_keep_in_fp32_modules` and
    `_keep_in_fp32_modules_strict`), each matching exactly what its loader's regex finds for that entry
    (facts/globs.glob_of); None when it keeps none. FactsGap for an entry no glob can express (a regex character
    in a class's own list): the facts are not recorded, and the build answers every time."""
    plan_of = getattr(module, "_get_dtype_plan", None)
    if plan_of is None:
        return None
    import torch

    from .facts.globs import MAX_GLOBS, glob_of

    try:
        plan = plan_of(getattr(torch, dtype))
    except (AttributeError, TypeError):  # an older or newer transformers: the helper absent or changed
        return None
    if not plan:
        return None
    names = sorted(str(name) for name in plan)  # sorted: a set underneath, and facts must be stable
    globs = tuple(glob_of(name) for name in names)
    if None in globs or len(globs) > MAX_GLOBS:
        raise FactsGap(f"{type(module).__name__} keeps {names!r} in float32, which paramscope's globs cannot "
                       "express")
    return globs  # type: ignore[return-value]


def _kept_by_transformers(module: Any, dtype: str, names: list[str]) -> frozenset[str]:
    """As kept_in_fp32, by the regex transformers' loader compiles from the class's own list (never from a cache)."""
    import torch
    from transformers.core_model_loading import build_glob_alternation

    regex = build_glob_alternation(sorted(module._get_dtype_plan(getattr(torch, dtype))))[0]
    return frozenset(name for name in names if regex.search(name))


def _probe(module: Any) -> int | None:
    """The bytes of the real cache after a 2-token prefill on meta (in the dtype the module was built in)."""
    from .traced.cache_probe import probe_cache

    probed = probe_cache(module, batch=1, seq=2)
    return None if probed is None else probed.bytes


# a multimodal model's towers and the projectors feeding the language model from them, by module name
_TOWER = re.compile(r"vision|visual|image|audio|speech|projector|merger|connector|resampler", re.IGNORECASE)


def towers_not_run(view: Any) -> tuple[str, ...]:
    """The module paths of the towers a text input does not run: in a multimodal model (its config has a vision or
    audio config), each top-level part (or part of the `model` wrapper) named as a vision or audio tower or as the
    projector from one. A wrong guess shows in the check against FlopCounterMode (flops/check.py); memory
    --training keeps no gradient or optimizer state for them."""
    config = view.config
    if all(getattr(config, key, None) is None for key in ("vision_config", "audio_config")):
        return ()
    found: list[str] = []
    for path, _ in view.root.named_modules():
        depth = path.count(".")
        if path and (depth == 0 or depth == 1 and path.startswith("model.")) and \
                _TOWER.search(path.rsplit(".", 1)[-1]) and not any(path.startswith(f + ".") for f in found):
            found.append(path)
    return tuple(found)
