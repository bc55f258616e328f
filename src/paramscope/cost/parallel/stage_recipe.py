"""A pipeline stage's activations and peak from a derived recipe (derived/recipe.py): the recipe's own segments,
replayed for the stage's layers only, so that any class whose step is derived gets its stages.

A stage holding layers [a, b) with k microbatches in flight runs, per microbatch, a forward of

    first stage    the prefix (embeddings, position tables, masks) and its layers' forward segments
    later stages   the hidden state received from the previous stage (B×S×h in the residual stream's dtype: the
                   point-to-point receive buffer, held with the microbatch for its backward) and its layers' segments
    last stage     … and the last layer's segment, which holds the final norm, the head and the loss

each allocation of those segments counted, each free counted where what it frees was made on the stage: a layer's
own, the layer below's output where that layer is the stage's, the prefix's on the first stage; the frees the
forward's end makes (autocast's weight copies, the training cache) once per layer of the stage. A microbatch's
forward keeps H bytes; the stage holds k·H before its first backward, which replays the stage's backward segments
from the received output gradient (B×S×h, held to the end with the microbatch's input and output) down to the input's
gradient (kept, to be sent). Peak: max((k − 1)·H + the forward's peak, k·H + the backward's peak).

Each microbatch's forward runs under its own autocast (as one device's step does): its 16-bit weight copies are held
with it. tests/test_pipeline_stages.py holds these figures to MemTracker on the real class cut to each stage
(traced/pipeline_stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..derived.recipe import DerivedRecipe, Entry, contexts, multipliers
from ..derived.symbols import evaluate


@dataclass(frozen=True)
class StageActivations:
    """One stage's microbatches, from the recipe, in bytes above the stage's resident states."""

    per_microbatch: int  # what one microbatch's forward keeps for its backward (its received input included)
    in_flight: int
    held: int  # in_flight × per_microbatch
    forward_peak: int  # the largest moment of the forwards: (k − 1)·H + one forward's peak (the last with what is kept once)
    backward_peak: int  # k·H + the first backward's largest moment (its gradients made as it goes)
    gradients_at_backward_peak: int
    received: int  # the hidden state received a microbatch (0 on the first stage)
    output_gradient: int  # the output's gradient received for the backward (0 on the last stage)
    # a later backward (1F1B's steady state): `later_in_flight` microbatches held, every gradient already made, each
    # new one accumulated into its .grad at once (autograd runs AccumulateGrad first), its largest moment above the
    # stage's states and gradients; where a forward comes first (`later_in_flight` = `in_flight`), that forward's
    # peak with the k - 1 others held and every gradient made, if larger
    later_in_flight: int = 0
    later_peak: int = 0
    kept_once: int = 0  # of per_microbatch, what the step never frees (held once a stage, not once a microbatch)
    after: int | None = None  # an interleaved rank's live bytes after its first backward (its chunks differ)
    # an interleaved rank's gradients made by its first backward's end (its chunk's) and by the step's end (every
    # chunk's): later_peak is above the second, and the moments between hold the first and what followed it
    gradients_made: tuple[int, int] | None = None
    # on the last stage: what each microbatch's loss keeps once its backward is done (the loss, a scalar, and what
    # its graph's nodes hold beyond their saved tensors), to the step's end: torch's schedule keeps every
    # microbatch's loss (_internal_losses, handed back through step(losses=...)); at the optimizer step
    # pipeline_replay.kept_losses (torchtitan holds their mean, whose graph reaches each)
    loss_kept: int = 0
    loss_scalar: int = 0  # of loss_kept, the loss itself
    # later_peak's two moments: the later backward's own largest, and the forward before it (1F1B's steady state;
    # 0 where none comes first)
    later_backward: int = 0
    later_forward: int = 0

    @property
    def after_first_backward(self) -> int:
        """Live after the first backward, less the gradients: the microbatches still in flight."""
        if self.after is not None:
            return self.after
        return self.held - self.per_microbatch + self.kept_once + self.loss_kept

    @property
    def peak(self) -> int:
        return max(self.forward_peak, self.backward_peak)

    @property
    def peak_phase(self) -> str:
        return "backward" if self.backward_peak >= self.forward_peak else "forward"


def stage_activations(recipe: DerivedRecipe, batch: int, seq: int, start: int, stop: int, in_flight: int,
                      residual: int, later_in_flight: int = 0, waiting: frozenset[int] = frozenset(),
                      tied: tuple[int, int] | None = None) -> StageActivations:
    """The stage holding layers [start, stop) of the recipe's model, at `batch` × `seq` a microbatch with
    `in_flight` microbatches held; `residual`: the bytes of one hidden state B×S×h (what is sent and received);
    `later_in_flight`: the microbatches held at a later backward (0: none, a single microbatch); `waiting`: the
    bytes of the gradients that reach their .grad only with the next gradient made, not at once (a later backward:
    a module that reads its weights' local shards once, as it is entered, under tensor parallel); `tied`: on a
    first stage whose embedding is tied to a head on another stage, (the bytes of the gradient the embedding's
    backward makes, the bytes of the weight's .grad in the recipe's one-device step): see _Replay.tied_apart."""
    replay = _Replay(recipe, batch, seq, start, stop, tied)
    received = 0 if replay.first else residual
    events = replay.forward()
    forward_live, forward_peak = replay.run(events, received)
    # what the step never frees (an object the model keeps and replaces at its next call): held once, not once a
    # microbatch
    kept_once = sum(size for times, size, never in events if never and times > 0)
    gradient = 0 if replay.last else residual
    backward = replay.backward()
    _, backward_peak, grads = replay.run_backward(backward, gradient)
    each = forward_live - kept_once
    held = in_flight * each + kept_once
    # a later forward finds what the step never frees held already, and does not make it again
    _, again = replay.run([e for e in events if not (e[2] and e[0] > 0)], received)
    if in_flight > 1:
        forward_peak = max(forward_peak, (in_flight - 1) * each + kept_once + again)
    # the first microbatch's loss, kept from its backward on (the last stage)
    loss, scalar = replay.kept_with_loss()
    later = later_backward = later_forward = 0
    if later_in_flight:
        _, accumulated, _ = replay.run_backward(backward, gradient, accumulate=True, waiting=waiting)
        later = later_backward = later_in_flight * each + kept_once + loss + accumulated
        if later_in_flight == in_flight:  # 1F1B's steady state: one more forward first, the k - 1 others held
            later_forward = (in_flight - 1) * each + kept_once + loss + again
            later = max(later, later_forward)
    return StageActivations(forward_live, in_flight, held, forward_peak, held + backward_peak, grads, received,
                            gradient, later_in_flight, later, kept_once, loss_kept=loss, loss_scalar=scalar,
                            later_backward=later_backward, later_forward=later_forward)


class _Replay:
    """The recipe's segments for one stage, each entry's bytes at (batch, seq) and whether it counts there."""

    def __init__(self, recipe: DerivedRecipe, batch: int, seq: int, start: int, stop: int,
                 tied: tuple[int, int] | None = None) -> None:
        self.recipe = recipe
        types = recipe.layer_types
        self.count = len(types)
        self.start, self.stop = start, stop
        self.first, self.last = start == 0, stop == self.count
        self.values = [evaluate(poly, batch, seq // recipe.seq_unit) for poly in recipe.sizes]
        self.context = {i: c for i, c in zip(range(1, self.count - 1), contexts(types))}
        self.model_counts = multipliers(types, recipe.cut_types)
        # each allocation's segment: where it is made (+1); the representative middle layer's for a context
        self.owner: dict[int, Any] = {}
        segments: list[tuple[Any, tuple[Entry, ...]]] = [
            ("prefix", recipe.prefix), ("fw0", recipe.first_forward), ("fwlast", recipe.last_forward),
            ("head", recipe.head_backward), ("bwlast", recipe.last_backward), ("bw0", recipe.first_backward)]
        segments += [(("fw", c), s) for c, s in recipe.middle_forward.items()]
        segments += [(("bw", c), s) for c, s in recipe.middle_backward.items()]
        forward_keys = {"prefix", "fw0", "fwlast"} | {("fw", c) for c in recipe.middle_forward}
        self.last_forward_index = -1
        self.freed = {index for _, entries in segments for sign, index, _ in entries if sign < 0}
        for key, entries in segments:
            for sign, index, _ in entries:
                if sign > 0:
                    self.owner.setdefault(index, key)
                    if key in forward_keys:
                        self.last_forward_index = max(self.last_forward_index, index)
        # middle layers of each context the stage holds: the frees the forward's end makes count once for each
        self.held_counts: dict[str, int] = {}
        for i in range(max(start, 1), min(stop, self.count - 1)):
            self.held_counts[self.context[i]] = self.held_counts.get(self.context[i], 0) + 1
        self.kept_gradient, self.not_made = self.tied_apart(tied) if tied and self.first and not self.last \
            else (None, ())

    # ----------------------------------------------------------------------------------------------- segments
    def forward_key(self, layer: int) -> Any:
        if layer == 0:
            return "fw0"
        if layer == self.count - 1:
            return "fwlast"
        return ("fw", self.context[layer])

    def backward_key(self, layer: int) -> Any:
        if layer == 0:
            return "bw0"
        if layer == self.count - 1:
            return "bwlast"
        return ("bw", self.context[layer])

    def segment(self, key: Any) -> tuple[Entry, ...]:
        recipe = self.recipe
        if isinstance(key, tuple):
            return (recipe.middle_forward if key[0] == "fw" else recipe.middle_backward)[key[1]]
        return {"prefix": recipe.prefix, "fw0": recipe.first_forward, "fwlast": recipe.last_forward,
                "head": recipe.head_backward, "bwlast": recipe.last_backward, "bw0": recipe.first_backward}[key]

    def holds(self, layer: int) -> bool:
        return self.start <= layer < self.stop

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self) -> list[tuple[int, int, bool]]:
        """(sign × times, bytes, never freed in the step) of one microbatch's forward on the stage, in order."""
        out: list[tuple[int, int, bool]] = []
        if self.first:
            out += [(sign * self._times(mult), self.values[index], self.never_freed(index))
                    for sign, index, mult in self.recipe.prefix]
        for layer in range(self.start, self.stop):
            key = self.forward_key(layer)
            for sign, index, mult in self.segment(key):
                if sign > 0:
                    # the last segment's are told apart (nothing after it goes unrecorded): the labels' storage, first
                    # seen by the loss, is held once a stage, as the prefix's input ids are
                    out.append((1, self.values[index], key == "fwlast" and self.never_freed(index)))
                    continue
                times = self._forward_free(layer, key, index, mult)
                if times:
                    out.append((-times, self.values[index], False))
        if not self.last:  # the frees the forward's end makes, for the stage's layers (the last segment holds them)
            returned = self._last_layer_entries()
            for position, (sign, index, mult) in enumerate(self.recipe.last_forward):
                owner = self.owner.get(index)
                if sign > 0 or owner == "fwlast":
                    continue
                if position < returned and mult is None and owner != "prefix":
                    # freed as the last layer returns: its input (a post-norm layer saves none of it), the layer
                    # below's output: on this stage its last layer's output, kept with the microbatch and sent
                    continue
                times = self._end_free(index, mult)
                if times:
                    out.append((-times, self.values[index], False))
        return out

    def _last_layer_entries(self) -> int:
        """How many of the last segment's entries the last layer makes before the head's first allocation: as many
        allocations as a layer of its type makes elsewhere (a middle or the first layer's segment), then the frees
        its return makes. 0 where no other layer is of its type."""
        recipe = self.recipe
        kind = recipe.layer_types[-1]
        template = next((entries for context, entries in recipe.middle_forward.items()
                         if context.split("|")[1] == kind), None)
        if template is None and recipe.layer_types[0] == kind:
            template = recipe.first_forward
        if template is None:
            return 0
        made = sum(1 for sign, _, _ in template if sign > 0)
        for position, (sign, _, _) in enumerate(recipe.last_forward):
            if sign > 0:
                if made == 0:
                    return position
                made -= 1
        return len(recipe.last_forward)

    def kept_with_loss(self) -> tuple[int, int]:
        """On the last stage: the bytes a microbatch's loss keeps past its backward, while the loss is kept (0
        elsewhere). The one-device step frees them only as it lets its loss go, after the whole backward: the frees at
        the end of the first layer's backward segment, after its last gradient, of what a forward segment made (the
        loss itself, a scalar; what autograd nodes of the loss's graph hold as attributes, not saved tensors, which
        the backward frees: transformers' grouped-mm fallback's expert offsets, memory/expert_offsets.py), counted
        for the stage's layers; and of those the loss's own bytes: the last the last layer's segment made there (the
        loss tensor goes after the graph it holds)."""
        if not self.last:
            return 0, 0
        entries = self.recipe.first_backward
        made = [p for p, (sign, index, _) in enumerate(entries) if sign > 0 and self.recipe.gradient[index]]
        total = scalar = 0
        for sign, index, mult in entries[(made[-1] + 1 if made else 0):]:
            owner = self.owner.get(index)
            if sign > 0 or owner in ("prefix", "head", "bwlast", "bw0") or \
                    isinstance(owner, tuple) and owner[0] == "bw":
                continue
            if owner == "fw0":
                times = 1 if self.first else 0
            elif owner == "fwlast":
                times, scalar = 1, self.values[index]
            elif mult is not None:
                times = 0 if mult.startswith("+") else self.held_counts.get(mult, 0)
            else:  # a middle layer's, its context's representative
                times = 1 if self.held_counts.get(owner[1]) else 0
            total += times * self.values[index]
        return total, scalar

    def never_freed(self, index: int) -> bool:
        """An allocation the step never frees: the inputs' storage, which MemTracker counts once, as an operator first
        returns a view of it (a middle layer's are told apart only up to their representative: a layer's own are
        freed by the next, unrecorded, layer)."""
        return index not in self.freed and not self.recipe.gradient[index]

    def _times(self, mult: str | None) -> int:
        return 1 if mult is None else self.model_counts.get(mult, 0)

    def _forward_free(self, layer: int, key: Any, index: int, mult: str | None) -> int:
        owner = self.owner.get(index)
        if key == "fwlast" and owner != "fwlast":  # the forward's end: what the other layers made
            return self._end_free(index, mult)
        if mult is not None:
            return self.model_counts.get(mult, 0) if self.first else 0
        if owner == key:
            return 1
        if owner == "prefix":
            return 1 if self.first else 0
        return 1 if self.holds(layer - 1) else 0  # the layer below's: on the stage only if that layer is

    def _end_free(self, index: int, mult: str | None) -> int:
        owner = self.owner.get(index)
        if mult is not None and not mult.startswith("+"):
            return self.held_counts.get(mult, 0)
        if mult is not None:
            return self.model_counts.get(mult, 0) if self.first else 0
        if owner == "prefix":
            return 1 if self.first else 0
        if owner == "fw0":
            return 1 if self.first else 0
        if isinstance(owner, tuple):  # a middle layer's, counted once: its context's one layer (its type's first)
            return 1 if self.held_counts.get(owner[1]) else 0
        # one made by a middle layer beside the last, not the context's representative: the layer below the last
        return 1 if self.holds(self.count - 2) else 0

    # ----------------------------------------------------------------------------------------------- backward
    def backward(self) -> list[tuple[int, int, bool]]:
        """(sign × times, bytes, a parameter's gradient) of one microbatch's backward on the stage, in order."""
        out: list[tuple[int, int, bool]] = []
        # (segment, its layer), last to first: the loss's and head's backward first on the last stage
        order = [(self.backward_key(i), i) for i in range(self.stop - 1, self.start - 1, -1)]
        if self.last:
            order.insert(0, ("head", self.count - 1))
        for key, layer in order:
            # what the layer (and, for the last, the head beside it) made, in its forward or its backward
            own = {key, self.forward_key(layer)} | ({"fwlast", "head", "bwlast"} if layer == self.count - 1 else set())
            for sign, index, mult in self.segment(key):
                if key == "bw0" and (index == self.kept_gradient or index in self.not_made):
                    # the tied weight's gradient on a stage without its head: the embedding's own, kept as its .grad
                    # (never freed), and neither the sum nor the chunk copied out for it made
                    if sign > 0 and index == self.kept_gradient:
                        out.append((1, self.values[index], True))
                    continue
                times = sign * self._times(mult)
                if sign < 0:
                    times = -self._backward_free(layer, own, index, mult)
                if times:
                    out.append((times, self.values[index], self.recipe.gradient[index]))
        return out

    def tied_apart(self, tied: tuple[int, int]) -> tuple[int | None, tuple[int, ...]]:
        """(the embedding's gradient the stage keeps as the weight's .grad, what it does not make: the sum and the
        copy made for it), as allocation indices of the first layer's backward; None and () where the recipe shows
        no such allocation.

        In the one-device step a weight tied to the head has a .grad from the head's backward (the "head" segment)
        when the embedding's backward makes its own gradient N (`tied[0]` bytes): autograd's AccumulateGrad adds N
        into it, in place for a plain tensor (N then freed), out of place for a DTensor under tensor parallel (the
        sum G, `tied[1]` bytes, made; the head's .grad and N freed). A Replicate N added to the head's Shard(0) .grad
        is first redistributed: DTensor copies its local chunk out (`tied[1]` bytes, made before G and freed after
        it; the step recorder sees it since it lets DTensor desugar the add, traced/timeline.py). On the first stage,
        the head on another, the weight has no .grad yet: AccumulateGrad takes N itself as the .grad (a DTensor's as
        the embedding's backward returns it: Replicate, whole, under a vocabulary-parallel cut), so N is kept and
        counted a gradient, and neither G nor the chunk's copy is made (traced: GPT-2's wte, tp 2 × pp 2 and 3,
        tests/test_pipeline_tied_stages.py)."""
        made, kept = tied
        entries = self.recipe.first_backward
        freed_at = {index: position for position, (sign, index, _) in enumerate(entries) if sign < 0}
        candidates = [position for position, (sign, index, mult) in enumerate(entries)
                      if sign > 0 and mult is None and self.values[index] == made and not self.recipe.gradient[index]
                      and freed_at.get(index, -1) > position]
        if not candidates:
            return None, ()
        position = candidates[-1]
        own = entries[position][1]
        # the sum: a gradient the size of the .grad, made while N is live, before the head's .grad (made on the
        # last stage only) is freed
        head_frees = [p for p, (sign, index, _) in enumerate(entries)
                      if sign < 0 and self.owner.get(index) == "head" and self.values[index] == kept]
        total = next((p for p, (sign, index, _) in enumerate(entries)
                      if position < p < freed_at[own] and sign > 0 and self.recipe.gradient[index]
                      and self.values[index] == kept and any(f > p for f in head_frees)), None)
        if total is None:
            return own, ()
        # the redistribute's copy: the local chunk of N, made after N and before G, live while G is made
        copies = tuple(index for p, (sign, index, mult) in enumerate(entries)
                       if position < p < total and sign > 0 and mult is None and not self.recipe.gradient[index]
                       and self.values[index] == kept and freed_at.get(index, -1) > total)
        return own, (entries[total][1], *copies)

    def _backward_free(self, layer: int, own: set, index: int, mult: str | None) -> int:
        owner = self.owner.get(index)
        if mult is not None:
            return self._times(mult) if self.first else 0
        if owner in own:
            return 1
        if owner == "prefix":
            return 1 if self.first else 0
        if owner == "head":  # made by the loss's and head's backward (its scalar gradient, a tied head's .grad):
            return 1 if self.last else 0  # on the last stage only
        if index > self.last_forward_index:  # made in the backward of the layer above: its output's gradient
            return 1 if self.holds(layer + 1) or (layer == self.count - 1 and self.last) else 0
        return 1 if self.holds(layer - 1) else 0  # the layer below's output (on the stage, or the received input)

    # --------------------------------------------------------------------------------------------------- replay
    @staticmethod
    def run(events: list[tuple[int, int, bool]], before: int) -> tuple[int, int]:
        live = peak = before
        for times, size, _ in events:
            live += times * size
            peak = max(peak, live)
        return live, peak

    @staticmethod
    def run_backward(events: list[tuple[int, int, bool]], before: int, accumulate: bool = False,
                     waiting: frozenset[int] = frozenset()) -> tuple[int, int, int]:
        """(live at the end, the peak, the gradients made by then); `accumulate`: each gradient added into one
        already held and freed at once (it is counted at its moment, and not after), but one of a size in
        `waiting`, held until the next gradient is made and freed with it."""
        live = peak = before
        grads = grads_at_peak = 0
        held = 0  # gradients made, waiting for their AccumulateGrad
        for times, size, gradient in events:
            live += times * size
            if gradient:
                grads += times * size
            if live > peak:
                peak, grads_at_peak = live, grads
            if gradient and accumulate:
                if size in waiting and times > 0:
                    held += times * size
                    continue
                live -= times * size + held
                held = 0
        return live, peak, grads_at_peak


def interleaved_activations(recipe: DerivedRecipe, batch: int, seq: int, chunks: tuple[tuple[int, int], ...],
                            order: tuple[tuple[str, int], ...], residual: int,
                            waiting: frozenset[int] = frozenset(), tied: tuple[int, int] | None = None
                            ) -> StageActivations:
    """A rank of the interleaved schedule: its chunks (the layer runs [a, b) it holds) replayed each as a stage, and
    walked along `order` (("F" or "B", chunk): torch's ScheduleInterleaved1F1B's, parallel/pipeline.py), each
    moment the chunk-microbatches then in flight, each its own chunk's bytes, where the single-chunk stage holds k of
    one kind. A forward of chunk c: what is held + c's forward peak; a backward: what is held (its microbatch's
    included) + c's backward through the chunk, its gradients made as it goes at the chunk's first backward and
    added into their .grad at once at a later one (stage_activations' rules). The figures: `held` and
    `forward_peak` before the first backward, `backward_peak` through it, `later_peak` over every action after it,
    above every gradient the rank holds by the step's end (so that states + gradients + later_peak is the moment);
    `in_flight` the most chunk-microbatches held at once; `per_microbatch` the largest chunk's."""
    parts = []
    for a, b in chunks:
        replay = _Replay(recipe, batch, seq, a, b, tied)
        received = 0 if replay.first else residual
        events = replay.forward()
        forward_live, forward_peak = replay.run(events, received)
        kept_once = sum(size for times, size, never in events if never and times > 0)
        _, again = replay.run([e for e in events if not (e[2] and e[0] > 0)], received)
        backward = replay.backward()
        gradient = 0 if replay.last else residual
        _, first_peak, made = replay.run_backward(backward, gradient)
        _, later_peak, _ = replay.run_backward(backward, gradient, accumulate=True, waiting=waiting)
        grads = sum(times * size for times, size, is_gradient in backward if is_gradient)
        # (each microbatch's bytes, the first forward's peak, a later forward's, the first backward's peak above
        # its start and the gradients by then, a later backward's, the chunk's gradients, held once)
        parts.append((forward_live - kept_once, forward_peak, again, first_peak, made, later_peak, grads,
                      kept_once, *replay.kept_with_loss()))
    counts = [0] * len(chunks)
    done = [False] * len(chunks)
    kept = [False] * len(chunks)
    gradients = most = 0
    held = forward_peak = backward_peak = at_peak = after = gradients_then = first_made = 0
    later: int | None = None
    losses = 0  # what the losses of the microbatches gone back keep (the last chunk's)
    for kind, chunk in order:
        each, first_fw, again, first_bw, made, later_bw, grads, _, loss, _ = parts[chunk]
        holding = sum(n * parts[c][0] for c, n in enumerate(counts)) + \
            sum(parts[c][7] for c in range(len(chunks)) if kept[c]) + losses
        if kind == "F":
            moment = holding + gradients + (again if kept[chunk] else first_fw)
            counts[chunk] += 1
            kept[chunk] = True
            most = max(most, sum(counts))
        elif not done[chunk]:
            moment = holding + gradients + first_bw
            gradients_then = gradients + made
            counts[chunk] -= 1
            gradients += grads
            done[chunk] = True
            if later is None:
                first_made = grads
        else:
            moment = holding + gradients + later_bw
            counts[chunk] -= 1
        if kind == "B":
            losses += loss
        if later is None and kind == "B":  # the rank's first backward
            held, backward_peak, at_peak = holding, moment, gradients_then
            after = holding - each + loss
            later = 0
        elif later is None:
            forward_peak = max(forward_peak, moment)
        else:
            later = max(later, moment)
    every = sum(part[6] for part in parts)
    first, last = chunks[0][0] == 0, chunks[-1][1] == len(recipe.layer_types)
    return StageActivations(
        per_microbatch=max(part[0] for part in parts), in_flight=most, held=held, forward_peak=forward_peak,
        backward_peak=backward_peak, gradients_at_backward_peak=at_peak,
        received=residual if len(chunks) > 1 or not first else 0,
        output_gradient=residual if len(chunks) > 1 or not last else 0,
        later_in_flight=most if later else 0, later_peak=later - every if later else 0, after=after,
        gradients_made=(first_made, every), loss_kept=parts[-1][8], loss_scalar=parts[-1][9])
