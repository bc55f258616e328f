"""One pipeline stage's step, traced: the real class cut to the stage's layers and run as torch.distributed.pipelining's
PipelineStage runs a stage, on fake tensors, measured by torch's MemTracker (the check of parallel/stage_recipe.py).

    module (meta) → fake copy (step.training_copy) → its layer stack cut to the stage's layers [a, b) →
    k microbatch forwards, each kept (its input and output held for its backward, as PipelineStage's fwd_cache
    holds them) → the first microbatch's backward (its output's gradient received: a fresh B×S×h tensor; its input's
    gradient made, to be sent) → StageTrace

The stages, as the class runs them:
    first   the model's own forward (embeddings, position tables, masks) stopped as its last layer returns
    middle  each layer called on the received hidden state, with the arguments the model's forward gives the layers
            (rotary tables, mask, a fresh training cache each microbatch): the position tables are made once, before
            the step, as a later stage takes them with its input (torchtitan's stages hold them as buffers)
    last    as a middle stage, then the class's own forward from its base model's output: the base model's modules
            after its layer stack (a decoder's final norm, an encoder's pooler) on the layers' output, then the
            class's head and loss as its forward runs them (a tied head, the embedding's own weight here, makes its
            gradient on this stage: the last stage's copy under Megatron's rule)
Each microbatch's forward runs under its own autocast (as one device's step does), its backward outside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedError

FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm")


@dataclass(frozen=True)
class StageTrace:
    """A stage's step above what it began with (its weights and buffers): MemTracker's figures, in bytes."""

    first: int  # first layer held
    stop: int  # one past the last
    in_flight: int
    held: int  # live after the k forwards: what the stage keeps for its microbatches' backward
    forward_peak: int  # the largest moment of the k forwards
    peak: int  # the largest moment of the step (the forwards and the first microbatch's backward)
    gradients: int  # the parameters' gradients after the backward
    later_peak: int = 0  # with `later`: the largest moment of one more forward and the next backward (gradients held)
    after_backward: int = 0  # live after the first backward (the gradients, the microbatches still held)


class _Stop(Exception):
    def __init__(self, payload: Any) -> None:
        super().__init__("stage boundary")
        self.payload = payload


def trace_stage(module: Any, settings: Any, layer_path: str, start: int, stop: int, in_flight: int,
                later: int = 0, parallel: Any = None) -> StageTrace:
    """Trace the stage holding layers [start, stop) of `module`'s stack at `layer_path` with `in_flight`
    microbatches of `settings.batch` × `settings.seq` (step.StepSettings) kept before its first backward; `later`
    (> 0): then the next backward, with the gradients the first made, `later` microbatches held: one more
    microbatch's forward first where that is `in_flight` (1F1B's steady state), none where one fewer (the drain).
    `parallel` (traced/parallel.Layout): the copy sharded so on torch's fake process group first (tensor parallel:
    the stage's received hidden state and output gradient the rank's, the sequence shard under sequence parallel;
    context parallel: the rank's S / cp tokens, torch's ring attention over the cp ranks, `settings.seq` the whole
    sequence)."""
    import torch
    from torch.utils._pytree import tree_leaves

    from .step import by_category, make_tracker, restart_peak, running
    from .tracker_hooks import gradients_not_held

    with stage_working_copy(module, settings, parallel) as model:
        layers = model.get_submodule(layer_path)
        count = len(layers)
        first, last = start == 0, stop == count
        inputs, hidden, dtype, autocast = rank_stage_inputs(model, settings, parallel)
        with running(model):
            layer_args = None if first else layer_arguments(model, layers, inputs, autocast)
            parent_path, _, name = layer_path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            held_layers = list(layers)[start:stop]
            setattr(parent, name, torch.nn.ModuleList(held_layers))
            tail = base_tail(model, parent) if last else None

            def forward(received: Any) -> Any:
                with autocast:
                    if first:
                        return first_stage_forward(model, held_layers[-1], inputs)
                    # a fresh training cache a microbatch, as the model's forward builds one
                    args = [fresh_cache(value, model.config) for value in layer_args[0]]
                    kwargs = {key: fresh_cache(value, model.config) for key, value in layer_args[1].items()}
                    state = received
                    for layer in held_layers:
                        state = hidden_of(layer(state, *args, **kwargs))
                    if not last:
                        return state
                    # the training cache lives until the loss is taken, as the model's output holds it
                    return head_and_loss(model, tail, state, inputs)

            # the layers' arguments made before the step (position tables): in the resident baseline, not counted
            # as made when a layer first reads them
            made = [t for t in tree_leaves(layer_args) if isinstance(t, torch.Tensor)] if layer_args else []
            tracker = make_tracker(model, *made)
            with gradients_not_held(), young_objects_collected(), tracker:
                start_bytes = categories_total(by_category(tracker.get_tracker_snapshot("current")))
                cache: list[tuple[Any, Any]] = []
                for _ in range(in_flight):
                    tracker.reset_mod_stats()  # per-module statistics, one call each: the peak runs on
                    received = None if first else torch.empty(hidden, dtype=dtype, requires_grad=True)
                    cache.append((received, forward(received)))
                    del received
                held = categories_total(by_category(tracker.get_tracker_snapshot("current"))) - start_bytes
                forward_peak = categories_total(by_category(tracker.get_tracker_snapshot("peak"))) - start_bytes
                def backward() -> None:
                    received, output = cache.pop(0)
                    if last:
                        output.backward()
                        losses.append(output)  # the schedule keeps each microbatch's loss to the step's end
                    else:
                        gradient = torch.empty(hidden, dtype=output.dtype)  # the output's gradient, received
                        torch.autograd.backward(output, grad_tensors=gradient)
                        del gradient
                    storage = received_storage(received)
                    if received is not None:  # its gradient sent: the stage keeps neither
                        received.grad = None
                    del received, output
                    settle_backward(tracker, storage)

                losses: list[Any] = []

                backward()
                peak = categories_total(by_category(tracker.get_tracker_snapshot("peak"))) - start_bytes
                after_backward = categories_total(by_category(tracker.get_tracker_snapshot("current"))) - start_bytes
                later_peak = 0
                if later:
                    restart_peak(tracker)
                    if later == in_flight:
                        tracker.reset_mod_stats()  # before a module's next call, not before a pending backward
                        received = None if first else torch.empty(hidden, dtype=dtype, requires_grad=True)
                        cache.append((received, forward(received)))
                        del received
                    backward()
                    later_peak = categories_total(by_category(tracker.get_tracker_snapshot("peak"))) - start_bytes
            gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    return StageTrace(start, stop, in_flight, held, forward_peak, peak, gradients, later_peak, after_backward)


def received_storage(received: Any) -> Any:
    """A weak reference to the received hidden state's storage (None on the first stage), for settle_backward."""
    import weakref

    return None if received is None else weakref.ref(received.untyped_storage())


