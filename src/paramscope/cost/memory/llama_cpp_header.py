"""llama.cpp's hparams from a GGUF header alone, for the architectures llama.cpp runs and transformers has no class
for, where the header is all llama.cpp's memory needs: RWKV-6 and RWKV-7 (rwkv6, rwkv6qwen2, rwkv7, arwkv7).

Every layer of these is recurrent (llama-arch.cpp's llm_arch_is_recurrent): llama_memory_recurrent keeps, for each
layer and each of max(1, n_seq_max) sequences, F32 rows of n_embd_r() + n_embd_s() values (src/llama-hparams.cpp):
n_embd_r = token_shift_count × n_embd (the token-shift states of the time mix and the channel mix; token_shift_count
defaults to 2, llama-hparams.h), n_embd_s = n_embd × wkv_head_size (the WKV state, a head_size × head_size matrix
for each of n_embd / head_size heads). No KV cache. The keys are the ones models/rwkv6.cpp and models/rwkv7.cpp's
load_arch_hparams read: {arch}.block_count, .embedding_length, .wkv.head_size, .token_shift_count (optional),
.feed_forward_length and .context_length.
"""

from __future__ import annotations

from typing import Any

from ...errors import SourceError
from ...errors import short_repr as _q
from .llama_cpp_model import LayerState, LlamaCppModel

HEADER_ONLY = ("rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")
_MAX_LAYERS = 4096
_MAX_WIDTH = 1 << 20
_MAX_CONTEXT = 1 << 24
_MAX_VOCAB = 1 << 24


def header_facts(ck: Any) -> LlamaCppModel:
    """The LlamaCppModel of an RWKV-6/7 GGUF (`ck`, a GGUFCheckpoint) from its metadata, or SourceError naming the
    missing or out-of-range key in one line."""
    arch = ck.architecture
    if arch not in HEADER_ONLY:
        raise SourceError(f"{ck.path}: llama.cpp's memory is read from the header alone only for "
                          f"{', '.join(HEADER_ONLY)}, not {_q(arch)}")

    def value(key: str, bound: int, default: int | None = None, low: int = 1) -> int:
        got = ck.metadata.get(f"{arch}.{key}", default)
        if got is None:
            raise SourceError(f"{ck.path}: cannot size llama.cpp's memory from this GGUF: it has no {arch}.{key}")
        if type(got) is not int or not low <= got <= bound:
            raise SourceError(f"{ck.path}: cannot size llama.cpp's memory from this GGUF: {arch}.{key} = "
                              f"{_q(got)} is no count between {low} and {bound:,}")
        return got

    n_layer = value("block_count", _MAX_LAYERS)
    n_embd = value("embedding_length", _MAX_WIDTH)
    head_size = value("wkv.head_size", n_embd)
    shift = value("token_shift_count", 16, default=2)
    n_ff = value("feed_forward_length", _MAX_WIDTH, default=0, low=0)
    n_ctx_train = value("context_length", _MAX_CONTEXT, default=0, low=0) or None
    vocab = ck.hparams().get("vocab_size")
    if not isinstance(vocab, int):
        rows = {t.name: t.shape for t in ck.tensors}.get("token_embd.weight")
        vocab = rows[0] if rows and len(rows) == 2 else 0
    if not 0 <= vocab <= _MAX_VOCAB:
        raise SourceError(f"{ck.path}: cannot size llama.cpp's memory from this GGUF: a vocabulary of {vocab:,}")
    conv, ssm = shift * n_embd, n_embd * head_size
    how = (f"llama.cpp's {arch} from the GGUF header (no transformers class): every layer recurrent, token shift "
           f"{shift} × n_embd {n_embd:,} = {conv:,} and WKV state n_embd {n_embd:,} × head size {head_size} = "
           f"{ssm:,} values (llama-hparams.cpp n_embd_r / n_embd_s)")
    return LlamaCppModel(n_layer, n_embd, 1, vocab, n_ctx_train, 0, n_ff or 4 * n_embd,
                         (LayerState("recurrent", conv=conv, ssm=ssm),) * n_layer, how)


__all__ = ["HEADER_ONLY", "header_facts"]
