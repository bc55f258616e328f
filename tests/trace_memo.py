"""One fake-tensor trace per identical step in a test module (the `shared_traces` fixture, tests/conftest.py).

A traced step (traced/step.trace_training) or recorded step (traced/timeline.record_training_step) on fake tensors
is a function of the module's structure and the step's settings only: its values are never read. Where tests ask
for the same step twice (an answer with --trace beside the same answer without it, where that one traces too; a
derivation that two tests ask for), the second is the first's result, copied. The key is everything the step
reads: the class, its whole config (and the attention each submodule's config names), every submodule's type,
mode, extra_repr, plain attributes and hooks, every parameter's and buffer's name, shape, stride, dtype, device,
type, trainability and which ones are tied, the settings (less a weights dtype that changes no parameter's dtype:
`settings_read`), the layer path, torch's default dtype and grad mode. A step on real tensors (fake=False) or with
media inputs is never shared.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

_PLAIN = (bool, int, float, str, type(None))
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
          "_load_state_dict_pre_hooks")


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(_plain(v) for v in value))


def module_key(module: Any) -> str:
    """A digest of everything a fake-tensor step of `module` reads (the module docstring)."""
    import torch

    digest = hashlib.sha256()

    def put(*parts: Any) -> None:
        digest.update(repr(parts).encode())

    put(type(module).__module__, type(module).__qualname__, torch.get_default_dtype(), torch.is_grad_enabled())
    config = getattr(module, "config", None)
    if config is not None:
        try:
            put(config.to_json_string(use_diff=False))
        except (AttributeError, TypeError, ValueError):  # not a PretrainedConfig, or a field JSON cannot hold
            put(repr(config), sorted(vars(config).items(), key=lambda kv: kv[0]) if hasattr(config, "__dict__")
                else None)
    for name, sub in module.named_modules(remove_duplicate=False):
        sub_config = getattr(sub, "config", None)
        put(name, type(sub).__module__, type(sub).__qualname__, sub.training, sub.extra_repr(),
            sorted((k, v) for k, v in vars(sub).items() if not k.startswith("_") and _plain(v)),
            [len(getattr(sub, hooks, ())) for hooks in _HOOKS],
            getattr(sub_config, "_attn_implementation", None) if sub_config is not None else None)
    tied: dict[int, int] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        put(name, tuple(param.shape), param.stride(), param.dtype, param.device.type, type(param).__name__,
            param.requires_grad, tied.setdefault(id(param), len(tied)))
    for name, buffer in module.named_buffers(remove_duplicate=False):
        put(name, tuple(buffer.shape), buffer.dtype, buffer.device.type)
    return digest.hexdigest()


def settings_read(module: Any, settings: Any) -> Any:
    """`settings` as the step reads them on `module`: a weights_dtype (with its own_dtype exceptions) that changes no
    parameter's dtype dropped. working_copy (traced/step.py) reads them only to give a floating parameter not named
    in own_dtype that dtype, so where every such parameter has it already the fake copy is the same without it (a
    live float32 module asked as --training estimates it, weights_dtype 'float32', beside a test's own settings)."""
    import dataclasses

    import torch

    name = getattr(settings, "weights_dtype", None)
    if not name:
        return settings
    target = getattr(torch, name)
    own = {id(p) for n, p in module.named_parameters(remove_duplicate=False) if n in settings.own_dtype}
    if any(p.dtype.is_floating_point and p.dtype != target and id(p) not in own for p in module.parameters()):
        return settings
    return dataclasses.replace(settings, weights_dtype=None, own_dtype=frozenset())


def share_traces(monkeypatch: Any, store: dict, module: Any = None) -> None:
    """Route trace_training and record_training_step through `store` (a dict kept across the tests that share it)
    for this test: where paramscope calls them, and in the test's `module` where it imported them by name."""
    import paramscope.cost.memory.training_moments as moments
    import paramscope.cost.traced.step as step
    import paramscope.cost.traced.timeline as timeline

    trace, record = step.trace_training, timeline.record_training_step

    def shared(function: Any, key: tuple | None, *args: Any, **kwargs: Any) -> Any:
        if key is None:
            return function(*args, **kwargs)
        if key not in store:
            store[key] = function(*args, **kwargs)
        return copy.deepcopy(store[key])

    def trace_training(module: Any, settings: Any, *, fake: bool = True) -> Any:
        key = ("trace", module_key(module), repr(settings_read(module, settings))) \
            if fake and settings.media is None else None
        return shared(trace, key, module, settings, fake=fake)

    def record_training_step(module: Any, settings: Any, layer_path: str, *, fake: bool = True) -> Any:
        key = ("record", module_key(module), repr(settings_read(module, settings)), layer_path) \
            if fake and getattr(settings, "media", None) is None else None
        return shared(record, key, module, settings, layer_path, fake=fake)

    for owner in (step, moments, timeline, module):
        for name, original, routed in (("trace_training", trace, trace_training),
                                       ("record_training_step", record, record_training_step)):
            if owner is not None and getattr(owner, name, None) is original:
                monkeypatch.setattr(owner, name, routed)
