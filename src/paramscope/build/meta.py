"""The build on the meta device (build_on_meta, build_class_on_meta): the class instantiated with every tensor on
meta, in the asked dtype (each sub-config's too), within a module budget (MAX_MODULES), its errors in one line."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from ..errors import ConfigError, ModelClassError, RemoteCodeError
from .limits import MAX_MODULES
from .quiet import first_line, quiet_transformers
from .remote_code import remote_class


def build_on_meta(class_name: str, config, *, code_ref: str | None = None, code_location: str | None = None,
                  dtype: str | None = None):
    """Instantiate `class_name` from `config` with every tensor on the meta device: no memory for weights.

    `code_ref` names a remote-code class (auto_map) to import from `code_location` instead of transformers'.
    `dtype` ("bfloat16") is the default dtype during the build, as `from_pretrained(dtype=…)` sets it, so each
    tensor gets the dtype loading gives it (a tensor the code creates in float32 explicitly stays float32).
    At most MAX_MODULES modules are built: a config that slipped past the field checks still cannot cost minutes.
    """
    import transformers

    cls = remote_class(code_ref, code_location) if code_ref else getattr(transformers, class_name, None)
    if cls is None:
        raise ModelClassError(f"unknown class {class_name!r}")
    return build_class_on_meta(cls, config, dtype=dtype)


def build_class_on_meta(cls, config, *, dtype: str | None = None):
    """`cls(config)` on the meta device, in `dtype`, within the module budget (build_on_meta's core)."""
    import torch

    class_name = cls.__name__
    try:
        with quiet_transformers(), _module_budget(MAX_MODULES), torch.device("meta"), _default_dtype(dtype), \
                _config_dtypes(config, dtype):
            return cls(config)
    except (ModelClassError, RemoteCodeError):
        raise
    except _TooManyModules:
        raise ConfigError(f"{class_name} from this config has more than {MAX_MODULES:,} modules; paramscope builds "
                          "no larger model (check the layer and expert counts)") from None
    except Exception as err:  # broad on purpose: the class's own __init__ rejects a config however it likes
        raise ConfigError(f"could not build {class_name} from this config: {first_line(err)}"
                          f"{_unset_field(config, err)}") from err


@contextlib.contextmanager
def _default_dtype(dtype: str | None):
    import torch

    if dtype is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _config_dtypes(config, dtype: str | None):
    """Every (sub-)config's dtype set to `dtype` for the build, restored after. transformers builds a composite
    model's parts through `_from_config`, each in its own sub-config's dtype, whatever the default dtype: a
    Qwen2.5-VL config declaring bfloat16 would build its language model in bf16 and its vision tower in fp32 when
    fp32 was asked."""
    if dtype is None:
        yield
        return
    import torch

    wanted = getattr(torch, dtype)
    saved: list[tuple[Any, Any]] = []
    pending, seen = [config], set()
    while pending:
        node = pending.pop()
        if id(node) in seen or len(seen) > 64:  # sub-configs nest a few levels at most; the bound is for hostile ones
            continue
        seen.add(id(node))
        if hasattr(node, "dtype"):
            saved.append((node, node.__dict__.get("dtype", _UNSET)))
            node.dtype = wanted
        for key in getattr(node, "sub_configs", {}) or {}:
            child = getattr(node, key, None)
            if child is not None and hasattr(child, "sub_configs"):
                pending.append(child)
    try:
        yield
    finally:
        for node, value in saved:
            if value is _UNSET:
                node.__dict__.pop("dtype", None)
            else:
                node.dtype = value


_UNSET = object()


class _TooManyModules(Exception):
    pass


@contextlib.contextmanager
def _module_budget(limit: int):
    """Count module registrations (torch's global hook) and stop the build past `limit`."""
    from torch.nn.modules.module import register_module_module_registration_hook

    registered = 0

    def count(_module, _name, _submodule):
        nonlocal registered
        registered += 1
        if registered > limit:
            raise _TooManyModules

    handle = register_module_module_registration_hook(count)
    try:
        yield
    finally:
        handle.remove()


def _unset_field(config: Any, err: BaseException) -> str:
    """Where the class indexed a config field left unset (LFM2-MoE's config has no default for `layer_types`, and
    its layers read `config.layer_types[i]`), the words that name it; else nothing."""
    import traceback

    if not isinstance(err, TypeError) or err.__traceback__ is None:
        return ""
    line = traceback.extract_tb(err.__traceback__)[-1].line or ""
    found = re.search(r"\bconfig\.([A-Za-z_][A-Za-z0-9_]*)\s*\[", line)
    if found is None or getattr(config, found.group(1), 0) is not None:
        return ""
    return f" (config field {found.group(1)!r} is unset, and the class reads it entry by entry)"
