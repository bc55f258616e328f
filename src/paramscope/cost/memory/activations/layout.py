"""The shape every recipe answers in: one family's closed forms at one precision, and the config reads they share.

A recipe returns a `Layout`, or a string naming what of the config it was not fitted for (the report says so and the
step is traced)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """One family's closed forms at one precision: bytes and arithmetic, per layer and outside the layers."""

    layer: int  # a whole layer's saved bytes at this batch and length, without checkpointing
    layer_text: str
    outside: int
    outside_text: str
    hidden: int
    vocab: int
    layers: int
    loss_tv: tuple[int, int] = (0, 0)  # (end of forward, start of backward) extra ·T·V; (0, 0): the usual
    # with checkpointing, (bytes, arithmetic) outside the layers where the arguments the layers are recomputed from
    # (masks, position biases) change them; None: as without
    checkpointed_outside: tuple[int, str] | None = None
    stack: tuple[int, str] | None = None  # (bytes, arithmetic) of all the layers when they differ (encoder-decoders)
    checkpointing: bool = True  # fitted with gradient checkpointing too
    # what is live as the loss is taken, beyond the saved activations and the loss's ·T·V buffers: (bytes, words,
    # whether checkpointed layers keep it too). The model's output holds it until the loss is computed: the last
    # hidden state where the head saved a 16-bit copy, a training KV cache's keys where the attention saved others
    loss_working: tuple[tuple[int, str, bool], ...] = ()
    # what the start of backward holds beyond the saved activations and the loss's ·T·V buffers: (bytes, words), the
    # bytes negative where the loss's backward frees part of what the forward saved before its peak
    backward_start: tuple[tuple[int, str], ...] = ()


def final_hidden_working(kind: str, tokens: int, hidden: int) -> tuple[tuple[int, str, bool], ...]:
    """Under mixed precision the last hidden state stays fp32 (4·T·h) while the head computes on its 16-bit cast,
    which is what backward saved: the model's output holds it until the loss is taken."""
    return ((4 * tokens * hidden, "the last hidden state in fp32, 4·T·h", True),) if kind == "mixed" else ()


def causal_loss_working(kind: str, batch: int, seq: int, hidden: int, layers: int,
                        cached_keys: int) -> tuple[tuple[int, str, bool], ...]:
    """What a causal LM (transformers' ForCausalLMLoss) holds beside its saved activations as its loss is taken:
    - the labels padded by one position, int64 B·(S + 1); at batch 1 the shifted labels nll_loss saves are a view of
      them, so only their one element beyond the 8·T the saved activations count (traced: the end of forward was
      8·S B over one device's trace at batch 1 with the whole padded labels);
    - the loss and the total weight nll_loss saves for its backward, two fp32 scalars, 8 B (traced: the causal
      recipes' end of forward was 8 B under one device's trace without them; BERT's masked LM counts its own);
    - under mixed precision, the final norm's fp32 output 4·T·h (the head saved its 16-bit cast) and, without
      checkpointing (which turns the cache off), the training KV cache's keys: RoPE leaves them fp32 (its cos and
      sin take the fp32 residual stream's dtype) where sdpa saved their 16-bit cast, `cached_keys` elements a token
      in each of the `layers` layers (0 where the cache holds only what attention saved)."""
    tokens = batch * seq
    # at batch 1 the shifted labels are a view of the padded ones (contiguous() returns a (1, S) slice as it is,
    # its leading stride being moot), so the pad adds only its one element to the 8·T the saved activations count
    padded = (8 * batch * (seq + 1), "the labels padded by one, 8·B·(S + 1)", True) if batch > 1 else \
        (8, "the labels padded by one, of which the shifted labels are a view at batch 1: its one element more", True)
    parts = [padded,
             (8, "the loss and nll_loss's total weight, two fp32 scalars", True),
             *final_hidden_working(kind, tokens, hidden)]
    if kind == "mixed" and cached_keys:
        parts.append((layers * 4 * tokens * cached_keys,
                      f"the training KV cache's fp32 keys, {layers} layers × 4·T·kv", False))
    return tuple(parts)


def causal_backward_start(batch: int, seq: int) -> tuple[tuple[int, str], ...]:
    """A causal LM's start of backward beyond its saved activations and the loss's 8·T·V: nll_loss's backward makes
    the log-softmax's gradient (4·T·V), then frees what it saved, the shifted labels (int64, 8·T; counted in the
    saved activations) and the total weight, before log-softmax's backward makes the logits' gradient (4·T·V), the
    moment's peak; the loss and the gradient backward starts from, two fp32 scalars, are held beside. Traced: the
    recipe's start of backward was 8·T − 8 B over one device's timeline without these (Llama, Qwen2, Gemma, Gemma-2,
    Phi-3, Mixtral, Qwen2-MoE, GPT-2, GPT-NeoX, GPT-J; fp32, bf16-mixed, bf16-pure, checkpointed or not)."""
    labels = 8 * batch * seq
    return ((-labels, f"the shifted labels nll_loss's backward frees first, 8·T = {labels:,}"),
            (8, "the loss and its gradient, two fp32 scalars, 8"))


def encoder_output_working(kind: str, tokens: int, hidden: int) -> tuple[tuple[int, str, bool], ...]:
    """An encoder-decoder under mixed precision: the encoder's fp32 output (4·T·h), which cross-attention read as
    16-bit casts, held by the model's output as the loss is taken; checkpointed decoder layers save it as their
    input, so it is counted there instead."""
    return ((4 * tokens * hidden, "the encoder's fp32 output 4·T·h, which cross-attention read as 16-bit casts",
             False),) if kind == "mixed" else ()


