"""The layouts the search tries on a number of devices, and the order it tries them in.

dp · tp · pp · cp = N: tp among the degrees the sharding rules accept (heads, KV heads, widths), pp ≤ the layers
(× virtual stages), cp dividing the sequence, ep dividing the routed experts and dp × cp (each ep > 1 layout with
the options' expert load: its busiest rank); the global batch G fixed,
so dp must divide it (each replica G / dp sequences; under a pipeline, microbatches of one sequence). A degree the
rules or the batch refuse is a Skipped with the reason; more pipeline stages than layers is no layout at all."""

from __future__ import annotations

from math import gcd

from ...errors import OptionError
from ..memory.states import check_master_layout, check_precision
from .layout import ParallelLayout, layout_for
from .layout_facts import ModelFacts
from .search_result import Skipped


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def refusal_words(err: Exception) -> str:
    """An engine's refusal as the layout's reason: its first line, whole (a reason cut short reads as another)."""
    return str(err).split("\n")[0]


def candidate_layouts(facts: ModelFacts, devices: int) -> tuple[list[tuple[ParallelLayout, int]], list[Skipped]]:
    """((layout, replica batch) for every layout of `devices` the options allow, the ones refused)."""
    options = facts.options
    batch = options.total_batch
    virtual = options.virtual_stages
    schedule = options.schedule or ("interleaved" if virtual > 1 else "1f1b")
    out, skipped = [], []
    for tp in divisors(devices):
        refused = facts.placements(tp, 1)
        if isinstance(refused, OptionError):
            skipped.append(Skipped(devices // tp, tp, 1, 1, 1, refusal_words(refused)))
            continue
        for pp in divisors(devices // tp):
            if pp > 1 and facts.no_pp:
                skipped.append(Skipped(devices // tp // pp, tp, pp, 1, 1, facts.no_pp))
                continue
            if pp > 1 and pp * virtual > facts.layers:
                continue  # more stages than layers: not a layout
            for cp in divisors(devices // tp // pp):
                if cp > 1 and not options.context_parallel:
                    continue
                dp = devices // tp // pp // cp
                if cp > 1 and facts.seq % cp:
                    skipped.append(Skipped(dp, tp, pp, cp, 1, f"cp {cp} does not divide the sequence, "
                                                               f"{facts.seq:,} tokens"))
                    continue
                if batch % dp:
                    skipped.append(Skipped(dp, tp, pp, cp, 1, f"dp {dp} does not divide the global batch, "
                                                               f"{batch:,} sequences"))
                    continue
                replica = batch // dp
                for ep in divisors(gcd(facts.experts, dp * cp)) if facts.experts else [1]:
                    if facts.shard == "hsdp" and options.shard_group and (dp * cp) % options.shard_group:
                        skipped.append(Skipped(dp, tp, pp, cp, ep, f"the shard group {options.shard_group} "
                                                                   f"does not divide dp × cp = {dp * cp}"))
                        continue
                    try:  # an expert load F above ep (every pair on the busiest rank) is no layout of that ep
                        layout = layout_for(
                            dp=dp, zero=facts.shard, tp=tp, sp=tp > 1, pp=pp, cp=cp, ep=ep, batch=replica,
                            shard_group=options.shard_group if facts.shard == "hsdp" else None,
                            micro_batches=replica if pp > 1 else None, schedule=schedule if pp > 1 else None,
                            virtual_stages=virtual if pp > 1 else 1,
                            expert_load=options.expert_load if ep > 1 else 1.0,
                            # FSDP2's MixedPrecisionPolicy where fully_shard shards (none on one rank)
                            fsdp_mixed_precision=(options.fsdp_mixed_precision if _sharded(facts, dp * cp)
                                                  else "autocast") if facts.shard in ("fsdp", "hsdp") else None)
                        # bf16-master: DeepSpeed's own rules (its PipelineEngine runs ZeRO 0-1, DeepSpeed-MoE 0-2)
                        check_master_layout(check_precision(options.precision), layout)
                    except OptionError as err:
                        skipped.append(Skipped(dp, tp, pp, cp, ep, refusal_words(err)))
                        continue
                    out.append((layout, replica))
    return out, skipped


def _sharded(facts: ModelFacts, ranks: int) -> bool:
    """FSDP2 shards over more than one of the dp × cp `ranks` (hybrid: within a shard group, default 8)."""
    group = (facts.options.shard_group or 8) if facts.shard == "hsdp" else ranks
    return min(ranks, group) > 1


def likely_first(layouts: list[tuple[ParallelLayout, int]]) -> list[tuple[ParallelLayout, int]]:
    """The layouts in the order most likely to fit first: the most model parallelism (its memory is cut most), pp
    before tp before cp at equal degree."""
    return sorted(layouts, key=lambda item: (-(item[0].tp * item[0].pp * item[0].cp), -item[0].pp, -item[0].tp,
                                             -item[0].ep))
