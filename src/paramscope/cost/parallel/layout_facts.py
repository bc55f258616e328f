"""What the layout search reads of a model, once: its widths and heads, its layer stack (where pipelines cut it), its
routed experts, the GPU's memory and peak, the dtypes a step's activations travel in, and every parameter's cut under
a (tp, ep) pair (the sharding rules' answer, asked once a pair). Every other part of the search reads these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError, UnsupportedError
from .layout import ParallelLayout, shard_mode
from .pipeline import layer_of, layer_stack_of
from .search_options import SearchOptions, peak_for


@dataclass(frozen=True)
class ModelFacts:
    report: Any
    view: Any
    options: SearchOptions
    seq: int  # tokens a sequence, as the one-device step reads them
    text: Any  # the text model's config
    accelerator: Any
    peak: float  # the GPU's dense peak FLOP/s in peak_dtype (search_options.peak_for)
    peak_dtype: str
    capacity: int  # the GPU's memory beside the reserve: a layout fits where its peak is at most this
    hidden: int
    kv_heads: int
    head_dim: int
    top_k: int
    experts: int  # routed experts (0: none)
    shard: str  # the data-parallel shard mode every layout uses
    checkpointing: bool  # full gradient checkpointing
    act: int  # bytes of an activation element on the wire: 4 in fp32, else 2
    residual: int  # bytes of the residual stream between pipeline stages: 2 under bf16-pure, else 4 (fp32)
    stack: str | None  # the layer stack's path; None where pipelines are not modelled (no_pp says why)
    layers: int
    no_pp: str | None
    moe_layers: frozenset[int]  # the layers with routed experts
    tied: str | None  # the first tied group's canonical name
    causal: bool
    layer_norms: int  # the hidden-size norms of one layer (two in Llama's, four in Gemma-2's)
    _placements: dict = field(default_factory=dict, repr=False, compare=False)

    def placements(self, tp: int, ep: int) -> Any:
        """Every parameter's cut under (tp, ep), or the OptionError the rules refuse it with."""
        key = (tp, ep)
        if key not in self._placements:
            from .rules import placements_for

            try:
                self._placements[key] = placements_for(self.report, self.view, ParallelLayout(tp=tp, ep=ep))
            except OptionError as err:
                self._placements[key] = err
        return self._placements[key]

    def training_options(self, replica: int, **layout_options: Any) -> Any:
        """memory/training.py's options for one replica's step (`layout_options`: the layout, derive_layout), the
        fits table left out."""
        from ..memory.training import TrainingOptions

        options = self.options
        return TrainingOptions(batch=replica, seq=self.seq, optimizer=options.optimizer,
                               precision=options.precision, grad_checkpointing=options.grad_checkpointing,
                               attention=options.attention, reserve=options.reserve, fits=False, **layout_options)


def read_facts(report: Any, view: Any, options: SearchOptions, seq: int) -> ModelFacts:
    from ..dims import config_int, text_config
    from ..flops.analytic import routing
    from ..memory.states import step_precision
    from ..hardware import find_accelerator

    text = text_config(view.config)
    accelerator = find_accelerator(options.gpu)
    peak, peak_dtype = peak_for(accelerator, options.precision)
    hidden = config_int(text, "hidden_size") or 0
    heads = config_int(text, "num_attention_heads") or 1
    top_k, experts = routing(text)
    try:
        stack, layers = layer_stack_of([p.name for p in report.params])
        no_pp = None
    except UnsupportedError as err:
        stack, layers, no_pp = None, 1, str(err)
    moe_layers = frozenset() if stack is None else frozenset(
        {layer_of(p.name, stack) for p in report.params if p.role == "moe.experts"} - {None})
    norms = [] if stack is None else [
        p.name for p in report.params if p.role.endswith("norm") and tuple(p.shape) == (hidden,)
        and not p.name.endswith("bias") and layer_of(p.name, stack) == 0]
    return ModelFacts(
        report, view, options, seq, text, accelerator, peak, peak_dtype,
        capacity=accelerator.memory - options.reserve, hidden=hidden,
        kv_heads=config_int(text, "num_key_value_heads") or heads,
        head_dim=config_int(text, "head_dim") or (hidden // heads if heads else 0),
        top_k=top_k, experts=experts, shard=shard_mode(options.zero or "fsdp"),
        checkpointing=options.grad_checkpointing == "full", act=4 if options.precision == "fp32" else 2,
        residual=2 if step_precision(options.precision) == "bf16-pure" else 4, stack=stack, layers=layers, no_pp=no_pp,
        moe_layers=moe_layers, tied=next((g.canonical for g in report.tied), None),
        causal=view.class_name.endswith(("ForCausalLM", "LMHeadModel")), layer_norms=len(norms))
