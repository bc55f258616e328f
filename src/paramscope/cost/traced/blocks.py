"""Where a model's blocks are, as the parallel engines read them (parallel.py, tensor_parallel.py): its lists of
layers (FSDP2's units, sequence parallel's first layer) and its packed experts modules (expert parallel)."""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedError


def layer_lists(model: Any) -> tuple[list[tuple[str, Any]], str]:
    """The ModuleLists of the model's layers and how they were found: those whose blocks are all of a class in
    transformers' `_no_split_modules`, else the longest ModuleList of blocks of one class."""
    import torch

    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    keep = set(getattr(model, "_no_split_modules", None) or ())
    found = [(name, m) for name, m in lists if all(type(block).__name__ in keep for block in m)]
    if found:
        return found, f"{type(model).__name__}._no_split_modules"
    uniform = [(name, m) for name, m in lists if len({type(block) for block in m}) == 1]
    if not uniform:
        raise UnsupportedError(f"{type(model).__name__} has no list of layers to shard (no ModuleList of blocks of "
                               "one class)")
    longest = max(uniform, key=lambda item: len(item[1]))
    return [longest], "the longest ModuleList of blocks of one class"


def packed_experts_modules(model: Any) -> list[str]:
    """The names of the model's packed experts modules (X.experts with gate_up_proj or down_proj)."""
    return [name for name, module in model.named_modules()
            if name.rpartition(".")[2] == "experts" and {n for n, _ in module.named_parameters(recurse=False)} &
            {"gate_up_proj", "down_proj"}]
