"""The traced run: a fake copy of the model runs a family's input under FlopCounterMode (forward, and the backward of
the output's sum when training); each part's FLOPs by its module path, the rows the projector produced, and, where
asked, what the forward saves for backward (a second forward, without the counter) and the serving forward's peak
live bytes (traced/timeline.py's recorder)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedError
from .media import TowerLine


@dataclass(frozen=True)
class TraceStep:
    """How a family's trace runs: the FLOPs of a forward, or of a training step (its backward too); with a training
    `precision`, also what the towers save for backward, measured with the step's `attention` (None: the model's)."""

    training: bool
    precision: str | None = None
    attention: str | None = None
    frozen: frozenset[str] = frozenset()  # parameter names that do not train
    serving_dtype: str | None = None  # a forward's: also measure its peak live bytes with the weights in this dtype


@dataclass(frozen=True)
class Traced:
    """What `trace_parts` read off a trace: each part's line, the rows the projector produced, every module's own
    forward FLOPs by path (when asked), and the bytes the forward saves for backward (TraceStep.precision)."""

    lines: tuple[TowerLine, ...]
    rows: int
    own: dict[str, int] | None
    saved: int | None
    peak: int | None = None  # TraceStep.serving_dtype: the forward's largest live bytes, weights not
    backward_total: int | None = None  # training: the whole trace's backward (every module, and outside any)


def trace_parts(module: Any, run: Any, parts: list[tuple[str, str]], step: TraceStep, constants: bool = False,
                  with_own: bool = False) -> Traced:
    """Run `run` on a fake copy of `module` under FlopCounterMode (forward, and the backward of the output's sum when
    training); each part's FLOPs by its module path (a part nested in an earlier one is taken out of it), the rows
    of the output (the tokens get_image_features produced), every module's own forward FLOPs by path (`with_own`),
    and, with the step's precision, what the forward saves for backward (a second forward, without the counter)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import gc
    import weakref

    from ..traced.flops import missing_formulas
    from ..traced.step import assumed_values, autocast_for, fake_mode, running, working_copy

    training, precision = step.training, step.precision
    packed: list[tuple[Any, int, int]] = []  # (a weak reference to a saved tensor, its storage, the storage's bytes)
    with fake_mode(True) as mode, assumed_values(True), KeptConstants(constants):
        # eager attention: its score matmuls count as sdpa's do, and its backward is the model's (2 × the forward),
        # with no fused kernel's recomputed scores in it
        model = working_copy(module, mode, "eager", weights_dtype="bfloat16" if precision == "bf16-pure" else None)
        model.train(training)
        _freeze(model, step.frozen)
        weights = {_storage(p) for p in itertools.chain(model.parameters(), model.buffers())}

        def pack(tensor: Any) -> Any:
            key = _storage(tensor)
            if key not in weights:
                packed.append((weakref.ref(tensor), key, tensor.untyped_storage().nbytes()))
            return tensor

        def constant(value: Any) -> Any:  # a small integer layout the tower reads values of: kept real in the fake
            if not isinstance(value, torch.Tensor):
                return value
            return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)

        with running(model):
            # one counter for both passes: FlopCounterMode attributes the backward to modules through hooks it sets
            # in the forward it saw
            counter = FlopCounterMode(display=False, depth=None, custom_mapping=missing_formulas())
            with counter:
                with torch.set_grad_enabled(training), autocast_for(precision or "fp32"):
                    out = run(model, constant) if constants else run(model)
                    loss = _sum(out) if training else None
                forward = _by_path(counter.get_flop_counts(), module, model)
                own = _own_by_path(forward) if with_own else None
                rows = _rows(out)
                del out
                backward = None
                if training and loss.requires_grad:  # (a frozen tower and projector: no backward at all)
                    loss.backward()
                    both = _by_path(counter.get_flop_counts(), module, model)
                    backward = {path: total - forward.get(path, 0) for path, total in both.items()}
            del loss
            saved = None
            if training and precision is not None:
                # again without the counter, whose module hooks hold every output: what the backward still needs
                # once the forward is done, the tower's other outputs (every hidden state, a layer whose output
                # nothing reads) dropped as the model drops them
                # with the step's attention (the FLOPs' eager attention keeps scores that sdpa does not)
                model = working_copy(module, mode, step.attention,
                                     weights_dtype="bfloat16" if precision == "bf16-pure" else None)
                model.train(True)
                _freeze(model, step.frozen)
                weights = {_storage(p) for p in itertools.chain(model.parameters(), model.buffers())}
                with torch.set_grad_enabled(True), autocast_for(precision), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                    out = run(model, constant) if constants else run(model)
                    graph = [_sum(out)]  # the loss, whose graph holds what the backward needs while the rest goes
                del out
                gc.collect()
                saved = sum({key: size for ref, key, size in packed if ref() is not None}.values())
                graph.clear()
        peak = None
        if step.serving_dtype is not None:
            peak = _forward_peak(module, mode, step.serving_dtype,
                                 (lambda model: run(model, constant)) if constants else run)
    lines = []
    taken: set[str] = set()
    for part, path in reversed(parts):  # nested parts first (Qwen's merger inside its visual)
        lines.append(TowerLine(part, path, _class_at(module, path), _within(forward, path, taken),
                               None if backward is None else _within(backward, path, taken)))
        taken.add(path)
    lines.reverse()
    return Traced(tuple(lines), rows, own, saved, peak, None if backward is None else backward.get("", 0))


