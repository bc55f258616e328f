"""The time a layout's communication takes at least, from its bytes (layout_comm.py) over the links they cross: the
layout search's step-time bound puts it beside the compute bound.

Placement (the convention): devices numbered node by node, gpus_per_node a node (hardware.Interconnect), and a
layout's ranks laid out as torchtitan's device mesh and Megatron's default order lay them: tp innermost, then cp,
then dp, pp outermost (rank = ((stage · dp + d) · cp + c) · tp + t); ep takes the innermost ranks of dp × cp
(torchtitan's dp_shard_in_ep × cp), and the ranks holding the same routed experts are the rest, every ep-th;
under hybrid sharding the shard group is the inner ranks of dp × cp, the replicas the outer. Each kind's group is
then (stride, size) on that numbering: tp (1, tp), cp (tp, cp), ep (tp, ep), dp (tp, dp × cp) and the experts'
(tp · ep, dp × cp / ep).

A group lies inside a node (NVLink) or spans nodes. What each kind puts on the network where its group spans, a
device's share, g the most members a node holds (min(n − 1, ⌈gpus_per_node / stride⌉), the fullest node's: a lower
bound's choice where nodes hold the group unevenly):

    all-gather, reduce-scatter, all-reduce (dp)   (n − g) / (g · (n − 1)) of the ring's bytes: a hierarchical
         collective (inside the node first, then across in g parallel rings of n / g) sends that much across, and
         no algorithm reducing on the GPUs sends less (each node must receive what its members lack, once); g = 1:
         all of it. Reductions in the switches (NVLink SHARP, InfiniBand SHARP) are not modelled: they can move
         about half an all-reduce's bytes (DDP's gradients; FSDP2's and sequence parallel's gathers and
         reduce-scatters gain less), so there the bound is a ring's, not the hardware's
    all-to-all (ep)   (n − g) / (n − 1) of it: the tokens bound for the other nodes' members
    ring attention (cp), pipeline sends (pp)   all of it on a device whose next rank is on another node

Each link carries its kinds one after another, the two links at once: the communication takes at least
max(Σ NVLink bytes / NVLink's rate, Σ network bytes / the NIC's rate).

What may hide under compute (the convention, EXPOSURE): tensor parallel's collectives (each layer's all-reduces, or
sequence parallel's all-gathers and reduce-scatters, forward and backward) sit on the critical path: the next matmul
reads their result. Inside a node they can hide under the matmuls they feed (torchtitan's async TP, Megatron's
--tp-comm-overlap with Transformer Engine's userbuffers: both run the tp group over one node's NVLink), so a lower
bound lets them overlap there; where the tp group spans nodes neither framework overlaps them (Megatron and
torchtitan keep tp inside a node for that reason), so the tp collective's whole time, the slower of its two links
(Σ its NVLink part / NVLink's rate, Σ its network part / the NIC's rate; the collective cannot finish sooner than
either), is exposed: added to compute. Every other kind may overlap: FSDP2's prefetched gathers and its
reduce-scatters, DDP's bucketed all-reduce and ZeRO's, the pipeline's sends, the experts' all-to-all (Megatron's
a2a overlap, DeepSeek's DualPipe: another microbatch's compute) and context parallel's ring (torch's ring attention
and Megatron's / Transformer Engine's cp post the next chunk's K and V exchange before computing the current chunk's
attention, so the ring hides under attention; under attention alone in truth, under any compute in this bound).

The search's step-time bound is max(compute + exposed tp, NVLink, network): the rest perfectly overlapped, so a
lower bound; the no-overlap sum compute + NVLink + network is shown beside it (what a step with no overlap at all
would take at those rates), and is never below it."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ..hardware import Interconnect
from .layout import ParallelLayout
from .comm_term import CommTerm

NVLINK = "NVLink"
NETWORK = "network"


@dataclass(frozen=True)
class TermTime:
    """One kind's bytes on one link, and the time they take there at least."""

    kind: str
    term: int  # the index of its CommTerm among the device's
    link: str  # NVLINK | NETWORK
    bytes: int  # what the link carries of the term (on the network: the share that must cross, floored)
    seconds: float  # bytes / the link's rate a direction: a bound
    why: str  # the group and where it lies, in words
    exposed: bool = False  # on the critical path, not overlapped (tp whose group spans nodes: EXPOSURE)


