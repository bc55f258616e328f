"""The ranks' steps a search derives from traces for a class without the analytic per-device recipe, and their cap.

FSDP's degree cannot be composed from one derivation (a rank's step moves by more than its states from one degree to
the next), so each layout is asked exactly what memory asks: a derived recipe keyed as memory keys it
(derivation_key). Each new one costs a few traces of short cuts, so a search makes at most MAX_DERIVED, lowest bound
first (context parallel layouts last); the layouts that would need another are named as not derived."""

from __future__ import annotations

from .layout import ParallelLayout

MAX_DERIVED = 12  # ranks' steps a search derives from traces for a class without the analytic per-device recipe,
# at most (each a few traces of short cuts on torch's fake process group: GPT-2 at 1,024 tokens 13-28 s cold on 2
# busy cores, under 2 s once cached); the layouts that would need another are named as not derived. 12: Mixtral-8x7B
# on 16 H100s needs its tp 2, 4 and 8 ranks (pipeline and FSDP) beside its ep ranks to reach its fastest layout
# (dp 1 · tp 8 · pp 2) and its fewest devices (12); at 8 they went to the ep ranks first


def derivation_key(layout: ParallelLayout, replica: int, experts: int) -> tuple | None:
    """The derived recipe a class without the analytic per-device recipe needs for the layout, as memory asks the
    cache for it (the traced layout and the batch regime, 1 or 2 and up; the sequence is the search's): a pipeline's
    stages replay the tensor- or expert-parallel rank's recipe (or one device's) at the microbatch, without FSDP; a
    rank without a pipeline is derived at the replica's batch with FSDP's degree, or alone with its context-parallel
    share (beside tp and FSDP2 over dp × cp, as torchtitan composes them). None where memory derives nothing more
    (data or expert parallel alone: the one-device step) or refuses the layout first (cp beside routed experts
    under a pipeline); a pipeline beside cp replays the cp rank's recipe at dp 1.
    `experts`: the class's routed experts. Under an expert load the key holds the load: the busiest rank's recipe
    is another derivation."""
    key = _autocast_key(layout, replica, experts)
    if key is None or layout.fsdp_mixed_precision != "policy" or key[0] == "device":
        return key
    # FSDP2's MixedPrecisionPolicy keys another recipe (the traced layout holds it: with_mixed_precision), so a
    # policy rank and an autocast one are never the same derivation: "policy" before the regime
    return key[:-1] + ("policy", key[-1])


