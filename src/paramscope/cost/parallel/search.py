"""Which layouts fit: every dp × tp × pp × cp (× ep) layout of N devices, the ones whose busiest device fits a GPU,
sorted by a bound on the step's time, with the pipeline bubble and the communication each device does a step.

    enumerate  dp · tp · pp · cp = N: tp among the degrees the sharding rules accept (heads, KV heads, widths),
               pp ≤ the layers (× virtual stages), cp dividing the sequence, ep dividing the routed experts and
               dp × cp; the global batch G fixed, so dp must divide it (each replica G / dp sequences; under a
               pipeline, microbatches of one sequence)
    → memory   one device's peak (estimate.py through memory/training.py's step_estimate), + the reserve, against
               the GPU's memory. A class without the analytic per-device recipe (its step derived from traces):
               each layout asked as memory --dp D --tp T --pp P --sp asks it (the same peak to the byte): an FSDP or
               tp rank derived from traces with the layout applied, a pipeline's stages replayed from the one-device
               or tp (ep) rank's recipe; at most MAX_DERIVED rank derivations a search, lowest bound first, none
               for a layout whose bound exceeds the GPU; what memory refuses, or the cap leaves underived, is named
               as not answered, and the summaries say that only the answered layouts were tried
    → FLOPs    the busiest device's hardware FLOPs a step (flops.py: its stage and tp rank, recompute included)
    → time     a bound at the GPU's peak: hardware FLOPs / peak FLOP/s / (1 − bubble). Not a prediction: no
               kernel runs at its peak, and communication is not in it (it may overlap or not)
    → bytes    each device's communication a step, by kind, each a bound (ring collectives, balanced routing)
    → sorted   by the time bound, then by the bytes, then by the peak
    and the fewest devices that fit: every count from 1 (those whose model states alone exceed the GPU passed
    over), powers of two first (the first that fits bounds it), then every count below that bound, upward, each
    tried until one of its layouts fits: a layout whose lower bound (_Search.bound: terms of its first stage's
    peak) exceeds the GPU is passed over unevaluated, the rest evaluated lowest bound first; at most MIN_BUDGET
    evaluated layouts in that second pass (Llama-3.1-405B on H100s: 160 devices, 58 layouts evaluated and 637
    passed over below it, where every layout of every count cost minutes).

What one device sends (and as much it receives) a step, ring algorithms over a group of n ranks, a buffer of X
bytes: all-gather and reduce-scatter (n − 1)/n · X each, all-reduce 2(n − 1)/n · X; rounded up to a byte:

    DP   P, G = the device's parameters and gradients before any data-parallel share, in the dtype they are trained
         in (fp32 under mixed precision: FSDP2 without a MixedPrecisionPolicy, as the memory figures assume); routed
         experts apart (Pe, Ge) over their own n_e = n / ep ranks, the rest (Pd, Gd) over n = dp × cp
         DDP (no sharding)   all-reduce of the gradients                         2(n−1)/n · G
         ZeRO-1, ZeRO-2      reduce-scatter of the gradients, all-gather of the updated parameters   (n−1)/n · (G + P)
         ZeRO-3, FSDP2       all-gather of the parameters in forward and again in backward, reduce-scatter of the
                             gradients                                           (n−1)/n · (2P + G)
         FSDP2 hybrid        the same inside a shard group of g, then all-reduce of the gradient shard across the
                             r = n / g groups                (g−1)/g · (2P + G) + 2(r−1)/r · G/g
    TP   X = b·s·h × a (a microbatch's tokens on the rank: b = the microbatch, s = S / cp; a = 2 B under mixed or
         bf16 precision, 4 B in fp32); per layer 2 all-reduces forward and 2 backward (Megatron; with sequence
         parallel each is an all-gather and a reduce-scatter: the same bytes); the vocabulary-parallel embedding's
         forward and the head's input gradient one more each on the first and last stage; full checkpointing reruns
         the forward's 2 a layer:        c · 2(t−1)/t · X per microbatch, c = 4·L (+2·L recomputed) (+1 first) (+1 last)
    PP   Y = b·s·h × r / t (the residual stream between stages: r = 4 B under mixed precision, sp's 1/t piece a rank):
         each microbatch's activation sent forward and its gradient sent back, at every chunk boundary the device
         holds;                          (v − [last]) + (v − [first]) sends of Y per microbatch
         a tied embedding under pp: its gradient all-reduced between the first and last stage, E (the shard's bytes)
    EP   the routed tokens' all-to-all, dispatch and combine, forward and backward (+2 recomputed), the share leaving
         the rank under balanced routing: 4 · (e−1)/e · k·T·h × a a MoE layer and microbatch, T = b·s / t tokens
    CP   ring attention: K and V of the rank's chunk passed cp − 1 times a layer forward, K, V and their gradients
         backward (+1 recomputed): 3 · (cp−1) · 2·b·s·kv·hd × a a layer and microbatch (kv = the rank's KV heads)
Left out: the loss's vocabulary-parallel max and sum (8 B a token), the optimizer's gradient-norm all-reduce, and
MoE routers' load-balancing statistics: bytes per token or per step, well under 0.1%.
"""

from __future__ import annotations

from contextlib import nullcontext
from math import gcd
from time import perf_counter
from typing import Any

from ...errors import OptionError, ParamscopeError, UnsupportedError
from .layout import MAX_DEGREE, ParallelLayout, layout_for, shard_mode, shard_words
from .pipeline import bubble, layer_of, layer_stack_of, stages
from .search_options import SearchOptions, peak_for
from .search_result import (Candidate, CommTerm, DeviceCount, LayoutSearch, Minimum, Skipped,
                            candidate_settings)

