"""One rank's step under the interleaved schedule, traced: the real class cut to the rank's chunks (v runs of layers,
chunk c of the model's pp × v on rank c mod pp) and run action by action in torch's ScheduleInterleaved1F1B order
(parallel/pipeline.interleaved_order), on fake tensors, measured by torch's MemTracker: the check of
parallel/stage_recipe.interleaved_activations.

Each chunk runs as pipeline_stage.py runs a stage (its received hidden state a leaf held with the microbatch, its
output's gradient a fresh tensor, the model's own forward on the first chunk of the model, its head and loss on the
last); each forward keeps its input and output until that microbatch's backward of the same chunk, as each of the
rank's PipelineStage objects keeps its own fwd_cache."""

from __future__ import annotations

from typing import Any

from .pipeline_stage import (StageTrace, base_tail, first_stage_forward, fresh_cache, head_and_loss, hidden_of,
                             layer_arguments, categories_total, rank_stage_inputs, received_storage, settle_backward,
                             stage_working_copy, young_objects_collected)


def trace_interleaved_stage(module: Any, settings: Any, layer_path: str, chunks: tuple[tuple[int, int], ...],
                            order: tuple[tuple[str, int], ...], parallel: Any = None) -> StageTrace:
    """Trace the rank holding the layer runs `chunks` ([a, b) each, in order) of `module`'s stack at `layer_path`,
    running `order` (("F" or "B", chunk)) on microbatches of `settings.batch` × `settings.seq`. The StageTrace's
    moments: `held` and `forward_peak` before the first backward, `peak` through it, `after_backward` after it,
    `later_peak` over every action after it; `in_flight` the most chunk-microbatches held at once."""
    import torch
    from torch.utils._pytree import tree_leaves

    from .step import by_category, make_tracker, restart_peak, running
    from .tracker_hooks import gradients_not_held

    with stage_working_copy(module, settings, parallel) as model:
        layers = model.get_submodule(layer_path)
        count = len(layers)
        inputs, hidden, dtype, autocast = rank_stage_inputs(model, settings, parallel)
        with running(model):
            layer_args = layer_arguments(model, layers, inputs, autocast)
            parent_path, _, name = layer_path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            held = [list(layers)[a:b] for a, b in chunks]
            # the stack holds the rank's layers only (the model's forward runs the first chunk's, stopped as its
            # last returns); the rest of the model's parameters stay, as a stage's do
            setattr(parent, name, torch.nn.ModuleList([layer for run in held for layer in run]))
            tail = base_tail(model, parent) if chunks[-1][1] == count else None

            def forward(chunk: int, received: Any) -> Any:
                a, b = chunks[chunk]
                with autocast:
                    if a == 0:
                        return first_stage_forward(model, held[chunk][-1], inputs)
                    args = [fresh_cache(value, model.config) for value in layer_args[0]]
                    kwargs = {key: fresh_cache(value, model.config) for key, value in layer_args[1].items()}
                    state = received
                    for layer in held[chunk]:
                        state = hidden_of(layer(state, *args, **kwargs))
                    if b < count:
                        return state
                    return head_and_loss(model, tail, state, inputs)

            made = [t for t in tree_leaves(layer_args) if isinstance(t, torch.Tensor)]
            tracker = make_tracker(model, *made)
            with gradients_not_held(), young_objects_collected(), tracker:
                start_bytes = categories_total(by_category(tracker.get_tracker_snapshot("current")))

                def now(kind: str) -> int:
                    return categories_total(by_category(tracker.get_tracker_snapshot(kind))) - start_bytes

                caches: list[list[tuple[Any, Any]]] = [[] for _ in chunks]
                losses: list[Any] = []
                live = most = 0
                held_bytes = forward_peak = peak = after_backward = 0
                backwards = 0
                for kind, chunk in order:
                    if kind == "F":
                        # MemTracker refuses a top-level module's second forward unless its per-module statistics
                        # are reset; a pending backward of another chunk's modules reads theirs: kept
                        kept = list(tracker.memory_tracking.items())
                        tracker.reset_mod_stats()
                        received = None if chunks[chunk][0] == 0 else \
                            torch.empty(hidden, dtype=dtype, requires_grad=True)
                        caches[chunk].append((received, forward(chunk, received)))
                        del received
                        for key, stats in kept:
                            if key not in tracker.memory_tracking:
                                tracker.memory_tracking[key] = stats
                        tracker._listed_from = -1  # ListedMemTracker: its list of the statistics made afresh
                        del kept
                        live += 1
                        most = max(most, live)
                        continue
                    if backwards == 0:
                        held_bytes, forward_peak = now("current"), now("peak")
                    received, output = caches[chunk].pop(0)
                    if chunks[chunk][1] == count:
                        output.backward()
                        losses.append(output)  # the schedule keeps each microbatch's loss to the step's end
                    else:
                        gradient = torch.empty(hidden, dtype=output.dtype)  # the output's gradient, received
                        torch.autograd.backward(output, grad_tensors=gradient)
                        del gradient
                    storage = received_storage(received)
                    if received is not None:
                        received.grad = None
                    del received, output
                    settle_backward(tracker, storage)
                    live -= 1
                    backwards += 1
                    if backwards == 1:
                        peak, after_backward = now("peak"), now("current")
                        restart_peak(tracker)
                later_peak = now("peak") if backwards > 1 else 0
            gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    return StageTrace(chunks[0][0], chunks[-1][1], most, held_bytes, forward_peak, peak, gradients, later_peak,
                      after_backward)