def _forward_peak(module: Any, mode: Any, dtype: str, run: Any) -> int:
    """The largest bytes live at once while `run` runs a fake copy of `module` with its floating weights in `dtype`
    (no grad, the model's own attention): every storage an operator returns, from when it is made to when it is
    freed, the weights not, after each operator as torch's MemTracker takes its peak (traced/timeline.py's
    recorder, which tests/test_derived_memory.py holds equal to MemTracker's)."""
    import torch

    from ..traced.step import running, working_copy
    from ..traced.timeline import allocation_recorder, live_bytes

    model = working_copy(module, mode, None, weights_dtype=dtype)
    model.eval()
    recorder = allocation_recorder()
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        recorder.known(tensor)
    try:
        with running(model), recorder, torch.no_grad():
            out = run(model)
            del out
    finally:
        recorder.detach()
    return live_bytes(recorder.events, recorder.allocations)[1]


def _freeze(model: Any, frozen: frozenset[str]) -> None:
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)


def _storage(tensor: Any) -> int:
    """The identity of a tensor's storage (views and a parameter's uses share it)."""
    return tensor.untyped_storage()._cdata


def _within(counts: dict[str, int], path: str, taken: set[str]) -> int:
    """FLOPs of the module at `path` and below, less those of the already-taken parts inside it."""
    inside = [p for p in taken if p.startswith(path + ".")]
    return counts.get(path, 0) - sum(counts.get(p, 0) for p in inside)


def _by_path(counts: dict[str, dict[Any, int]], module: Any, model: Any) -> dict[str, int]:
    """FlopCounterMode's totals (a module's FLOPs including its children's) keyed by the module's path in `module`.
    The counter names a module by the first module it saw running and the attribute names below it; a call into a
    method (get_image_features) starts at the tower, named by its class."""
    roots = {}
    for path, sub in model.named_modules():
        roots.setdefault(type(sub).__name__, path)
    result: dict[str, int] = {}
    for name, ops in counts.items():
        if name == "Global":
            result[""] = sum(ops.values())
            continue
        head, _, rest = name.partition(".")
        base = roots.get(head)
        if base is None:
            continue
        if base == "" and head == type(model).__name__:
            if not rest:  # the whole model, run as a whole (Whisper, Llama-3.2-Vision): "" is Global's, which has it
                continue
            path = rest
        else:
            path = ".".join(p for p in (base, rest) if p)
        result[path] = result.get(path, 0) + sum(ops.values())
    return result


def _own_by_path(totals: dict[str, int]) -> dict[str, int]:
    """Each module's own FLOPs: its total less those of the modules counted under it nearest (a layer list the
    counter never entered leaves its layers under the stack)."""
    own: dict[str, int] = {}
    paths = [p for p in totals if p]

    def nearest(path: str) -> str:
        parent = path
        while "." in parent:
            parent = parent.rsplit(".", 1)[0]
            if parent in totals:
                return parent
        return ""

    under: dict[str, int] = {}
    for path in paths:
        parent = nearest(path)
        under[parent] = under.get(parent, 0) + totals[path]
    for path in paths:
        value = totals[path] - under.get(path, 0)
        if value:
            own[path] = value
    rest = totals.get("", 0) - under.get("", 0)
    if rest:
        own["(outside any module)"] = rest
    return own


def _class_at(module: Any, path: str) -> str:
    return type(module.get_submodule(path)).__name__


def module_path(module: Any, sub: Any) -> str:
    for path, candidate in module.named_modules():
        if candidate is sub:
            return path
    raise UnsupportedError("{name}'s tower is not among its modules", name=type(module).__name__)


def _rows(out: Any) -> int:
    """Tokens the projector produced: the rows of get_image_features' pooled output (a tensor of images × tokens ×
    width, or a list of tokens × width per image)."""
    pooled = getattr(out, "pooler_output", out)
    if isinstance(pooled, (list, tuple)):
        return sum(int(t.shape[0]) for t in pooled)
    if pooled is None or not hasattr(pooled, "shape"):
        return 0
    return int(math.prod(pooled.shape[:-1]))


def _sum(out: Any) -> Any:
    """A scalar the backward starts from: the sum of every floating tensor the tower returned."""
    import torch

    pooled = getattr(out, "pooler_output", None)
    tensors = list(pooled) if isinstance(pooled, (list, tuple)) else [pooled]
    if hasattr(out, "logits"):
        tensors = [out.logits]
    return sum(t.float().sum() for t in tensors if isinstance(t, torch.Tensor))


class KeptConstants:
    """While tracing a tower that reads values of its small integer layouts (Qwen2.5-VL's grid, windows and
    position ids), fake tensors keep those values: torch's fake tensors propagate constants up to
    CONSTANT_NUMEL_LIMIT elements (1 by default), raised here for the trace and put back after."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.old = None

    def __enter__(self) -> None:
        if self.on:
            import torch._subclasses.fake_tensor as fake_tensor

            self.old = fake_tensor.CONSTANT_NUMEL_LIMIT
            fake_tensor.CONSTANT_NUMEL_LIMIT = 1 << 24

    def __exit__(self, *exc: Any) -> None:
        if self.on:
            import torch._subclasses.fake_tensor as fake_tensor

            fake_tensor.CONSTANT_NUMEL_LIMIT = self.old
