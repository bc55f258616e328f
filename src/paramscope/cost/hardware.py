"""Accelerators by name and memory: the "fits on" table and `--gpu NAME`.

Capacities are the vendors' nominal figures, read as binary gigabytes (an "80 GB" H100 holds 80 GiB of HBM). The
driver shows a little less (an H100 80GB reports 81,559 MiB) and the CUDA context and the allocator's
fragmentation take more; paramscope keeps those out of its allocator-level figures and shows them as a separate,
settable reserve (`--reserve`).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..errors import OptionError

GiB = 2**30


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory: int  # bytes, nominal
    vendor: str
    kind: str  # "datacenter" | "workstation" | "consumer"


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("RTX 3060", 12 * GiB, "NVIDIA", "consumer"),
    Accelerator("RTX 4070", 12 * GiB, "NVIDIA", "consumer"),
    Accelerator("RTX 4080", 16 * GiB, "NVIDIA", "consumer"),
    Accelerator("T4", 16 * GiB, "NVIDIA", "datacenter"),
    Accelerator("V100 16GB", 16 * GiB, "NVIDIA", "datacenter"),
    Accelerator("TPU v5e", 16 * GiB, "Google", "datacenter"),
    Accelerator("RTX 3090", 24 * GiB, "NVIDIA", "consumer"),
    Accelerator("RTX 4090", 24 * GiB, "NVIDIA", "consumer"),
    Accelerator("A10G", 24 * GiB, "NVIDIA", "datacenter"),
    Accelerator("L4", 24 * GiB, "NVIDIA", "datacenter"),
    Accelerator("RTX 5090", 32 * GiB, "NVIDIA", "consumer"),
    Accelerator("V100 32GB", 32 * GiB, "NVIDIA", "datacenter"),
    Accelerator("TPU v6e", 32 * GiB, "Google", "datacenter"),
    Accelerator("A100 40GB", 40 * GiB, "NVIDIA", "datacenter"),
    Accelerator("RTX A6000", 48 * GiB, "NVIDIA", "workstation"),
    Accelerator("RTX 6000 Ada", 48 * GiB, "NVIDIA", "workstation"),
    Accelerator("L40S", 48 * GiB, "NVIDIA", "datacenter"),
    Accelerator("A100 80GB", 80 * GiB, "NVIDIA", "datacenter"),
    Accelerator("H100 80GB", 80 * GiB, "NVIDIA", "datacenter"),
    Accelerator("H100 NVL", 94 * GiB, "NVIDIA", "datacenter"),
    Accelerator("TPU v5p", 95 * GiB, "Google", "datacenter"),
    Accelerator("RTX PRO 6000", 96 * GiB, "NVIDIA", "workstation"),
    Accelerator("GH200", 96 * GiB, "NVIDIA", "datacenter"),
    Accelerator("Gaudi 3", 128 * GiB, "Intel", "datacenter"),
    Accelerator("MI250X", 128 * GiB, "AMD", "datacenter"),
    Accelerator("H200", 141 * GiB, "NVIDIA", "datacenter"),
    Accelerator("B200", 180 * GiB, "NVIDIA", "datacenter"),
    Accelerator("MI300X", 192 * GiB, "AMD", "datacenter"),
    Accelerator("MI325X", 256 * GiB, "AMD", "datacenter"),
    Accelerator("B300", 288 * GiB, "NVIDIA", "datacenter"),
    Accelerator("MI355X", 288 * GiB, "AMD", "datacenter"),
)

# Dense peak matmul throughput in TFLOP/s (no 2:4 sparsity), from the vendors' datasheets, for the dtypes a
# training or serving run computes in; bf16 and fp16 tensor-core rates with fp32 accumulation where the vendor
# gives both. Cards left out have no figure here: `--peak-tflops` gives one.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "T4": {"fp16": 65.0},
    "V100 16GB": {"fp16": 125.0},
    "V100 32GB": {"fp16": 125.0},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp8": 242.0},
    "A100 40GB": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0},
    "A100 80GB": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0},
    "RTX A6000": {"bf16": 154.8, "fp16": 154.8},
    "RTX 6000 Ada": {"bf16": 364.2, "fp16": 364.2, "fp8": 728.5},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "fp8": 733.0},
    "H100 80GB": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    # HGX B300 datasheet: 8 GPUs give 36 PF bf16 and 72 PF fp8 with sparsity, the same per GPU as B200 (B300's
    # gain is fp4); dense is half
    "B300": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    "MI250X": {"bf16": 383.0, "fp16": 383.0},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "MI325X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "MI355X": {"bf16": 2516.6, "fp16": 2516.6, "fp8": 5033.2},  # AMD Instinct MI355X page, dense
    "TPU v5e": {"bf16": 197.0},
    "TPU v5p": {"bf16": 459.0},
    "TPU v6e": {"bf16": 918.0},
    "Gaudi 3": {"bf16": 1835.0},
}


# Memory bandwidth in GB/s (10^9 B/s), the vendors' datasheet figures for each card's memory (HBM or GDDR), the
# rate a roofline's memory side divides bytes by (`serve`). The SXM/OAM part where a name covers both forms, as
# the peak table reads it: H100 80GB SXM 3,350 (PCIe 2,000), A100 80GB SXM 2,039 (PCIe 1,935). Sources: NVIDIA's
# datasheets (H100, H200, H100 NVL, GH200, A100, L40S, L4, A10, T4, V100, RTX 6000 Ada, RTX A6000, RTX PRO 6000,
# HGX B200/B300) and GeForce specification pages (RTX 3060/3090/4070/4080/4090/5090); AMD's Instinct MI250X,
# MI300X, MI325X and MI355X pages; Google Cloud's TPU v5e/v5p/v6e system architecture pages; Intel's Gaudi 3
# white paper.
BANDWIDTH_GBPS: dict[str, float] = {
    "RTX 3060": 360.0, "RTX 4070": 504.2, "RTX 4080": 716.8, "T4": 320.0, "V100 16GB": 900.0, "TPU v5e": 819.0,
    "RTX 3090": 936.2, "RTX 4090": 1008.0, "A10G": 600.0, "L4": 300.0, "RTX 5090": 1792.0, "V100 32GB": 900.0,
    "TPU v6e": 1640.0, "A100 40GB": 1555.0, "RTX A6000": 768.0, "RTX 6000 Ada": 960.0, "L40S": 864.0,
    "A100 80GB": 2039.0, "H100 80GB": 3350.0, "H100 NVL": 3900.0, "TPU v5p": 2765.0, "RTX PRO 6000": 1792.0,
    "GH200": 4000.0, "Gaudi 3": 3700.0, "MI250X": 3276.8, "H200": 4800.0, "B200": 8000.0, "MI300X": 5300.0,
    "MI325X": 6000.0, "B300": 8000.0, "MI355X": 8000.0,
}


@dataclass(frozen=True)
class Interconnect:
    """How a GPU of an 8-GPU board talks to the others: its NVLink inside the node, its own network adapter across
    (the rail-optimized cabling of NVIDIA's DGX/HGX clusters: one NIC a GPU). Rates are bytes per second in one
    direction (the links are full duplex: a device sends and receives at once)."""

    gpus_per_node: int
    nvlink: float  # B/s a direction, a GPU, to the node's NVSwitches
    nvlink_words: str  # "NVLink 4, 900 GB/s both directions"
    network: float  # B/s a direction, a GPU, its own NIC to the inter-node fabric
    network_words: str  # "InfiniBand NDR, 400 Gb/s"
    source: str


# The 8-GPU NVLink boards the peak table's SXM figures are read from. NVLink is given by NVIDIA as both directions
# together (H100 "900 GB/s"), so a direction is half; a NIC's Gb/s is bits in one direction (400 Gb/s = 50 GB/s).
# Sources: NVIDIA's A100, H100, H200 and Blackwell datasheets (NVLink per GPU) and the DGX A100 / H100 / H200 /
# B200 / B300 user guides (8 GPUs; one single-port ConnectX adapter a GPU for the compute fabric: ConnectX-6 HDR
# 200 Gb/s on A100, ConnectX-7 NDR 400 Gb/s on H100, H200 and B200, ConnectX-8 800 Gb/s on B300). Cards left out
# (PCIe parts, H100 NVL's NVLink pairs, GH200's NVL32 racks, AMD, TPUs, Gaudi) have no figure: the layout search
# then does not time communication and says so.
GB = 10**9
INTERCONNECTS: dict[str, Interconnect] = {
    name: Interconnect(8, nvlink * GB / 2, words, nic * GB / 8, net, source)
    for name, nvlink, words, nic, net, source in (
        ("A100 40GB", 600, "NVLink 3, 600 GB/s both directions", 200, "InfiniBand HDR, 200 Gb/s",
         "A100 datasheet; DGX A100 user guide (8 × ConnectX-6)"),
        ("A100 80GB", 600, "NVLink 3, 600 GB/s both directions", 200, "InfiniBand HDR, 200 Gb/s",
         "A100 datasheet; DGX A100 user guide (8 × ConnectX-6)"),
        ("H100 80GB", 900, "NVLink 4, 900 GB/s both directions", 400, "InfiniBand NDR, 400 Gb/s",
         "H100 datasheet (SXM); DGX H100 user guide (8 × ConnectX-7)"),
        ("H200", 900, "NVLink 4, 900 GB/s both directions", 400, "InfiniBand NDR, 400 Gb/s",
         "H200 datasheet (SXM); DGX H200 user guide (8 × ConnectX-7)"),
        ("B200", 1800, "NVLink 5, 1.8 TB/s both directions", 400, "InfiniBand NDR, 400 Gb/s",
         "HGX B200 datasheet; DGX B200 user guide (8 × ConnectX-7)"),
        ("B300", 1800, "NVLink 5, 1.8 TB/s both directions", 800, "InfiniBand XDR, 800 Gb/s",
         "HGX B300 datasheet; DGX B300 user guide (8 × ConnectX-8)"),
    )
}


def interconnect(accelerator: Accelerator) -> Interconnect | None:
    """The links of `accelerator` on its 8-GPU board (NVLink inside, a NIC a GPU across), or None when unknown."""
    return INTERCONNECTS.get(accelerator.name)


def bandwidth(accelerator: Accelerator) -> float | None:
    """Memory bandwidth of `accelerator` in bytes per second (datasheet), or None when unknown."""
    value = BANDWIDTH_GBPS.get(accelerator.name)
    return None if value is None else value * 1e9


def peak_flops(accelerator: Accelerator, dtype: str) -> float | None:
    """Dense peak FLOP/s of `accelerator` in `dtype` ("bf16", "fp16", "fp8", "tf32"), or None when unknown."""
    value = PEAK_TFLOPS.get(accelerator.name, {}).get(dtype)
    return None if value is None else value * 1e12


# Names people type for the same card. "a100" and "v100" are no alias: each names two cards whose memory differs
# twice over, so they are refused with both spellings (see find_accelerator).
_ALIASES = {"h100": "H100 80GB", "h100sxm": "H100 80GB", "h100pcie": "H100 80GB", "4090": "RTX 4090",
            "3090": "RTX 3090", "5090": "RTX 5090", "a6000": "RTX A6000", "6000ada": "RTX 6000 Ada", "h200nvl": "H200",
            "b200": "B200", "gaudi3": "Gaudi 3"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia").removeprefix("amd").removeprefix("geforce")


def _spelling(accelerator: Accelerator) -> str:
    """How to type a card on the command line: "A100 40GB" → "a100-40gb"."""
    return accelerator.name.lower().replace(" ", "-")


def find_accelerator(name: str, instead: str | None = "budget") -> Accelerator:
    """The accelerator called `name` ("h100", "RTX 4090", "a100-40gb"); raises naming it when unknown, and when it
    names several cards ("a100": 40GB or 80GB), with their spellings, rather than choosing one silently. `instead`:
    the option the unknown-name message offers in its place ("budget", "peak_tflops"; None: the command needs the
    card itself)."""
    from ..errors import short_repr

    shown = short_repr(str(name), 60)
    key = _key(str(name)[:60]) if len(str(name)) <= 60 else ""
    by_key = {_key(a.name): a for a in ACCELERATORS}
    for alias, target in _ALIASES.items():
        by_key.setdefault(alias, next(a for a in ACCELERATORS if a.name == target))
    for candidate in (key, key.removeprefix("rtx")):
        if candidate in by_key:
            return by_key[candidate]
    variants = [a for a in ACCELERATORS
                if key and any(k.startswith(candidate) for k in (_key(a.name), _key(a.name).removeprefix("rtx"))
                               for candidate in (key, key.removeprefix("rtx")) if candidate)]
    if 1 < len(variants) <= 4:
        cards = " or ".join(f"{a.name} ({_spelling(a)!r})" for a in variants)
        raise OptionError(f"accelerator {shown} names several cards; say which: {cards}")
    close = [_spelling(a) for a in variants] or _nearest(key, by_key) if key else []
    # a unique prefix ("b20") or a near spelling ("h1OO") is suggested, never taken
    hint = f"did you mean {_either(close)}? " if close else ""
    known = ", ".join(a.name for a in ACCELERATORS)
    offer = {"budget": " (or give {0} 24GiB)", "peak_tflops": " (or give {0} X, the peak in TFLOP/s)"}.get(instead, "")
    raise OptionError("unknown accelerator {name}; {hint}known: {known}" + offer, *([instead] if offer else []),
                      name=shown, hint=hint, known=known)


def _nearest(key: str, by_key: dict[str, Accelerator], most: int = 3) -> list[str]:
    """The spellings of up to `most` cards whose names are nearest `key` (difflib's ratio over the keys, aliases
    included, best first), with the letter o read as a zero on both sides: "h1OO" is H100's name typed with O's."""
    def fold(text: str) -> str:
        return text.replace("o", "0")

    folded: dict[str, Accelerator] = {}
    for name, accelerator in by_key.items():
        folded.setdefault(fold(name), accelerator)
    spellings: list[str] = []
    for match in difflib.get_close_matches(fold(key), list(folded), n=len(folded), cutoff=0.7):
        spelling = _spelling(folded[match])
        if spelling not in spellings:
            spellings.append(spelling)
    return spellings[:most]


def _either(spellings: list[str]) -> str:
    """'a', 'a' or 'b', 'a', 'b' or 'c'."""
    quoted = [repr(s) for s in spellings]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f" or {quoted[-1]}"