@dataclass(frozen=True)
class CommTime:
    """A device's communication time at least, by link (Interconnect's rates)."""

    terms: tuple[TermTime, ...]
    nvlink: float  # seconds: every NVLink term's bytes over NVLink's rate
    network: float  # seconds: every network term's bytes over the NIC's rate
    nvlink_bytes: int
    network_bytes: int
    # tp's collectives where its group spans nodes (EXPOSURE): the slower of their NVLink and network parts, seconds;
    # 0 where tp lies inside a node (or there is no tp)
    exposed: float = 0.0
    tp_spans_nodes: bool = False  # this device's stage's tp groups span nodes (its tp terms exposed)

    @property
    def seconds(self) -> float:
        """The two links at once: the slower."""
        return max(self.nvlink, self.network)

    @property
    def serial(self) -> float:
        """The two links one after the other."""
        return self.nvlink + self.network


def comm_time(layout: ParallelLayout, terms: tuple[CommTerm, ...], stage: int | None,
              links: Interconnect) -> CommTime:
    """The communication time of the device whose terms these are (pipeline stage `stage`'s), on `links`."""
    place = _Placement(layout, stage or 0, links.gpus_per_node)
    spans = layout.tp > 1 and place.spans(1, layout.tp)  # this stage's tp groups: their bytes split on both links
    out: list[TermTime] = []
    for index, term in enumerate(terms):
        for link, size, why in place.split(term):
            rate = links.nvlink if link == NVLINK else links.network
            out.append(TermTime(term.kind, index, link, size, size / rate, why, spans and term.kind == "tp"))
    nvlink = sum(t.bytes for t in out if t.link == NVLINK)
    network = sum(t.bytes for t in out if t.link == NETWORK)
    exposed = max(sum(t.bytes for t in out if t.exposed and t.link == NVLINK) / links.nvlink,
                  sum(t.bytes for t in out if t.exposed and t.link == NETWORK) / links.network)
    return CommTime(tuple(out), nvlink / links.nvlink, network / links.network, nvlink, network, exposed, spans)


