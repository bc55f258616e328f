"""A training step's allocations in order: what the derived engine fits, and what MemTracker's peaks are replayed from.

    module (meta) → fake copy (step.working_copy) → forward and backward under a dispatch mode that records every new
    storage (its bytes, shape, element size) and, through a weakref, the moment it is freed → Timeline

Markers split the timeline at the repeated layers: ("fw", i) as layer i's forward starts, ("bw", i) as the gradient of
its output is ready (its backward starts), "end-fw" when the loss is computed, "end-bw" when backward returns. Storages
that end up as a parameter's .grad are flagged, so ZeRO-2 can share them out moment by moment.

Replaying the allocations and frees gives, to the byte, what torch's MemTracker reports for the same step (its peak is
taken after each operator, as here; tests/test_derived_memory.py holds the two equal), once MemTracker's module hooks
hold no gradient (tracker_hooks.py: as torch ships it, a module of two inputs keeps the first one's gradient until
the other's is ready). The optimizer's states and step are not traced: they are the exact analytic figures
(memory/states.py).
"""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ... import progress

ALLOC, FREE, MARK = "a", "f", "m"


@dataclass(frozen=True)
class Allocation:
    nbytes: int
    shape: tuple[int, ...]
    itemsize: int
    gradient: bool = False  # ends the step as a parameter's .grad


@dataclass(frozen=True)
class Timeline:
    """Events in order: (ALLOC, index), (FREE, index) or (MARK, marker); `allocations[index]` says what was made."""

    events: tuple[tuple[str, Any], ...]
    allocations: tuple[Allocation, ...]
    layers: int  # the repeated layers the markers name
    notes: tuple[str, ...] = ()  # what fake tensors could not answer and was assumed (step.assumed_values)

    def peaks(self) -> tuple[int, int, int]:
        """(forward peak, live at the end of the forward, backward peak), in bytes above what the step began with."""
        live = peak = forward_peak = 0
        end_of_forward = None
        for kind, what in self.events:
            if kind == ALLOC:
                live += self.allocations[what].nbytes
                peak = max(peak, live)
            elif kind == FREE:
                live -= self.allocations[what].nbytes
            elif what == ("end-fw",):
                forward_peak, end_of_forward, peak = peak, live, live
        if end_of_forward is None:
            raise ValueError("the timeline has no end of forward")
        return forward_peak, end_of_forward, peak


def live_bytes(events: Any, allocations: Any) -> tuple[int, int]:
    """(bytes live after the events, the largest bytes live at any moment among them): the allocations and frees
    replayed in order, markers skipped."""
    live = peak = 0
    for kind, what in events:
        if kind == ALLOC:
            live += allocations[what].nbytes
            peak = max(peak, live)
        elif kind == FREE:
            live -= allocations[what].nbytes
    return live, peak


def record_training_step(module: Any, settings: Any, layer_path: str, *, fake: bool = True) -> Timeline:
    """Record one training step (forward, loss, backward) of `module` on fake tensors, with `settings` as
    step.StepSettings gives them; `layer_path` names the ModuleList of repeated layers ("model.layers").
    `fake=False` records the module itself on its real tensors (the tests' check against reality)."""
    with progress.status(f"recording a training step of {type(module).__name__} on fake tensors"):
        return _record(module, settings, layer_path, fake)


