"""Activations of a training step, analytic: what the forward saves for backward, and the peaks around it.

Closed forms in the config's fields for the layouts whose step was traced on fake tensors (traced/step.py) and fitted
exactly over varied configs by bench/fit_activations.py (a layer's bytes: 3 layers minus 2);
tests/test_training_memory.py holds these families' presets to the traced engine: the saved activations within
0.01%, and each phase's peak within 0.1%. T = batch × seq tokens, h = hidden, q = heads × head_dim,
kv = kv_heads × head_dim, i = intermediate, V = vocab, L = layers. The recipes, by module:
    decoders.py (Llama-style, Gemma, Gemma-2, Phi-3, Mixtral, Qwen2-MoE, sliding windows), deepseek.py
    (DeepSeek-V3), gpt.py (GPT-2, GPT-NeoX, GPT-J), encoders.py (BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT,
    ALBERT, DeBERTa-v2), seq2seq.py (T5, BART); each module's docstring gives its families' bytes. step.py turns
    a layout into the step's saved bytes and moments.

The S² terms are attention dropout's: torch's fused CPU kernels do not support dropout, so sdpa in training runs
the math kernel and keeps the probabilities and the dropout mask. CUDA's flash and memory-efficient kernels support
dropout and keep only a log-sum-exp, so these figures, like the traced ones they are checked against, overstate a
GPU step for models with attention dropout by that term (the report says so).
"""

from ...dims import attention_dropout, hidden_dropout
from .step import (
    Moment, RecomputedShape, TrainingActivations, embedding_gradient, recipe_attention, recipe_declines, recipe_for,
    recipe_peak_inside_layers, recomputed_backward_moments, training_activations,
)

__all__ = ["Moment", "RecomputedShape", "TrainingActivations", "attention_dropout", "embedding_gradient", "hidden_dropout",
           "recipe_attention", "recipe_declines", "recipe_for", "recipe_peak_inside_layers",
           "recomputed_backward_moments", "training_activations"]
