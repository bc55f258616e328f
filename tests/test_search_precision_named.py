"""--find-layout's header names how its mixed precision ran: under FSDP2 the MixedPrecisionPolicy by default (bf16
gathers, fp32 reduce-scatters, no autocast), which "bf16-mixed" alone would read as torch.autocast; the JSON keeps
it as layout_search.fsdp_mixed_precision."""

from __future__ import annotations

import paramscope
from paramscope.render.layout_search import layout_search_to_dict, render_layout_search_text

POLICY = "bf16-mixed as FSDP2's MixedPrecisionPolicy where it shards over more than one rank"


def _search(**asked):
    return paramscope.find_layout("llama-3-8b", paramscope.SearchOptions(devices=2, gpu="h100", seq=128,
                                                                          context_parallel=False, **asked))


def test_the_header_names_the_policy_and_autocast_stays_plain():
    policy, autocast = _search(), _search(fsdp_mixed_precision="autocast")
    text = " ".join(render_layout_search_text(policy.report, policy, width=400).split())
    assert POLICY + " (--fsdp-mixed-precision autocast for torch.autocast)" in text
    assert POLICY not in " ".join(render_layout_search_text(autocast.report, autocast, width=400).split())
    assert (layout_search_to_dict(policy)["fsdp_mixed_precision"],
            layout_search_to_dict(autocast)["fsdp_mixed_precision"]) == ("policy", "autocast")