def _record(module: Any, settings: Any, layer_path: str, fake: bool) -> Timeline:
    import torch
    from torch.autograd.graph import register_multi_grad_hook
    from torch.utils._pytree import tree_leaves

    from .step import autocast_for, check_attention, loss_of, running, training_inputs

    check_attention(settings.attention)
    with _working_model(module, settings, fake) as (model, assumed):
        inputs = training_inputs(model, _rank_settings(settings, fake))
        layers = model.get_submodule(layer_path)
        recorder = allocation_recorder()
        # the weights exist before the step: a view of one that an operator returns is no allocation (the inputs'
        # ids are counted once an operator returns a view of them, as MemTracker counts them)
        for tensor in [*model.parameters(), *model.buffers()]:
            recorder.known(tensor)
        handles = []
        for index, layer in enumerate(layers):
            def before(_module, _args, index=index):
                if not recorder.in_backward:  # a checkpointed layer's recomputation runs its forward again
                    recorder.mark(("fw", index))

            def after(_module, _args, output, index=index):
                if recorder.in_backward:
                    return
                tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
                if tensors:
                    register_multi_grad_hook(tensors, lambda _grads, index=index: recorder.mark(("bw", index)),
                                             mode="any")

            # first among the layer's hooks: a layout's own (FSDP2's all-gather before a layer runs, in forward and in
            # backward) then falls inside the layer's segment, for every layer alike
            handles += [layer.register_forward_pre_hook(before, prepend=True),
                        layer.register_forward_hook(after, prepend=True)]
        try:
            with running(model), recorder, _resizes_to(recorder):
                with autocast_for(settings.precision):
                    loss = loss_of(model(**inputs))
                recorder.mark(("end-fw",))
                recorder.in_backward = True
                loss.backward()
                del loss
                recorder.mark(("end-bw",))
                for param in model.parameters():
                    if param.grad is not None:
                        recorder.flag_gradient(param.grad)
        finally:
            for handle in handles:
                handle.remove()
            recorder.detach()
        return Timeline(_ordered_frees(recorder.events), tuple(recorder.allocations), len(layers),
                        tuple(assumed.notes()))


@contextmanager
def _resizes_to(recorder: Any) -> Iterator[None]:
    """Storage resizes reported to the recorder while it records (FSDP2 frees and refills its gathered units by
    resizing their storage, which no operator returns; torch's MemTracker follows them the same way)."""
    import torch

    original = torch.UntypedStorage.resize_

    def resize_(storage: Any, size: int) -> Any:
        before = storage.nbytes()
        result = original(storage, size)
        recorder.resized(storage, before, storage.nbytes())
        return result

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original


@contextmanager
def _working_model(module: Any, settings: Any, fake: bool) -> Iterator[tuple[Any, Any]]:
    """(the fake copy the step runs, the assumed-values counter): one device's, or one rank's of a multi-GPU layout
    (`settings.layout`: the copy laid out on torch's fake process group by traced/parallel.py)."""
    from .step import assumed_values, fake_mode, training_copy

    layout = getattr(settings, "layout", None)
    if layout is not None and fake:
        from .parallel import Layout, parallel_copy

        with parallel_copy(module, settings, Layout(*layout)) as (model, _notes, assumed):
            yield model, assumed
        return
    with fake_mode(fake) as mode, assumed_values(fake) as assumed:
        yield training_copy(module, mode, settings), assumed


def _rank_settings(settings: Any, fake: bool) -> Any:
    """The settings the step's inputs are made from: a context-parallel rank's S / cp tokens, else as given."""
    layout = getattr(settings, "layout", None)
    if layout is None or not fake:
        return settings
    from .parallel import Layout, rank_tokens

    return rank_tokens(settings, Layout(*layout))