def _autocast_key(layout: ParallelLayout, replica: int, experts: int) -> tuple | None:
    """derivation_key without the policy's mark: under the policy a pipeline's stages replay the policy's FSDP2 rank
    (pipeline_replay.policy_rank_layout), none beside cp or routed experts (memory refuses those first)."""
    load = layout.expert_load
    if layout.pp > 1 and layout.fsdp_mixed_precision == "policy" and layout.shard_degree > 1 and \
            layout.shard in ("fsdp", "hsdp"):
        if layout.cp > 1 or layout.ep > 1 and experts:
            return None
        return ("rank", layout.shard_degree, "fsdp", layout.tp, layout.sp, min(2, replica // layout.micro_batches))
    if layout.pp > 1:
        regime = min(2, replica // layout.micro_batches)
        if layout.cp > 1:  # the cp rank's recipe at dp 1 without FSDP2 (beside tp where asked); beside routed
            # experts memory refuses the layout first
            return None if layout.ep > 1 and experts else ("context", layout.cp, 1, layout.tp, layout.sp, regime)
        if layout.ep > 1 and experts:  # the expert-parallel rank's recipe (the busiest's under a load), with tp
            # beside it where asked
            return ("experts", layout.ep, layout.tp, layout.sp, "none", load, regime)
        return ("rank", 1, "none", layout.tp, layout.sp, regime) if layout.tp > 1 else ("device", regime)
    regime = min(2, replica)
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    if layout.ep > 1 and (layout.cp == 1 or layout.expert_load != 1):
        return _expert_rank_key(layout, experts, fsdp, regime)
    if layout.cp > 1:
        degree = layout.shard_degree if fsdp else 1
        if layout.ep > 1 and experts:  # the ring's rank beside ep (ep = dp_shard_in_ep × cp), unless memory refuses it
            from ...errors import UnsupportedError
            from .estimate import check_ring_beside_experts
            try:
                check_ring_beside_experts(layout)
            except UnsupportedError:
                return None
            return ("context", layout.cp, degree, layout.tp, layout.sp, layout.ep, regime)
        return ("context", layout.cp, degree, layout.tp, layout.sp, regime)
    if not fsdp and layout.tp == 1:
        return None
    return ("rank", layout.shard_degree if fsdp else 1, "fsdp" if fsdp else "none", layout.tp, layout.sp, regime)


def _expert_rank_key(layout: ParallelLayout, experts: int, fsdp: bool, regime: int) -> tuple | None:
    """An expert-parallel rank without a pipeline, as estimate.layout_device derives it: the busiest rank under a
    load (beside tp, or under FSDP2), the balanced (ep, tp) rank beside tp without FSDP2, the balanced FSDP2 rank
    beside tp or not (torchtitan's (dp / ep, ep, tp) mesh: each FSDP2 degree a derivation of its own, "fsdp D" in
    the key); None where memory derives nothing more (ep beside DDP or ZeRO 1-2 alone, balanced: one device's step)
    or refuses the layout first (check_expert_load: a load beside cp, DeepSpeed's ZeRO-3, hybrid sharding), so the
    search names memory's reason rather than spending a derivation."""
    if not experts:
        return None
    shard = f"fsdp {layout.shard_degree}" if fsdp and layout.shard == "fsdp" else "none"
    if layout.expert_load != 1:
        if layout.cp > 1 or layout.zero_stage == 3 and layout.shard != "fsdp":
            return None
        return ("experts", layout.ep, layout.tp, layout.sp, shard, layout.expert_load, regime)
    if layout.cp == 1 and shard != "none":
        return ("experts", layout.ep, layout.tp, layout.sp, shard, 1.0, regime)
    if layout.tp > 1 and layout.cp == 1 and not fsdp and layout.zero_stage != 3:
        return ("experts", layout.ep, layout.tp, layout.sp, "none", 1.0, regime)
    return None


def derivation_words(key: tuple) -> str:
    """A derivation_key in words: 'tp 2 with sequence parallel, FSDP2 over 4, batch 2 and up'; a policy's key
    'FSDP2 over 4 under its MixedPrecisionPolicy'."""
    policy = "policy" in key[:-1]
    kind, *rest, regime = tuple(k for k in key if k != "policy") if policy else key
    if kind == "rank":
        degree, shard, tp, sp = rest
        parts = [_tp_words(tp, sp) if tp > 1 else "one rank"]
        if shard != "none":
            parts.append(f"FSDP2 over {degree}")
    elif kind == "experts":
        ep, tp, sp, shard, load = rest
        degree = int(shard.split()[-1]) if shard != "none" else ep
        parts = [f"ep {ep}"] + ([_tp_words(tp, sp)] if tp > 1 else []) + \
            ([f"FSDP2{f' over {degree}' if degree != ep else ''}"] if shard != "none" else []) + \
            ([f"the busiest rank at {load:g}× its share"] if load != 1 else [])
    elif kind == "context":
        cp, degree, tp, sp, *ep = rest
        parts = [f"cp {cp}"] + ([_tp_words(tp, sp)] if tp > 1 else []) + \
            ([f"FSDP2 over dp × cp = {degree}"] if degree > 1 else []) + [f"ep {e} over dp × cp" for e in ep]
    else:
        parts = ["one device"]
    if policy:
        parts.append("under FSDP2's MixedPrecisionPolicy")
    parts.append("batch 1" if regime == 1 else "batch 2 and up")
    return ", ".join(parts)


def _tp_words(tp: int, sp: bool) -> str:
    return f"tp {tp}" + (" with sequence parallel" if sp else "")


class Derivations:
    """The derived recipes a search asked for, in the order asked, and the layouts the cap left underived."""

    def __init__(self) -> None:
        self.made: list[tuple] = []  # derivation keys, one-device steps included
        self.not_derived = 0  # layouts passed over because the MAX_DERIVED derivations were spent

    @property
    def spent(self) -> int:
        """The derivations counted against MAX_DERIVED: the ranks' (tensor, expert, context parallel or FSDP), not
        the one-device steps (every answer of the class needs those; a pipeline's stages replay them)."""
        return sum(1 for key in self.made if key[0] != "device")

    @property
    def exhausted(self) -> bool:
        return self.spent >= MAX_DERIVED

    def note(self, devices: int) -> str | None:
        """The search's note on what it derived and what the cap left; None where it derived no rank."""
        if not (self.spent or self.not_derived):
            return None
        made = [derivation_words(key) for key in self.made if key[0] != "device"]
        return (f"ranks' steps derived from traces for this search (or read from the cache): {self.spent} of at "
                f"most {MAX_DERIVED}" + (f" ({'; '.join(made)})" if made else "")
                + (f"; {self.not_derived:,} layouts (of {devices:,} devices and of the counts the fewest devices' "
                   f"search tried) needed another and were not derived" if self.not_derived else ""))