MIN_BEYOND = 16  # the fewest devices are sought up to 16 × N
MIN_BUDGET = 1024  # layouts the fewest devices' search evaluates below the first power of two that fits, at most
# (those passed over on their lower bound cost nothing and are not counted)
MAX_DERIVED = 8  # ranks' steps a search derives from traces for a class without the analytic per-device recipe, at
# most (each a few traces of short cuts on torch's fake process group: GPT-2 at 1,024 tokens 13-28 s cold on 2 busy
# cores, under 2 s once cached); the layouts that would need another are named as not derived


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class _Search:
    """The model's fixed facts, read once, and each layout's evaluation."""

    def __init__(self, report: Any, view: Any, options: SearchOptions, seq: int, flops_check: Any = None) -> None:
        from ..dims import config_int, text_config
        from ..flops.analytic import routing
        from ..hardware import find_accelerator

        self.report, self.view, self.options, self.seq = report, view, options, seq
        self.text = text_config(view.config)
        self.accelerator = find_accelerator(options.gpu)
        self.peak, self.peak_dtype = peak_for(self.accelerator, options.precision)
        self.capacity = self.accelerator.memory - options.reserve
        self.hidden = config_int(self.text, "hidden_size") or 0
        heads = config_int(self.text, "num_attention_heads") or 1
        self.kv_heads = config_int(self.text, "num_key_value_heads") or heads
        self.head_dim = config_int(self.text, "head_dim") or (self.hidden // heads if heads else 0)
        self.top_k, self.experts = routing(self.text)
        self.shard = shard_mode(options.zero or "fsdp")
        self.checkpointing = options.grad_checkpointing == "full"
        self.act = 4 if options.precision == "fp32" else 2
        self.residual = 2 if options.precision == "bf16-pure" else 4
        try:
            self.stack, self.layers = layer_stack_of([p.name for p in report.params])
        except UnsupportedError as err:
            self.stack, self.layers, self.no_pp = None, 1, str(err)
        else:
            self.no_pp = None
        self.moe_layers = {layer_of(p.name, self.stack) for p in report.params
                           if p.role == "moe.experts" and self.stack is not None} - {None}
        self.tied = next((g.canonical for g in report.tied), None)
        self.causal = view.class_name.endswith(("ForCausalLM", "LMHeadModel"))
        self._placements: dict[tuple[int, int], Any] = {}
        self._flops: dict[int, Any] = {}
        self.evaluated = 0
        self.needs_build = False
        self._checked = False
        self.flops_check = flops_check
        self._model_parallel: dict[int, str | None] = {}
        self._engines: dict[int, str] = {}
        # a class's pipeline stages replayed from its derived step, refused at a microbatch size (the derivation
        # declined, an encoder-decoder): the same for every pipeline of that size, so asked once
        self._stages_refused: dict[tuple[int, int, int, int], str] = {}  # (microbatch, tp, ep, cp)
        self._stage_bytes: dict[tuple[int, int, int, int], list] = {}
        self._stage_states: dict[tuple, tuple[Any, int, int]] = {}
        self._per_layers: dict[tuple[int, int, bool, int], int | None] = {}
        self._layers_of: dict[str, int | None] = {}
        # a class without the analytic per-device recipe: the ranks' steps this search derived from traces (or read
        # from the cache), by derivation_key, in the order asked; at most MAX_DERIVED of them
        self.derived: list[tuple] = []
        self.not_derived = 0  # layouts passed over because the MAX_DERIVED derivations were spent
        self.bounded = 0  # layouts the fewest devices' search passed over on their bound
        norms = [p.name for p in report.params if p.role.endswith("norm") and tuple(p.shape) == (self.hidden,)
                 and not p.name.endswith("bias") and self.stack is not None and layer_of(p.name, self.stack) == 0]
        self.layer_norms = len(norms)  # the hidden-size norms of one layer (two in Llama's, four in Gemma-2's)

    # ---- enumeration

    def placements(self, tp: int, ep: int) -> Any:
        """Every parameter's cut under (tp, ep), or the OptionError the rules refuse it with."""
        key = (tp, ep)
        if key not in self._placements:
            from .estimate import placements_for

            try:
                self._placements[key] = placements_for(self.report, self.view, ParallelLayout(tp=tp, ep=ep))
            except OptionError as err:
                self._placements[key] = err
        return self._placements[key]

    def layouts(self, devices: int) -> tuple[list[tuple[ParallelLayout, int]], list[Skipped]]:
        """((layout, replica batch) for every layout of `devices` the options allow, the ones refused)."""
        options = self.options
        batch = options.total_batch
        out, skipped = [], []
        virtual = options.virtual_stages
        for tp in divisors(devices):
            refused = self.placements(tp, 1)
            if isinstance(refused, OptionError):
                skipped.append(Skipped(devices // tp, tp, 1, 1, 1, _words(refused)))
                continue
            for pp in divisors(devices // tp):
                if pp > 1 and self.no_pp:
                    skipped.append(Skipped(devices // tp // pp, tp, pp, 1, 1, self.no_pp))
                    continue
                if pp > 1 and pp * virtual > self.layers:
                    continue  # more stages than layers: not a layout
                for cp in divisors(devices // tp // pp):
                    if cp > 1 and not options.context_parallel:
                        continue
                    dp = devices // tp // pp // cp
                    if cp > 1 and self.seq % cp:
                        skipped.append(Skipped(dp, tp, pp, cp, 1, f"cp {cp} does not divide the sequence, "
                                                                   f"{self.seq:,} tokens"))
                        continue
                    if batch % dp:
                        skipped.append(Skipped(dp, tp, pp, cp, 1, f"dp {dp} does not divide the global batch, "
                                                                   f"{batch:,} sequences"))
                        continue
                    replica = batch // dp
                    for ep in divisors(gcd(self.experts, dp * cp)) if self.experts else [1]:
                        if self.shard == "hsdp" and options.shard_group and (dp * cp) % options.shard_group:
                            skipped.append(Skipped(dp, tp, pp, cp, ep, f"the shard group {options.shard_group} "
                                                                       f"does not divide dp × cp = {dp * cp}"))
                            continue
                        layout = layout_for(
                            dp=dp, zero=self.shard, tp=tp, sp=tp > 1, pp=pp, cp=cp, ep=ep, batch=replica,
                            shard_group=options.shard_group if self.shard == "hsdp" else None,
                            micro_batches=replica if pp > 1 else None,
                            schedule=(options.schedule or ("interleaved" if virtual > 1 else "1f1b")) if pp > 1
                            else None, virtual_stages=virtual if pp > 1 else 1)
                        out.append((layout, replica))
        return out, skipped

    # ---- one layout

    def evaluate(self, layout: ParallelLayout, replica: int, *, until_fit: bool = False) -> Candidate | Skipped | None:
        """The layout's figures; Skipped where an engine refuses it (the reason); None where the memory answer
        needs the built module. `until_fit`: a layout that does not fit is given its memory only (FLOPs, time and
        bytes 0): the fewest devices' search reads only whether it fits.

        A class without the analytic per-device recipe is asked exactly what `memory --dp D --tp T --pp P --sp`
        asks (derive_layout: one rank's step derived from traces with the layout applied, wherever memory derives
        one), so each answered layout's peak is memory's to the byte; a derivation the search has not made yet is
        made only while fewer than MAX_DERIVED were, and only for a layout whose lower bound fits the GPU."""
        from ... import progress
        from ..memory.training import TrainingOptions, step_estimate
        from .flops import device_flops

        options = self.options
        key = self.derivation_key(layout, replica)
        derive = False
        if layout.tp > 1 or layout.cp > 1 or layout.pp > 1 or key is not None:
            why = self.not_answered(layout, replica)
            if self.needs_build:
                return None
            if why:
                return Skipped(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, why)
            derive = self._model_parallel.get(replica) is not None  # a class whose step is derived
        new = derive and key is not None and key not in self.derived
        if new and key[0] == "device":  # the one-device recipe at a microbatch size, as dp × pp always derived it
            self.derived.append(key)
            new = False
        if new:
            if self.bound(layout, replica) > self.capacity:
                return Skipped(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep,
                               f"does not fit: its model states alone, a lower bound on its peak, exceed the "
                               f"{self.capacity:,} B the GPU leaves beside the reserve (no step derived)", bounded=True)
            if self.spent >= MAX_DERIVED:
                self.not_derived += 1
                return Skipped(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep,
                               f"not derived: the search derives at most {MAX_DERIVED} ranks' steps from traces "
                               f"(the lowest-bound layouts' first), and each {self.view.class_name} rank at another "
                               "tp degree, FSDP degree or batch regime is one; memory --dp D --tp T --pp P --sp "
                               "derives it")
            self.derived.append(key)
        self.evaluated += 1
        try:
            with progress.status(f"layout search: one rank's step for {layout.words()}, derived from traces "
                                 f"({self.spent} of at most {MAX_DERIVED})") if new else nullcontext():
                memory = step_estimate(self.report, self.view, TrainingOptions(
                    batch=replica, seq=self.seq, optimizer=options.optimizer, precision=options.precision,
                    grad_checkpointing=options.grad_checkpointing, attention=options.attention, layout=layout,
                    reserve=options.reserve, fits=False, derive_layout=derive), live=False)
            if memory is None:
                self.needs_build = True
                return None
            if until_fit and memory.peak > self.capacity:
                return Candidate(layout, replica, memory.peak, memory.peak_phase, False, self.capacity - memory.peak,
                                 None, None, bubble(layout), None, (), None)
            estimate, parts = self.replica_flops(replica)
            device = device_flops(estimate, parts, self.report, self.view, layout,
                                  checkpointing=self.checkpointing, causal_model=self.causal)
        except ParamscopeError as err:
            if layout.pp > 1 and self.model_parallel(replica):
                self._stages_refused[(replica // layout.micro_batches, layout.tp, layout.ep, layout.cp)] = \
                    _words(err)
            return Skipped(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, _words(err))
        idle = bubble(layout)
        seconds = device.hardware / self.peak / (1 - idle)
        stage, comm = self.communication(layout, replica)
        return Candidate(layout, replica, memory.peak, memory.peak_phase, memory.peak <= self.capacity,
                         self.capacity - memory.peak, device.hardware, device.step, idle, seconds, comm, stage)

    def engine(self, replica: int) -> str | None:
        """The engine that answers one device's step at `replica` × seq ("analytic", "derived", "traced"); None
        where that needs the built module (needs_build is set)."""
        if replica not in self._engines:
            from ..memory.training import TrainingOptions, step_estimate

            options = self.options
            one = step_estimate(self.report, self.view, TrainingOptions(
                batch=replica, seq=self.seq, optimizer=options.optimizer, precision=options.precision,
                grad_checkpointing=options.grad_checkpointing, attention=options.attention,
                reserve=options.reserve, fits=False), live=False)
            if one is None:
                self.needs_build = True
                return None
            self._engines[replica] = one.engine
        return self._engines[replica]

    def model_parallel(self, replica: int) -> str | None:
        """Why tensor, context and pipeline layouts have no analytic per-device answer at this replica batch, or
        None: the per-device engine lays out the analytic recipe's activations (estimate.py), so the one-device step
        must be the analytic engine's. Where it is the derived engine's, not_answered says which layouts the
        derived stages answer all the same."""
        if replica not in self._model_parallel:
            from .activations import local_recipe

            why = None
            if local_recipe(self.text, self.view.class_name) is None:
                why = (f"tensor, context and pipeline parallelism need each device's activations, which paramscope "
                       f"lays out from the analytic recipe of the Llama-style family; {self.view.class_name} has "
                       f"none")
            else:
                engine = self.engine(replica)
                if engine is None:
                    return None
                if engine != "analytic":
                    why = (f"tensor, context and pipeline parallelism need each device's activations from the "
                           f"analytic recipe; {self.view.class_name}'s step at {replica:,} × {self.seq:,} is "
                           f"answered by the {engine} engine (its notes say why), which is not split per device")
            self._model_parallel[replica] = why
        return self._model_parallel[replica]

    def not_answered(self, layout: ParallelLayout, replica: int) -> str | None:
        """Why a tensor, context or pipeline layout is not answered, or None where it is asked: analytically (the
        Llama-style family), or, without the analytic per-device recipe, as memory --dp D --tp T --pp P --cp C --ep E
        --sp answers it, which refuses what it does not model in one line (the Skipped's reason): a rank's step
        derived from traces with the layout applied (estimate.py's _derived_device), a pipeline's stages replayed from
        the one-device, tensor- or expert-parallel rank's derived recipe (pipeline_device.py's
        derived_pipeline_device); each derivation once and cached. A pipeline refused at a microbatch size is refused
        for every pipeline of that size and those degrees, so asked once."""
        why = self.model_parallel(replica)
        if why is None or self.needs_build:
            return why
        if layout.pp > 1:
            return self._stages_refused.get((replica // layout.micro_batches, layout.tp, layout.ep, layout.cp))
        return None

    @property
    def spent(self) -> int:
        """The derivations counted against MAX_DERIVED: the ranks' (tensor, expert, context parallel or FSDP), not
        the one-device steps (every answer of the class needs those; a pipeline's stages replay them)."""
        return sum(1 for key in self.derived if key[0] != "device")

    def derivation_key(self, layout: ParallelLayout, replica: int) -> tuple | None:
        """The derived recipe a class without the analytic per-device recipe needs for the layout, as memory asks
        the cache for it (the traced layout and the batch regime, 1 or 2 and up; the sequence is the search's): a
        pipeline's stages replay the tensor- or expert-parallel rank's recipe (or one device's) at the microbatch,
        without FSDP; a rank without a pipeline is derived at the replica's batch with FSDP's degree, or alone with
        its context-parallel share. None where memory derives nothing more (data or expert parallel alone: the
        one-device step) or refuses the layout first (cp with tp or FSDP, ep with tp, cp under a pipeline)."""
        if layout.pp > 1:
            regime = min(2, replica // layout.micro_batches)
            if layout.cp > 1:
                return None
            if layout.ep > 1 and self.experts:
                return None if layout.tp > 1 else ("experts", layout.ep, regime)
            return ("rank", 1, "none", layout.tp, layout.sp, regime) if layout.tp > 1 else ("device", regime)
        regime = min(2, replica)
        fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
        if layout.ep > 1:
            return None
        if layout.cp > 1:
            return None if layout.tp > 1 or fsdp else ("context", layout.cp, regime)
        if not fsdp and layout.tp == 1:
            return None
        return ("rank", layout.shard_degree if fsdp else 1, "fsdp" if fsdp else "none", layout.tp, layout.sp, regime)

    def bound(self, layout: ParallelLayout, replica: int) -> int:
        """A lower bound on the layout's peak per device, cheap beside the evaluation: two of the terms the
        per-device engine adds into one of the first stage's moments (the whole model's without a pipeline), on rank
        0. With a pipeline, its 1F1B steady state (or GPipe's first backward) holds the stage's model states,
        gradients included, and its layers' saved activations for every microbatch in flight; without one, the end
        of the forward holds the states but the gradients, and every layer's saved activations; the optimizer step
        holds all the states. The rest of those moments (the embedding output, 16-bit weight copies, FSDP2's gathered
        units, the arriving gradient, the logits) only adds, so a layout whose bound exceeds the GPU does not fit.
        The model states alone where the class has no analytic recipe or its step is another engine's (a derived
        step's activations need not reach the recipe's)."""
        from ..memory.states import check_optimizer, check_precision
        from .states import device_states

        placements = self.placements(layout.tp, layout.ep)
        if isinstance(placements, OptionError):
            return 0
        key = (layout.tp, layout.ep, layout.pp, layout.virtual_stages, layout.shard, layout.shard_degree, layout.dp,
               layout.cp)
        if key not in self._stage_states:
            plan = stages(layout, self.layers) if layout.pp > 1 else None
            first = plan[0] if plan else None
            held = set(first.layers) if first else None
            params = [p for p in self.report.params
                      if held is None or (self._layer(p.name) in held if self._layer(p.name) is not None
                                          else p.role.startswith("embeddings") or first.last)]
            dev = device_states(params, placements, layout, precision=check_precision(self.options.precision),
                                optimizer=check_optimizer(self.options.optimizer),
                                trainable=frozenset(p.name for p in self.report.params))
            layers = (max(first.chunk_layers) if layout.virtual_stages > 1 else len(first.layers)) if first else \
                self.layers
            self._stage_states[key] = (dev, layers, first.in_flight if first else 1)
        dev, layers, in_flight = self._stage_states[key]
        micro = replica // layout.micro_batches if layout.pp > 1 and layout.micro_batches else replica
        per_layer = self._per_layer(layout.tp, layout.cp, layout.sp, micro)
        if per_layer is None or self.model_parallel(replica):
            # the step is not the analytic recipe's (derived or traced), whose activations need not exceed the
            # recipe's: the model states alone, which the optimizer step holds
            return dev.bytes
        kept = in_flight * layers * per_layer
        return max(dev.bytes, dev.bytes + kept if layout.pp > 1 else dev.bytes - dev.gradients + kept)

    def _layer(self, name: str) -> int | None:
        if name not in self._layers_of:
            self._layers_of[name] = layer_of(name, self.stack) if self.stack is not None else None
        return self._layers_of[name]

    def _per_layer(self, tp: int, cp: int, sp: bool, micro: int) -> int | None:
        """One layer's saved activations on a rank (the analytic recipe on its shard, at S / cp tokens, norms on
        S / tp under sequence parallel), or None where the class has no such recipe."""
        key = (tp, cp, sp, micro)
        if key not in self._per_layers:
            from .activations import local_recipe, sequence_parallel, tp_activations

            value = None
            if local_recipe(self.text, self.view.class_name) is not None:
                seq = -(-self.seq // cp)
                act = tp_activations(self.text, self.view.class_name, tp=tp, batch=micro, seq=seq,
                                     precision=self.options.precision, checkpointing=self.checkpointing,
                                     cast_weights=0, cast_head=0, cast_biases=0)
                if act is not None and sp and tp > 1:
                    act = sequence_parallel(act, tp=tp, tokens=micro * seq, hidden=self.hidden,
                                            precision=self.options.precision, layer_norms=self.layer_norms)
                value = act.per_layer if act is not None else None
            self._per_layers[key] = value
        return self._per_layers[key]

    def replica_flops(self, replica: int) -> tuple[Any, Any]:
        """The analytic count at a replica's batch, and its weight-by-weight parts (one per batch)."""
        if replica not in self._flops:
            from ..flops.analytic import Parts, analytic_flops

            if not self._checked:
                self._check_flops()
            parts = Parts()
            estimate = analytic_flops(self.view, self.report.params, batch=replica, seq=self.seq, training=True,
                                      checkpointing=self.checkpointing, parts=parts)
            if estimate is None:
                raise UnsupportedError("{cls} has no analytic FLOP count here, which the search sorts by",
                                       cls=self.view.class_name)
            self._flops[replica] = (estimate, parts)
        return self._flops[replica]

    def _check_flops(self) -> None:
        """The analytic FLOPs are trusted once checked against FlopCounterMode for this config, as `flops` does:
        kept with the cost facts, else made on the build (its FactsGap makes the caller build)."""
        if self.flops_check is not None:
            check = self.flops_check.of(self.view)
            if check.status == "differs":
                raise UnsupportedError("the analytic FLOPs of {cls} differ from FlopCounterMode's for this config "
                                       "({why}); the search sorts by them", cls=self.view.class_name,
                                       why=check.words())
        self._checked = True

    # ---- communication

    def stage_bytes(self, layout: ParallelLayout) -> list[tuple[Any, int, int, int]]:
        """For each pipeline stage: (the stage, its dense parameters' bytes, its routed experts' bytes, a tied
        embedding copy's bytes), rank 0's tensor/expert-parallel shards in the dtype they train in."""
        key = (layout.tp, layout.ep, layout.pp, layout.virtual_stages)
        if key in self._stage_bytes:
            return self._stage_bytes[key]
        from ..dtypes import itemsize
        from ..memory.states import trained_dtype
        from .pipeline import Stage

        placements = self.placements(layout.tp, layout.ep)
        by_name = {p.name: p for p in placements}

        def size(p: Any) -> int:
            return p.local_numel * itemsize(trained_dtype(p, self.options.precision))  # type: ignore[arg-type]

        if layout.pp > 1:
            plan = stages(layout, self.layers)
        else:
            plan = (Stage(0, tuple(range(self.layers)), (self.layers,), True, True, 1),)
        out = []
        for stage in plan:
            held = set(stage.layers)
            dense = experts = 0
            for param in self.report.params:
                index = layer_of(param.name, self.stack) if self.stack is not None else None
                mine = (index in held) if index is not None else (
                    stage.first if param.role.startswith("embeddings") else stage.last)
                if layout.pp == 1:
                    mine = True
                if not mine:
                    continue
                placement = by_name[param.name]
                if placement.experts_split:
                    experts += size(placement)
                else:
                    dense += size(placement)
            tied = 0
            if layout.pp > 1 and self.tied in by_name and by_name[self.tied].role.startswith("embedding"):
                tied = size(by_name[self.tied])
                if stage.last:
                    dense += tied
            out.append((stage, dense, experts, tied if (stage.first or stage.last) else 0))
        self._stage_bytes[key] = out
        return out

    def communication(self, layout: ParallelLayout, replica: int) -> tuple[int, tuple[CommTerm, ...]]:
        """(the stage whose device moves the most, its terms)."""
        best: tuple[int, tuple[CommTerm, ...]] | None = None
        for stage, dense, experts, tied in self.stage_bytes(layout):
            terms = tuple(t for t in (*self._dp_terms(layout, dense, experts), self._tp_term(layout, replica, stage),
                                      *self._pp_terms(layout, replica, stage, tied),
                                      self._ep_term(layout, replica, stage), self._cp_term(layout, replica, stage))
                          if t is not None)
            if best is None or sum(t.bytes for t in terms) > sum(t.bytes for t in best[1]):
                best = (stage.rank, terms)
        assert best is not None
        return best

    def _dp_terms(self, layout: ParallelLayout, dense: int, experts: int) -> list[CommTerm]:
        """The data-parallel collectives: the dense parameters over the dp × cp ranks holding them, the routed
        experts over the dp × cp / ep ranks holding the same experts."""
        ranks = layout.dp * layout.cp
        out = []
        for label, params, split in (("", dense, 1), (" (routed experts)", experts, layout.ep)):
            same = ranks // split  # ranks holding the same parameters
            if not params or same == 1:
                continue
            p = g = params
            group = "dp × cp" + (" / ep" if split > 1 else "")
            given = f"{'Pe = Ge' if split > 1 else 'P = G'} = {params:,} B"
            if layout.zero_stage == 0:
                n = same
                out.append(CommTerm("dp", f"DDP: all-reduce of the gradients{label}", _ceil(2 * (n - 1) * g, n),
                                    f"2(n−1)/n · G, n = {group} = {n}", f"2·{n - 1}/{n} × {g:,} ({given})"))
                continue
            n = max(1, layout.shard_degree // split)  # ranks a shard is cut over
            replicas = same // n
            if layout.zero_stage in (1, 2):
                out.append(CommTerm("dp", f"{shard_words(layout)}: reduce-scatter of the gradients, all-gather of "
                                          f"the updated parameters{label}", _ceil((n - 1) * (g + p), n),
                                    f"(n−1)/n · (G + P), n = {group} = {n}", f"{n - 1}/{n} × ({g:,} + {p:,}) "
                                                                             f"({given})"))
            elif replicas > 1:
                inside = _ceil((n - 1) * (2 * p + g), n)
                across = _ceil(2 * (replicas - 1) * _ceil(g, n), replicas)
                out.append(CommTerm("dp", f"{shard_words(layout)}: all-gather of the parameters (forward and "
                                          f"backward) and reduce-scatter of the gradients inside a shard group of "
                                          f"g = {n}, all-reduce of the gradient shard across r = {replicas} "
                                          f"groups{label}", inside + across, "(g−1)/g · (2P + G) + 2(r−1)/r · G/g",
                                    f"{n - 1}/{n} × (2 × {p:,} + {g:,}) + 2·{replicas - 1}/{replicas} × "
                                    f"{_ceil(g, n):,} ({given})"))
            else:
                out.append(CommTerm("dp", f"{shard_words(layout)}: all-gather of the parameters (forward and "
                                          f"backward), reduce-scatter of the gradients{label}",
                                    _ceil((n - 1) * (2 * p + g), n), f"(n−1)/n · (2P + G), n = {group} = {n}",
                                    f"{n - 1}/{n} × (2 × {p:,} + {g:,}) ({given})"))
        return out

    def _tokens(self, layout: ParallelLayout, replica: int) -> tuple[int, int, int]:
        """(microbatches, sequences a microbatch, tokens of a sequence on the rank)."""
        micro = layout.micro_batches if layout.pp > 1 else 1
        return micro, replica // micro, self.seq // layout.cp

    def _tp_term(self, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
        t = layout.tp
        if t == 1:
            return None
        m, b, s = self._tokens(layout, replica)
        x = b * s * self.hidden * self.act
        layers = len(stage.layers)
        count = 4 * layers + (2 * layers if self.checkpointing else 0) + (1 if stage.first else 0) + \
            (1 if stage.last else 0)
        value = m * count * _ceil(2 * (t - 1) * x, t)
        what = "all-gather + reduce-scatter (sequence parallel)" if layout.sp else "all-reduce"
        return CommTerm("tp", f"tensor parallel: the activations' {what}, 4 a layer (forward and backward)"
                              + (" + 2 recomputed" if self.checkpointing else "") + " + the embedding's and head's",
                        value, "m · c · 2(t−1)/t · b·s·h·a",
                        f"{m} microbatch{'es' if m > 1 else ''} × {count} × 2·{t - 1}/{t} × {b}·{s:,}·{self.hidden:,}"
                        f"·{self.act} B (c = 4 × {layers} layers" + (f" + 2 × {layers} recomputed" if
                                                                     self.checkpointing else "")
                        + (" + 1 embedding" if stage.first else "") + (" + 1 head" if stage.last else "") + ")")

    def _pp_terms(self, layout: ParallelLayout, replica: int, stage: Any, tied: int) -> list[CommTerm]:
        if layout.pp == 1:
            return []
        m, b, s = self._tokens(layout, replica)
        v = layout.virtual_stages
        piece = layout.tp if layout.sp else 1
        y = _ceil(b * s * self.hidden * self.residual, piece)
        sends = (v - (1 if stage.last else 0)) + (v - (1 if stage.first else 0))
        out = [CommTerm("pp", "pipeline: each microbatch's activation sent to the next stage and its gradient to "
                              "the previous, at every boundary the device holds", m * sends * y,
                        "m · sends · b·s·h·r" + (" / t" if piece > 1 else ""),
                        f"{m} × {sends} × {b}·{s:,}·{self.hidden:,}·{self.residual} B"
                        + (f" / {piece}" if piece > 1 else ""))]
        if tied:
            out.append(CommTerm("pp", "pipeline: the tied embedding's gradient all-reduced between the first and "
                                      "last stage (Megatron's embedding group)", tied, "2·(2−1)/2 · E",
                                f"{tied:,} B"))
        return out

    def _ep_term(self, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
        e = layout.ep
        if e == 1:
            return None
        m, b, s = self._tokens(layout, replica)
        layers = sum(1 for index in stage.layers if index in self.moe_layers)
        if not layers:
            return None
        tokens = _ceil(b * s, layout.tp if layout.sp else 1)
        count = 4 + (2 if self.checkpointing else 0)
        value = m * layers * count * _ceil((e - 1) * self.top_k * tokens * self.hidden * self.act, e)
        return CommTerm("ep", "expert parallel: the routed tokens' all-to-all, dispatch and combine, forward and "
                              "backward" + (" + recomputed" if self.checkpointing else "") + ", balanced routing",
                        value, f"m · L_moe · {count} · (e−1)/e · k·T·h·a",
                        f"{m} × {layers} MoE layers × {count} × {e - 1}/{e} × {self.top_k}·{tokens:,}·"
                        f"{self.hidden:,}·{self.act} B")

    def _cp_term(self, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
        c = layout.cp
        if c == 1:
            return None
        m, b, s = self._tokens(layout, replica)
        kv = max(1, self.kv_heads // layout.tp)
        z = 2 * b * s * kv * self.head_dim * self.act
        layers = len(stage.layers)
        count = 3 + (1 if self.checkpointing else 0)
        value = m * layers * count * (c - 1) * z
        return CommTerm("cp", "context parallel: ring attention's K and V passed round the ring, forward; K, V and "
                              "their gradients, backward", value, f"m · L · {count} · (cp−1) · 2·b·s·kv·hd·a",
                        f"{m} × {layers} layers × {count} × {c - 1} × 2·{b}·{s:,}·{kv}·{self.head_dim}·{self.act} B")


def derivation_words(key: tuple) -> str:
    """A derivation_key in words: 'tp 2 with sequence parallel, FSDP2 over 4, batch 2 and up'."""
    kind, *rest, regime = key
    if kind == "rank":
        degree, shard, tp, sp = rest
        parts = [f"tp {tp}" + (" with sequence parallel" if sp else "") if tp > 1 else "one rank"]
        if shard != "none":
            parts.append(f"FSDP2 over {degree}")
    elif kind == "experts":
        parts = [f"ep {rest[0]}"]
    elif kind == "context":
        parts = [f"cp {rest[0]}"]
    else:
        parts = ["one device"]
    parts.append("batch 1" if regime == 1 else "batch 2 and up")
    return ", ".join(parts)


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _words(err: Exception) -> str:
    """An engine's refusal as the layout's reason: its first line, whole (a reason cut short reads as another)."""
    return str(err).split("\n")[0]


def _sorted(candidates: list[Candidate]) -> tuple[tuple[Candidate, ...], tuple[Candidate, ...]]:
    fitting = sorted((c for c in candidates if c.fits),
                     key=lambda c: (c.seconds, c.comm_bytes, c.peak, c.layout.tp, c.layout.pp, c.layout.cp,
                                    c.layout.ep))
    rest = sorted((c for c in candidates if not c.fits), key=lambda c: (c.peak, c.layout.tp,
                                                                        c.layout.pp, c.layout.cp, c.layout.ep))
    return tuple(fitting), tuple(rest)


def search(report: Any, view: Any, options: SearchOptions, flops_check: Any = None) -> LayoutSearch | None:
    """The search on a model's report and view; None where a layout's memory needs the built module (the caller
    builds and asks again). `flops_check`: the FLOPs' engine check (engine_check.CheckFor), as `flops` reads it."""
    from ..dims import text_config
    from ..memory.serving import step_length
    from ..memory.states import check_optimizer, check_precision, model_states
    from ..memory.training import DEFAULT_TRAINING_SEQ

    began = perf_counter()
    seq, _, notes = step_length(report, text_config(view.config), options.seq, DEFAULT_TRAINING_SEQ)
    state = _Search(report, view, options, seq, flops_check)
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    layouts, refused = state.layouts(options.devices)
    skipped.extend(refused)
    unanswered = bounded = 0
    # lowest lower bound first (as the fewest devices' search), so that where derivations are capped
    # (MAX_DERIVED) they go to the layouts most likely to fit; the table is sorted afterwards
    ranked = sorted((state.bound(layout, replica), i, layout, replica)
                    for i, (layout, replica) in enumerate(_likely_first(layouts)))
    for _, _, layout, replica in ranked:
        result = state.evaluate(layout, replica, until_fit=True)
        if result is None:
            return None
        (candidates if isinstance(result, Candidate) else skipped).append(result)
        if isinstance(result, Skipped):
            bounded += result.bounded
            unanswered += not result.bounded
    state.bounded += bounded
    fitting, not_fitting = _sorted(candidates)
    states = model_states(report.params, precision=check_precision(options.precision),
                          optimizer=check_optimizer(options.optimizer),
                          trainable=frozenset(p.name for p in report.params))
    minimum = _minimum(state, options, states.bytes, fitting, len(layouts) - unanswered - bounded, unanswered)
    if minimum is None:
        return None
    if state.no_pp:
        notes.append(f"no pipeline layouts: {state.no_pp}")
    if any(state._model_parallel.values()):
        notes.append("tensor, context and pipeline parallelism have analytic per-device memory for the Llama-style "
                     "family (Llama, Mistral, Qwen2, Gemma, Gemma-2, Phi-3, Mixtral, Qwen2-MoE); for this class each "
                     "layout is answered as memory --dp D --tp T --pp P --cp C --ep E --sp answers it: a rank's step "
                     "derived from traces of short cuts with the layout applied on torch's fake process group, a "
                     "pipeline's stages replayed from the one-device (or tensor- or expert-parallel rank's) derived "
                     "recipe; a layout memory refuses is named as not answered, with its reason")
    elif fitting or not_fitting:
        notes.append("each layout's peak is the analytic per-device closed form (instant); memory --dp D --zero fsdp "
                     "(no pipeline) answers from a rank derived from traces instead, which also counts FSDP2's "
                     "in-backward buffers (the root unit's unsharded gradients), so its figure can be higher "
                     "(llama-3-8b, 8 × H100, 512 tokens: dp 8 34.37 GiB here, 36.19 GiB derived and traced); a "
                     "layout near the GPU's limit is worth memory's answer")
    if state.spent or state.not_derived:
        made = [derivation_words(key) for key in state.derived if key[0] != "device"]
        notes.append(f"ranks' steps derived from traces for this search (or read from the cache): {state.spent} of at "
                     f"most {MAX_DERIVED}" + (f" ({'; '.join(made)})" if made else "")
                     + (f"; {state.not_derived:,} layouts (of {options.devices:,} devices and of the counts the "
                        f"fewest devices' search tried) needed another and were not derived"
                        if state.not_derived else ""))
    return LayoutSearch(state.accelerator.name, state.accelerator.memory, options.reserve, state.peak,
                        state.peak_dtype, options.devices, options.total_batch, seq, options.precision,
                        options.optimizer, options.grad_checkpointing, state.shard,
                        options.schedule or ("interleaved" if options.virtual_stages > 1 else "1f1b"),
                        options.virtual_stages, fitting, not_fitting, tuple(skipped), minimum, state.evaluated,
                        tuple(notes), perf_counter() - began)


def _minimum(state: _Search, options: SearchOptions, states_bytes: int, fitting: tuple[Candidate, ...],
             at_n: int, unanswered_at_n: int = 0) -> Minimum | None:
    """The fewest devices whose layouts (at the same global batch) fit, every count from 1 up to `limit`.

    A count whose model states alone, spread evenly over all its devices, exceed the GPU is passed over without a
    layout tried (no layout can beat the even spread): the counts below `floor`. The others' layouts are tried,
    lowest lower bound first (ties: most model-parallel first), until one fits; those whose bound exceeds the GPU
    are passed over unevaluated (they cannot fit: the bound is part of their peak). Powers of two first (and N,
    already answered): the first that fits bounds the answer from above; then every count below it, upward from the
    floor, until one fits. A count that does not fit costs all its layouts under the GPU on their bound, so this
    second pass stops once it has evaluated MIN_BUDGET layouts: the answer is then the power of two, and the counts
    left are named."""
    limit = min(MAX_DEGREE, MIN_BEYOND * options.devices)
    floor = max(1, -(-states_bytes // state.capacity)) if state.capacity > 0 else limit + 1
    tried: dict[int, DeviceCount] = {}
    found: dict[int, Candidate] = {}
    spent = [0]  # layouts the second pass has tried

    def look(count: int, bounded: bool) -> bool | None:
        """Try one count; False where the second pass's budget ran out inside it, None where the build is needed."""
        if count == options.devices:
            aside = f" ({unanswered_at_n:,} not answered)" if unanswered_at_n else ""
            if fitting:
                tried[count] = DeviceCount(count, "fits", at_n, f"{len(fitting)} of its layouts fit", unanswered_at_n)
                found[count] = fitting[0]
            else:
                tried[count] = DeviceCount(count, "none fits", at_n, f"none of its {at_n} answered layouts "
                                                                     f"fits{aside}", unanswered_at_n)
            return True
        layouts, _ = state.layouts(count)
        done = skipped = 0
        ranked = [(state.bound(layout, replica), i, layout, replica)
                  for i, (layout, replica) in enumerate(_likely_first(layouts))]
        hopeless = sum(1 for b, *_ in ranked if b > state.capacity)
        state.bounded += hopeless
        for _, _, layout, replica in sorted(item for item in ranked if item[0] <= state.capacity):
            if bounded:
                if spent[0] >= MIN_BUDGET:
                    return False
                spent[0] += 1
            result = state.evaluate(layout, replica, until_fit=True)
            if result is None:
                return None
            if isinstance(result, Skipped):
                skipped += 1
                continue
            done += 1
            if result.fits:
                tried[count] = DeviceCount(count, "fits", done, f"{result.layout.words()} fits", skipped)
                found[count] = result
                return True
        aside = ", ".join(part for part in (f"{hopeless} passed over on their bound" if hopeless else "",
                                            f"{skipped} not answered" if skipped else "") if part)
        tried[count] = DeviceCount(count, "none fits" if layouts else "no layout", done,
                                   f"none of its {len(layouts)} layouts fits" + (f" ({aside})" if aside else "")
                                   if layouts else "no layout divides the global batch", skipped)
        return True

    probes = sorted({1 << k for k in range(limit.bit_length()) if floor <= 1 << k <= limit}
                    | ({options.devices} if floor <= options.devices <= limit else set()))
    bound = None
    for count in probes:
        if look(count, False) is None:
            return None
        if count in found:
            bound = count
            break
    top = bound if bound is not None else limit + 1
    untried = None
    for count in range(floor, top):
        if count in tried:
            continue
        outcome = look(count, True)
        if outcome is None:
            return None
        if outcome is False:  # the budget ran out inside this count: it and the rest below the bound are open
            untried = (count, top - 1)
            break
        if count in found:
            break
    devices = min(found) if found else None
    listed = tuple(tried[c] for c in sorted(tried) if devices is None or c <= devices)
    return Minimum(devices, found.get(devices) if devices is not None else None, limit, listed,
                   min(floor, limit + 1), untried, MIN_BUDGET, state.bounded,
                   sum(t.unanswered for t in listed if t.devices != devices))


def _likely_first(layouts: list[tuple[ParallelLayout, int]]) -> list[tuple[ParallelLayout, int]]:
    """The layouts in the order most likely to fit first: the most model parallelism (its memory is cut most), pp
    before tp before cp at equal degree."""
    return sorted(layouts, key=lambda item: (-(item[0].tp * item[0].pp * item[0].cp), -item[0].pp, -item[0].tp,
                                             -item[0].ep))


def find_layouts(model: Any, options: SearchOptions, use_cache: bool = True,
                 **model_options: Any) -> tuple[Any, LayoutSearch, Any]:
    """(the model's Report, the LayoutSearch, the ModelView it read): from the template and cost facts where they
    answer, else from the meta build."""
    from ...api import as_source
    from ..engine_check import CheckFor
    from ..facts.store import answer_from_facts_or_build, facts_key
    from ..flops.check import check_flops
    from ..memory.states import check_precision, weight_dtype

    options.check()
    dtype = weight_dtype(check_precision(options.precision))
    source = as_source(model, model_options.pop("revision", None))
    key = facts_key(source.config, model_class=model_options.get("model_class"), task=model_options.get("task"),
                    num_labels=model_options.get("num_labels"))
    checked = CheckFor("flops", key, use_cache, check_flops)
    report, view, result = answer_from_facts_or_build(
        source, lambda report, view: search(report, view, options, checked),
        why_none=lambda report, view: "a layout's memory needs a traced step, which needs the build",
        dtype=dtype, use_cache=use_cache, **model_options)
    if result is None:
        raise UnsupportedError("the layout search needs each layout's memory without a full trace; {cls} has none "
                               "here", cls=view.class_name)
    return report, result, view


__all__ = ["Candidate", "CommTerm", "DeviceCount", "LayoutSearch", "Minimum", "SearchOptions", "Skipped",
           "candidate_settings", "divisors", "find_layouts", "peak_for", "search"]