def _ordered_frees(events: list[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    """Frees that follow one another (a graph node's saved tensors, autocast's cache) in allocation order: the
    order the garbage collector happens to run them in changes no moment's bytes."""
    ordered: list[tuple[str, Any]] = []
    run: list[int] = []
    for kind, what in events:
        if kind == FREE:
            run.append(what)
            continue
        ordered += [(FREE, index) for index in sorted(run)]
        run = []
        ordered.append((kind, what))
    ordered += [(FREE, index) for index in sorted(run)]
    return tuple(ordered)


def allocation_recorder() -> Any:
    """A dispatch mode that notes each new storage an operator returns, and (by weakref) when it is freed."""
    import dataclasses

    import torch
    from torch._guards import active_fake_mode
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[str, Any]] = []
            self.allocations: list[Allocation] = []
            # storage → a cell holding its live allocation's index (-1: there before the step; None: its bytes
            # freed by a resize to 0, as FSDP2 frees a gathered unit while keeping the storage object)
            self.index_of = WeakIdKeyDictionary()
            self.finalizers: list[Any] = []
            self.in_backward = False

        def known(self, tensor: Any) -> None:
            for inner in _plain(tensor):
                self.index_of[inner.untyped_storage()] = [-1]

        def mark(self, marker: tuple) -> None:
            self.events.append((MARK, marker))

        def _freed(self, cell: list) -> None:
            if cell[0] is not None and cell[0] >= 0:
                self.events.append((FREE, cell[0]))
            cell[0] = None

        def _allocated(self, storage: Any, nbytes: int, shape: tuple[int, ...], itemsize: int) -> None:
            index = len(self.allocations)
            self.allocations.append(Allocation(nbytes, shape, itemsize))
            self.events.append((ALLOC, index))
            cell = self.index_of.get(storage)
            if cell is None:
                cell = [index]
                self.index_of[storage] = cell
                self.finalizers.append(weakref.finalize(storage, self._freed, cell))
            else:
                cell[0] = index

        def resized(self, storage: Any, before: int, after: int) -> None:
            """A storage's bytes freed (resized to 0) or made anew (resized up from 0): FSDP2's way with its
            gathered parameters and its gradient buffers."""
            cell = self.index_of.get(storage)
            if after == 0 and before > 0 and cell is not None:
                self._freed(cell)
            elif after > 0 and before == 0:
                self._allocated(storage, after, (after,), 1)

        def flag_gradient(self, tensor: Any) -> None:
            for inner in _plain(tensor):
                cell = self.index_of.get(inner.untyped_storage())
                if cell is not None and cell[0] is not None and cell[0] >= 0:
                    index = cell[0]
                    self.allocations[index] = dataclasses.replace(self.allocations[index], gradient=True)

        def detach(self) -> None:
            for finalizer in self.finalizers:
                finalizer.detach()

        def __enter__(self) -> Any:
            self.fake_on_entry = active_fake_mode()
            return super().__enter__()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
            if _dtensor_among(types):
                # DTensor runs first and desugars the operator into its local ones, which come back here: a
                # redistribute's copy made and freed inside the operator (the tied embedding's Replicate gradient's
                # local chunk copied out to meet the head's Shard(0) one) is then seen, as MemTracker sees it
                return NotImplemented
            if func is torch.ops._c10d_functional.wait_tensor.default and (active_fake_mode() is not None or
                                                                           is_fake(args[0])):
                # eager wait_tensor returns the tensor it waited on; the fake (meta) kernel returns a new one, which
                # would count a collective's output twice (tensor parallel's all-reduce under sequence parallel:
                # B·S·h·4 B). MemTracker overrides it the same way.
                return args[0]
            result = func(*args, **(kwargs or {}))
            if active_fake_mode() is not self.fake_on_entry:
                # DTensor's sharding propagation, run under a fake mode of its own: no rank's memory (MemTracker's
                # rule)
                return result
            for tensor in (inner for leaf in tree_leaves(result) for inner in _plain(leaf)):
                storage = tensor.untyped_storage()
                if storage in self.index_of:
                    continue
                self._allocated(storage, storage.nbytes(), tuple(tensor.shape), tensor.dtype.itemsize)
            return result

    def _dtensor_among(types: Any) -> bool:
        # no DTensor exists unless its module was imported (a layout's copy imports it): one device's step pays
        # no import
        dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        return dtensor is not None and any(t is dtensor for t in types)

    def _plain(tensor: Any) -> list:
        """The plain tensors holding `tensor`'s bytes: itself, or a wrapper subclass's inner tensors (a DTensor's
        local shard, a sharded gradient), as MemTracker unwraps them."""
        if not isinstance(tensor, torch.Tensor):
            return []
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            return [t for name in names for t in _plain(getattr(tensor, name))]
        return [tensor]

    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return Recorder()