def settle_backward(tracker: Any, received: Any) -> None:
    """After a microbatch's backward on a stage, free in MemTracker's books what a step without the tracker has
    freed by then. ModTracker hooks each module's inputs with torch's register_multi_grad_hook, whose hook closes
    over the inputs' grad_fn nodes: each backward's graph is left in a reference cycle (the node holds the hook,
    the hook the node), collected here, which would keep the nodes' attributes (transformers' grouped-mm fallback
    keeps its offsets on its node: 4 B an expert, each MoE layer) until Python's collector ran. The received hidden
    state, a leaf, is held by its AccumulateGrad node, which those hooks keep beyond the collector's reach: its
    storage (`received`: received_storage's weak reference) is booked freed, as PipelineStage frees it once the
    backward ends (it pops the microbatch's fwd_cache entry), unless a graph the step keeps (a kept loss's) holds it.
    Without this, each backward of an interleaved rank's chunks read one more B·S·h leaf (and 16 B an MoE layer)
    above the replay."""
    import gc

    gc.collect()
    storage = received() if received is not None else None
    if storage is None:
        return
    entry = tracker._WINFO.get(storage)
    if entry is not None:
        info, _ = entry
        tracker._delete_callback(info, None)  # its bytes leave the tracker's current snapshot
        del tracker._WINFO[storage]  # and its weak reference, whose callback would take them out again


