"""vLLM's paged KV cache: a layer's page (the block size a Mamba state raises it to), the layers grouped by spec
(`KVGroup`), the blocks one request holds in a group, a pipeline worker's pool, and vLLM's binary search for the
largest max_model_len. vllm.py's docstring gives the rules and their sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

@dataclass(frozen=True)
class KVGroup:
    """The layers of one KV cache spec, as vLLM groups them (kv_cache_interface.py)."""

    kind: str  # "full attention" | "sliding window 4,096" | "chunked 8,192" | "MLA latent" | "mamba state"
    spec: str  # vLLM's class: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec,
    # MambaSpec
    layers: int
    groups: int  # vLLM's KV cache groups of this kind (layers ÷ group size, rounded up)
    bytes_per_token: int  # one layer, one token (a rank's share); a Mamba layer: its state, a sequence
    token_arithmetic: str  # the project's KV engine's, e.g. "2 × 8 kv heads × 128 × 2 B"; Mamba: vLLM's shapes
    page_bytes: int  # one block of one layer: block_size × bytes_per_token
    window: int | None
    blocks_per_request: int  # at max_model_len, one group of this kind
    blocks_arithmetic: str
    encoder_tokens: int | None = None  # cross-attention: the encoder length every request holds (CrossAttentionSpec)


def vllm_pages(per_layer: int, mamba: tuple[int, str] | None, block_size: int,
               length: int) -> tuple[int, int, list[str]]:
    """(block size, page bytes of one layer, notes) as vLLM settles them: attention alone, block × bytes per token;
    with Mamba layers, HybridAttentionMambaModelConfig raises the attention block to a multiple of 16 (the
    FlashAttention kernel's alignment) whose page holds a state, and pads the state's page to it; Mamba alone, one
    page a state (its block size is max_model_len)."""
    if mamba is None:
        return block_size, block_size * per_layer, []
    state, _ = mamba
    if not per_layer:
        return length, state, [f"Mamba layers alone: one page a sequence's state ({state:,} B), vLLM's Mamba block "
                               f"size being max_model_len ({length:,})"]
    aligned = 16 * -(-state // (16 * per_layer))
    notes = []
    block = block_size
    if block < aligned:
        block = aligned
        notes.append(f"vLLM sets the attention block size to {aligned} tokens (16 × cdiv(state {state:,} B, 16 × "
                     f"{per_layer:,} B a token)) so that an attention page holds a Mamba state "
                     "(HybridAttentionMambaModelConfig.verify_and_update_config)")
    page = block * per_layer
    if page > state:
        notes.append(f"the Mamba state's page is padded from {state:,} B to the attention page, {page:,} B "
                     f"({100 * (page - state) / state:.2f}%), as vLLM pads it")
    return block, page, notes


def vllm_grouping(kinds: list[tuple[str, int | None, int]]) -> tuple[int, list[tuple[str, int | None, int, int]]]:
    """(layers per group, [(kind, window, layers, groups of that kind)]), as _get_kv_cache_groups_uniform_page_size
    splits a hybrid model: the smallest kind's count, or the largest's where it is under 1.5× the smallest."""
    if len(kinds) == 1:
        kind, window, layers = kinds[0]
        return layers, [(kind, window, layers, 1)]
    smallest = min(layers for _, _, layers in kinds)
    largest = max(layers for _, _, layers in kinds)
    size = largest if largest < smallest * 1.5 else smallest
    return size, [(kind, window, layers, -(-layers // size)) for kind, window, layers in kinds]


def vllm_blocks(kind: str, window: int | None, block: int, length: int, batched: int) -> int:
    """Blocks one request of `length` tokens holds in one group of this kind (the spec's max_memory_usage_bytes ÷
    its page). `window`: the sliding window, the attention chunk, or (cross-attention) the encoder length."""
    if kind.startswith("sliding window"):
        return -(-min(window - 1 + batched, length) // block) + 1
    if kind.startswith("chunked"):
        return -(-min(window + batched, length) // block)
    if kind == "mamba state":
        return 1  # the running state (mamba_cache_mode "none": no per-block checkpoints for prefix caching)
    if kind == "cross-attention":  # `window` is the encoder length: CrossAttentionSpec.max_memory_usage_bytes
        return -(-window // block)
    return -(-length // block)


def kv_group(kind: str, window: int | None, layers: int, count: int, per_layer: int, arithmetic: str, page: int,
             block: int, length: int, mamba: tuple[int, str] | None, batched: int) -> KVGroup:
    blocks = vllm_blocks(kind, window, block, length, batched)
    if kind == "mamba state":
        return KVGroup(kind, "MambaSpec", layers, count, mamba[0], mamba[1], page, None, blocks,
                       "1 (the sequence's state)")
    if kind == "cross-attention":
        return KVGroup(kind, "CrossAttentionSpec", layers, count, per_layer, arithmetic, page, None, blocks,
                       f"cdiv(encoder length {window:,}, {block}) = {blocks:,}, whatever max_model_len", window)
    if kind.startswith("sliding window"):
        spec = "SlidingWindowSpec"
        words = (f"cdiv(min(window {window:,} − 1 + max_num_batched_tokens {batched:,}, {length:,}), {block}) + 1 "
                 f"= {blocks:,}")
    elif kind.startswith("chunked"):
        spec = "ChunkedLocalAttentionSpec"
        words = f"cdiv(min(chunk {window:,} + max_num_batched_tokens {batched:,}, {length:,}), {block}) = {blocks:,}"
    else:
        spec = "MLAAttentionSpec" if kind == "MLA latent" else "FullAttentionSpec"
        words = f"cdiv({length:,}, {block}) = {blocks:,}"
    return KVGroup(kind, spec, layers, count, per_layer, arithmetic, page, window, blocks, words)


def largest_length(fits: Any, limit: int) -> int:
    """The largest n in 1..limit with fits(n) (fits only grows harder with n), 0 when not even 1: vLLM's binary
    search."""
    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def worker_group_size(keys: list[list[tuple[str, int | None]]], size: int, start: int, end: int) -> int:
    """Layers a KV pool serves on the worker holding layers start..end − 1: vLLM groups the whole model's layers
    (group i of a kind takes that kind's layers[i::groups], _get_kv_cache_groups_uniform_page_size), projects each
    group onto the worker's layers (_project_kv_cache_groups_to_worker), and a worker's pools are its largest
    projected group (get_kv_cache_config_from_groups)."""
    by_kind: dict[tuple[str, int | None], list[int]] = {}
    for index, layer_keys in enumerate(keys):
        for key in layer_keys:
            by_kind.setdefault(key, []).append(index)
    shares = []
    for indices in by_kind.values():
        count = -(-len(indices) // size)
        shares.extend(sum(start <= i < end for i in indices[g::count]) for g in range(count))
    return max(shares) if shares else 0
