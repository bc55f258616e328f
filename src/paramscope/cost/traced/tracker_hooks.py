"""MemTracker's module hooks made to hold no gradient, so that the traced step frees what a step without it frees.

MemTracker learns where backward is through ModTracker, which hooks each module's inputs with torch's
register_multi_grad_hook in its "all" mode: the hook fires once every input's gradient is ready, and until then it
keeps the gradients that came first in a buffer. A module of two inputs that both train (ELECTRA's and BERT's
ElectraOutput / BertOutput: the MLP's up output and the residual; their SelfOutput: the attention's context and the
residual) so keeps its first input's gradient (B·S·i or B·S·h) alive until the residual's is summed, where a step
without the tracker frees it as soon as the node that read it has run. That held gradient is the tracker's own
memory, not the step's: ELECTRA's discriminator, whose peak lies inside its last layer's backward, read 2·B·S·h
bytes high in bf16-mixed (786,432 B at 1 × 512), while paramscope's recorder (timeline.py), which hooks no module's
inputs, gave the step's true figure.

Under `gradients_not_held()`, ModTracker's "all" hooks on more than one tensor count the gradients as they come
and, at the last, call the module's hook with None for each (ModTracker passes them on to MemTracker's post-backward
hook, which reads none of them); the order in which hooks fire, and so every snapshot, is unchanged.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class Spared:
    """The modules whose input gradients MemTracker alone would have held: how many, and their class names."""

    def __init__(self) -> None:
        self.modules: list[str] = []

    def note(self) -> str | None:
        if not self.modules:
            return None
        names = ", ".join(sorted(set(self.modules)))
        return (f"MemTracker's module hooks (ModTracker's 'all' multi-grad hook) would keep a module's first input "
                f"gradient until its other inputs' are ready ({len(self.modules)} module calls here: {names}); "
                "a step without the tracker frees it at once, and so does this trace (traced/tracker_hooks.py)")


@contextmanager
def gradients_not_held() -> Iterator[Spared]:
    """While open, ModTracker's multi-tensor "all" hooks registered in a forward keep no gradient (see above)."""
    import torch.distributed._tools.mod_tracker as mod_tracker

    original = mod_tracker.register_multi_grad_hook
    spared = Spared()

    def register(tensors: Any, fn: Callable, mode: str = "all") -> Any:
        if mode != "all" or len(tensors) < 2:
            return original(tensors, fn, mode=mode)
        return _all_without_buffer(tuple(tensors), fn, spared, _module_name(fn))

    mod_tracker.register_multi_grad_hook = register
    try:
        yield spared
    finally:
        mod_tracker.register_multi_grad_hook = original


def _module_name(fn: Callable) -> str:
    """The class of the module ModTracker's pop function is for (it closes over a weak reference to it)."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, weakref.ref):
            module = value()
            if module is not None:
                return type(module).__name__
    return "a module"


def _all_without_buffer(tensors: tuple, fn: Callable, spared: Spared, name: str) -> Any:
    """torch's register_multi_grad_hook(tensors, fn, mode="all") keeping a count per backward, not the gradients."""
    import torch
    from torch.autograd.graph import _get_grad_fn_or_grad_acc, _MultiHandle

    grad_fns = [_get_grad_fn_or_grad_acc(t) for t in tensors]
    count = len(tensors)  # the hook closes over no tensor: that would keep the module's inputs alive
    lock = threading.Lock()
    seen: dict[int, int] = {}
    expected: dict[int, int] = {}

    def hook(_grad: Any) -> None:
        task = torch._C._current_graph_task_id()
        with lock:
            if task not in seen:  # as torch: how many of the tensors this backward reaches, on the first call
                seen[task] = 0
                expected[task] = sum(map(torch._C._will_engine_execute_node, grad_fns))
            seen[task] += 1
            last = seen[task] == expected[task]
            if last:
                calls = expected.pop(task)
                del seen[task]
        if last:
            if calls > 1:
                spared.modules.append(name)
            fn([None] * count)

    return _MultiHandle(tuple(t.register_hook(hook) for t in tensors))