@contextmanager
def young_objects_collected() -> Iterator[None]:
    """While open, Python's collector passes over every object made before (gc.freeze): settle_backward's
    collection after each backward then scans what the step made since, not the whole process (about 0.4 s a call
    otherwise, transformers and torch loaded)."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def rank_stage_inputs(model: Any, settings: Any, parallel: Any) -> tuple[dict[str, Any], tuple[int, ...], Any, Any]:
    """(the rank's inputs, the received hidden state's shape and dtype, the autocast context) a stage's trace starts
    from (trace_stage's and interleaved_stage's): under context parallel the rank's S / cp tokens (the ring, set up
    for the whole sequence, runs on them); under sequence parallel the hidden state's sequence cut over tp; the
    hidden state 16-bit under bf16-pure, else the embedding's dtype."""
    import torch

    from .parallel import rank_tokens
    from .step import autocast_for, training_inputs

    run = rank_tokens(settings, parallel) if parallel is not None else settings
    inputs = training_inputs(model, run)
    embedding = model.get_input_embeddings().weight
    shard = parallel.tp if parallel is not None and parallel.sp else 1
    hidden = (settings.batch, run.seq // shard, embedding.shape[1])
    dtype = embedding.dtype if settings.precision != "bf16-pure" else torch.bfloat16
    return inputs, hidden, dtype, autocast_for(settings.precision)


@contextmanager
def stage_working_copy(module: Any, settings: Any, parallel: Any) -> Iterator[Any]:
    """The fake working copy: one device's, or under `parallel` one rank's on torch's fake process group."""
    from .step import assumed_values, fake_mode, training_copy

    if parallel is None:
        with fake_mode(True) as mode, assumed_values(True):
            yield training_copy(module, mode, settings)
        return
    from .parallel import parallel_copy

    with parallel_copy(module, settings, parallel) as (model, _, _):
        yield model


def categories_total(categories: dict[str, int]) -> int:
    return sum(categories.values())


def fresh_cache(value: Any, config: Any) -> Any:
    return type(value)(config=config) if type(value).__name__.endswith("Cache") else value


def hidden_of(output: Any) -> Any:
    return output[0] if isinstance(output, (tuple, list)) else output


def layer_arguments(model: Any, layers: Any, inputs: dict[str, Any], autocast: Any) -> tuple[tuple, dict]:
    """The arguments the model's forward gives its layers (all but the hidden state), made once, without gradients."""
    import torch

    def stop(_module: Any, args: tuple, kwargs: dict) -> None:
        raise _Stop((args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"}))

    with torch.no_grad(), autocast:
        return _run_to_stop(model, layers[0].register_forward_pre_hook(stop, with_kwargs=True), inputs,
                            "its first layer")


def first_stage_forward(model: Any, last_layer: Any, inputs: dict[str, Any]) -> Any:
    """The model's forward up to its stage's last layer's output (the rest of the forward is never run)."""

    def stop(_module: Any, _args: Any, output: Any) -> None:
        raise _Stop(hidden_of(output))

    return _run_to_stop(model, last_layer.register_forward_hook(stop), inputs, "the stage's last layer")


def _run_to_stop(model: Any, handle: Any, inputs: dict[str, Any], where: str) -> Any:
    """Run the model's forward until the hook behind `handle` stops it with what it found (then removed)."""
    try:
        model(**inputs)
    except _Stop as found:
        return found.payload
    finally:
        handle.remove()
    raise UnsupportedError(f"{type(model).__name__}'s forward never reached {where}")


def base_tail(model: Any, stack_parent: Any) -> tuple[Any, Any]:
    """(the final norm, the pooler): the base model's modules that run on its layer stack's output, either absent
    (None). A final norm sits beside the stack or on the base model under one of FINAL_NORMS; a pooler is the base
    model's `pooler` (what a ...WithPooling output's pooler_output comes from)."""
    base = model.base_model
    norm = next((getattr(holder, name) for holder in (stack_parent, base) for name in FINAL_NORMS
                 if getattr(holder, name, None) is not None), None)
    return norm, getattr(base, "pooler", None)


def head_and_loss(model: Any, tail: tuple[Any, Any], state: Any, inputs: dict[str, Any]) -> Any:
    """The loss of the class's own forward (its head, its loss) with its base model standing in: the base model's
    forward returns `state`, the stage's last layer's output, through the base model's tail (base_tail)."""
    from .step import loss_of

    norm, pooler = tail
    last_hidden = norm(state) if norm is not None else state
    output = _BaseOutput(last_hidden, pooler(last_hidden) if pooler is not None else None)
    base = model.base_model
    if base is model:  # a bare model: its output is the stage's
        return loss_of(output)
    base.forward = lambda *args, **kwargs: output  # the instance's forward: nn.Module calls it, hooks kept
    try:
        return loss_of(model(**inputs))
    finally:
        del base.forward


class _BaseOutput(tuple):
    """The base model's output on the last stage, as a ModelOutput reads: its set fields by index (the last hidden
    state, the pooled output where there is a pooler), every field by name, those this stage does not make None
    (the layers' caches, hidden states and attentions: a training step keeps none of them)."""

    def __new__(cls, last_hidden_state: Any, pooler_output: Any) -> _BaseOutput:
        return super().__new__(cls, (last_hidden_state,) + ((pooler_output,) if pooler_output is not None else ()))

    @property
    def last_hidden_state(self) -> Any:
        return self[0]

    @property
    def pooler_output(self) -> Any:
        return self[1] if len(self) > 1 else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


@dataclass(frozen=True)
class UnsyncedTrace:
    """FSDP2's rank run as one pipeline stage runs it (trace_unsynced_fsdp): MemTracker's figures, in bytes, each
    the whole rank's (its resident shards and optimizer states included)."""

    resident: int  # before the step: the fp32 shards and the optimizer's states
    forward_first: int  # the first microbatch's forward (each unit gathered as it first runs, and kept)
    backward_first: int  # its backward, the gradients accumulated unsharded
    forward_later: int  # the next microbatch's forward, every unit gathered and every gradient unsharded held
    backward_later: int  # its backward
    reduce: int  # the reduce after the last backward: each unit resharded, then its gradients reduce-scattered
    optimizer_step: int


def trace_unsynced_fsdp(module: Any, settings: Any, dp: int, mixed: str, in_flight: int = 1, tp: int = 1,
                        sp: bool = False) -> UnsyncedTrace:
    """Trace rank 0 of FSDP2 over `dp` ranks (traced/parallel.py's fully_shard on each layer and the root, `mixed`
    "policy" or "autocast", on torch's fake process group) as a pipeline stage runs it: every unit kept gathered
    after its forward (torchtitan under a pipeline: reshard_after_forward False); each microbatch's backward with
    set_is_last_backward(False), set_reshard_after_backward(False), set_requires_gradient_sync(False), as torch's
    PipelineStage.backward_maybe_with_nosync sets them; after the last, PipelineStage.perform_reduce_grad's reduce
    (the three set True, each state's parameter groups' post_backward, the root's final callback). The whole model as
    one stage, after a warm-up step: two microbatches, each forward then backward (1F1B with one in flight); with
    `in_flight` k > 1, k forwards then k backwards (GPipe's order, k in flight): forward_first the first forward,
    forward_later the largest of the others (each with those before it held), backward_first the first backward
    (the others still held), backward_later the largest of the others. `tp`, `sp`: the FSDP2 rank beside tensor
    parallel (the same fake process group's tp layout, as the policy's tp rank is derived)."""
    import contextlib

    import torch
    from torch.distributed.fsdp import fully_shard

    from .parallel import check_layout, parallel_copy
    from .step import (autocast_for, loss_of, make_optimizer, make_tracker, phase_peak, restart_peak, running,
                       training_inputs)
    from .tracker_hooks import gradients_not_held

    layout = check_layout(dp, "fsdp", tp, sp, 0, mixed=mixed)
    with parallel_copy(module, settings, layout) as (model, _, _):
        model.set_reshard_after_forward(False)
        inputs = training_inputs(model, settings)
        optimizer, _ = make_optimizer(model, settings.optimizer, settings.precision)
        # the policy's copy runs without autocast (apply_fsdp's policy_without_autocast)
        autocast = autocast_for(settings.precision) if mixed == "autocast" else contextlib.nullcontext()

        def forward() -> Any:
            with autocast:
                return loss_of(model(**inputs))

        def backward(loss: Any) -> None:  # PipelineStage.backward_maybe_with_nosync under FSDP2
            model.set_is_last_backward(False)
            model.set_reshard_after_backward(False)
            model.set_requires_gradient_sync(False)
            torch.autograd.backward(loss)

        def reduce() -> None:  # PipelineStage.perform_reduce_grad under FSDP2
            model.set_is_last_backward(True)
            model.set_reshard_after_backward(True)
            model.set_requires_gradient_sync(True)
            state = fully_shard.state(model)
            for each in state._state_ctx.all_states:
                for group in each._fsdp_param_groups:
                    group.post_backward()
            state._root_post_backward_final_callback()

        def step(tracker: Any = None) -> list[int]:
            peaks: list[int] = []

            def mark(phase: str) -> None:
                if tracker is not None:
                    peaks.append(phase_peak(tracker, phase).bytes)
                    restart_peak(tracker)
            if in_flight == 1:
                for later in (False, True):
                    if tracker is not None and later:
                        tracker.reset_mod_stats()  # the tracker's per-module stats allow one call per module
                    loss = forward()
                    mark("forward")
                    backward(loss)
                    del loss
                    mark("backward")
            else:
                losses = []
                for _ in range(in_flight):
                    if tracker is not None:
                        tracker.reset_mod_stats()
                    losses.append(forward())
                    mark("forward")
                for _ in range(in_flight):
                    backward(losses.pop(0))
                    mark("backward")
                if tracker is not None:  # in UnsyncedTrace's order: the first of each, then the largest of the others
                    forwards, backwards = peaks[:in_flight], peaks[in_flight:]
                    peaks[:] = [forwards[0], backwards[0], max(forwards[1:]), max(backwards[1:])]
            reduce()
            mark("backward")
            optimizer.step()
            mark("optimizer step")
            optimizer.zero_grad(set_to_none=True)
            return peaks

        with running(model):
            step()  # warm-up: the optimizer's states allocated, as in every step after the first
            tracker = make_tracker(model, optimizer)
            with gradients_not_held(), tracker:
                resident = sum(s.get("Total", 0) for s in tracker.get_tracker_snapshot("current").values())
                restart_peak(tracker)
                peaks = step(tracker)
    return UnsyncedTrace(resident, *peaks)