class _Placement:
    """Where a stage's groups lie on the nodes (the module docstring's numbering)."""

    def __init__(self, layout: ParallelLayout, stage: int, gpus_per_node: int) -> None:
        self.layout = layout
        self.node = gpus_per_node
        self.block = layout.dp * layout.cp * layout.tp  # a stage's ranks
        self.start = stage * self.block
        self.stage = stage
        self.one_node = layout.devices <= gpus_per_node

    def split(self, term: CommTerm) -> list[tuple[str, int, str]]:
        """(link, bytes, why) for each part of `term`: a collective over a group that spans nodes puts its share on
        the network and the rest on NVLink (the rest reaches a device from its node's other ranks)."""
        layout = self.layout
        if term.kind == "tp":
            return self._collective(term.bytes, 1, layout.tp, "tp", False)
        if term.kind == "cp":
            return [self._ring(term.bytes, layout.tp, layout.cp, "cp")]
        if term.kind == "ep":
            return self._collective(term.bytes, layout.tp, layout.ep, "ep", True)
        if term.kind == "pp":
            return self._pipeline(term)
        return self._data_parallel(term)

    def _data_parallel(self, term: CommTerm) -> list[tuple[str, int, str]]:
        layout = self.layout
        experts = "(routed experts)" in term.what
        split = layout.ep if experts else 1
        stride = layout.tp * split
        same = layout.dp * layout.cp // split  # ranks holding the same parameters
        name = "dp × cp" + (" / ep (the same experts)" if experts else "")
        if layout.shard != "hsdp" or layout.zero_stage == 0:
            return self._collective(term.bytes, stride, same, name, False)
        n = max(1, layout.shard_degree // split)
        replicas = same // n
        if replicas == 1:
            return self._collective(term.bytes, stride, n, name, False)
        # FSDP2 hybrid: (n−1)/n · (2P + G) inside the shard group, 2(r−1)/r · G/n across the groups, P the gathered
        # bytes between G/2 (16-bit) and G (as trained). The term is one sum, so each part is taken at its least
        # share over that range (across at P = G, inside at P = G/2), floored: together at most the term
        across_share = 2 * (replicas - 1)  # × 1 / (r · n), as the two below
        across = term.bytes * across_share // (3 * replicas * (n - 1) + across_share)
        inside = term.bytes * 2 * replicas * (n - 1) // (2 * replicas * (n - 1) + across_share)
        group = "the shard group" + (" (experts)" if experts else "")
        return [*(self._collective(inside, stride, n, group, False) if n > 1 else []),
                *self._collective(across, layout.tp * layout.shard_degree, replicas, "the replicas' all-reduce",
                                  False)]

    def _collective(self, size: int, stride: int, n: int, name: str,
                    all_to_all: bool) -> list[tuple[str, int, str]]:
        if n <= 1 or not self.spans(stride, n):
            return [(NVLINK, size, f"{name}: {n} ranks inside a node")]
        g = min(n - 1, -(-self.node // stride))  # a spanning group's fullest node holds at most n − 1
        if all_to_all:
            crossing = size * (n - g) // (n - 1)
            how = f"{n - g}/{n - 1} of it to other nodes"
        else:
            crossing = size * (n - g) // (g * (n - 1))
            how = "all of it" if g == 1 else f"(n−g)/(g(n−1)) = {n - g}/{g * (n - 1)} of it, hierarchically"
        parts = [(NETWORK, crossing, f"{name}: {n} ranks across nodes, {g} a node at most; {how}")]
        if crossing < size:  # what the device's own NIC does not carry reaches it over NVLink
            parts.append((NVLINK, size - crossing, f"{name}: the rest, between the {g} ranks a node holds"))
        return parts

    def _ring(self, size: int, stride: int, n: int, name: str) -> tuple[str, int, str]:
        if n <= 1 or not self.spans(stride, n):
            return NVLINK, size, f"{name}: a ring of {n} inside a node"
        return NETWORK, size, f"{name}: a ring of {n} across nodes (a device whose next rank is on another node)"

    def spans(self, stride: int, n: int) -> bool:
        """Whether some group of (stride, n) in this stage's block has members on two nodes. The groups tile the
        block in runs of stride · n ranks (the block starts on a run), so a node boundary inside the block splits a
        group exactly where it falls inside a run."""
        if self.one_node:
            return False
        run = stride * n
        lo, hi = self.start, self.start + self.block  # boundaries q with lo < q < hi
        both = self.node * run // gcd(self.node, run)
        return _multiples(self.node, lo, hi) > _multiples(both, lo, hi)

    def _pipeline(self, term: CommTerm) -> list[tuple[str, int, str]]:
        layout = self.layout
        pp, d = layout.pp, self.stage
        if "tied" in term.what:
            return [self._send(term.bytes, 0, pp - 1, "the tied embedding between the first and last stage")]
        v = layout.virtual_stages
        forward = v - (1 if d == pp - 1 else 0)  # each chunk's output to the next device (wrapping, interleaved)
        backward = v - (1 if d == 0 else 0)
        each = term.bytes // (forward + backward)
        parts = []
        if forward:
            parts.append(self._send(forward * each, d, (d + 1) % pp, "activations to the next stage"))
        if backward:
            parts.append(self._send(backward * each, d, (d - 1) % pp, "gradients to the previous stage"))
        return parts

    def _send(self, size: int, a: int, b: int, name: str) -> tuple[str, int, str]:
        """Stage a's devices sending to stage b's (rank r to r + (b − a) · block): over the network where some
        pair is on two nodes."""
        lo, distance = min(a, b) * self.block, abs(b - a) * self.block
        # a pair (lo + o, lo + o + distance), o < block, crosses where a node boundary falls in (lo + o, lo + o +
        # distance]: some o does where the first boundary above lo is at most lo + block − 1 + distance
        first = (lo // self.node + 1) * self.node
        crosses = not self.one_node and first <= lo + self.block - 1 + distance
        return (NETWORK if crosses else NVLINK), size, f"pp: {name}, " + \
            ("across nodes" if crosses else "inside a node")


def _multiples(m: int, lo: int, hi: int) -> int:
    """Multiples of m strictly between lo and hi."""
    return max(0, (hi - 1) // m - lo // m)


EXPOSURE = ("tp inside a node overlapped (torchtitan's async TP, Megatron's --tp-comm-overlap: both over one node's "
            "NVLink); tp across nodes exposed, added to compute (neither framework overlaps it there); every other "
            "kind overlapped (FSDP2's prefetch, DDP's buckets, pp's sends, ep's all-to-all, cp's ring under "
            "attention)")


def describe(links: Interconnect) -> str:
    """The links in words, with their source."""
    return (f"{links.gpus_per_node} GPUs a node on {links.nvlink_words} ({links.nvlink / 1e9:,.0f} GB/s a "
            f"direction), {links.network_words} a GPU across nodes ({links.network / 1e9:,.0f} GB/s a direction); "
            f"source: {links.source}")


__all__ = ["CommTime", "EXPOSURE", "TermTime", "comm_time", "describe", "NVLINK", "NETWORK"]
