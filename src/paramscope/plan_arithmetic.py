"""A fine-tuning plan counted without a build: the template's stand-ins (template.py) hold each module's class
name, parameters and ties, enough to apply a plan as PEFT applies it, by PEFT's own rules read from its installed
source (peft_source.py), and count, without torch. What is not mirrored here exactly (other layer types, QLoRA,
MoE experts PEFT adapts as parameters, token classification, …) answers None, and the caller builds: an answer
from here is the build's or nothing (tests/test_plan_nobuild.py compares them field by field).

    template stand-ins → rules (plan.apply_rules) → PEFT's wrapping mirrored (targets, lora_A/B, DoRA's magnitude,
    modules_to_save) → counts by role (plan.tally) → Plan(engine="arithmetic", module=None)
"""

from __future__ import annotations

import ast
import re
from types import SimpleNamespace
from typing import Any

from .peft_source import PeftFacts, class_attribute, class_chain, defines, peft_facts
from .plan import (
    ADAPTER, TASK_TYPES, Plan, PlanOptions, apply_rules, base_dtype_of, check_targets, has_matrix, method_of, tally,
)
from .template import StubTensor, stub_class, stub_dtype

# PEFT's model class by task type (peft/auto.py; no task type: PeftModel), for the task types mirrored here; each
# wrapping is checked against PEFT's (tests/test_plan_nobuild.py)
PEFT_MODEL_CLASSES = {None: "PeftModel", "CAUSAL_LM": "PeftModelForCausalLM", "SEQ_2_SEQ_LM": "PeftModelForSeq2SeqLM",
                      "SEQ_CLS": "PeftModelForSequenceClassification"}
# the layer classes LoRA adapts here, by stand-in class name: torch's nn.Linear and transformers' Conv1D (PEFT's
# lora.Linear for both) and nn.Embedding (lora.Embedding; a subclass too, told by the stand-in's embedding mark)
LINEAR_CLASSES = ("Linear", "Conv1D")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")  # what a config's dtype may name, as torch names them


def plan_counts(report: Any, stand_ins: Any, options: PlanOptions,
                config: dict[str, Any] | None = None) -> Plan | None:
    """The Plan `make_plan` gives, every figure the same, without a build: from a template's stand-ins (the `counted`
    of `api.inspect_source` when its report's engine is "template") and PEFT's arithmetic. `module` is None (nothing
    can run), `engine` "arithmetic". `config`: the config dict, whose dtype is a LoRA plan's base dtype as in the
    build. None whenever the answer might differ from the build's: the caller builds. A bad --target raises as
    make_plan does."""
    planned = plan_stand_ins(report, stand_ins, options, config)
    return None if planned is None else planned[0]


def plan_stand_ins(report: Any, stand_ins: Any, options: PlanOptions,
                   config: dict[str, Any] | None = None) -> tuple[Plan, Any] | None:
    """(plan_counts' Plan, the planned stand-ins), or None: the stand-ins wrapped as PEFT wraps the model (PeftModel →
    LoraModel → the model; each target's base_layer, lora_A, lora_B, …; modules_to_save's original_module and
    copy), which counting (count.py) reads as it reads the PEFT model itself (`planned_report`)."""
    options.check()
    if not getattr(stand_ins, "paramscope_stub", False) or options.qlora is not None:
        return None
    adapters = options.lora is not None
    base_dtype, base_from = None, ""
    if adapters:
        check_targets(stand_ins, options.target)  # the same refusal as make_plan's
        dtype = _config_dtype(config)
        if dtype is None:
            return None
        base_dtype, base_from = base_dtype_of(options.base_dtype, SimpleNamespace(dtype=dtype or None))
    # PEFT freezes the whole base before it adds the adapters; without adapters the rules start from the model's own
    model = _stand_in_copy(stand_ins, requires_grad=False if adapters else None)
    targets: tuple[str, ...] = ()
    peft_counts = None
    if adapters:
        facts = peft_facts()
        wrapped = None if facts is None else _with_stand_in_adapters(model, report, options, facts)
        if wrapped is None:
            return None
        model, targets = wrapped
        peft_counts = _trainable_and_total(model)  # get_nb_trainable_parameters(): before the rules, as make_plan
    rules = apply_rules(model, report, options.rules, adapters=adapters)
    params = {p.name: p for p in report.params}
    by_role, adapter, total, trainable = tally(model.named_parameters(), params)
    own = _stand_in_cast(model, options.adapter_dtype, adapters=True) if options.adapter_dtype else frozenset()
    base_own: frozenset[str] = frozenset()
    if adapters and base_dtype != "float32":  # as make_plan: an fp32 base is what mixed precision keeps anyway
        base_own = _stand_in_cast(model, base_dtype, adapters=False)
    plan = Plan(method_of(options), rules, targets, trainable, total - trainable, adapter, total, by_role, None,
                peft_counts, (), None, options.adapter_dtype, own, base_dtype, base_own, base_from,
                tuple(report.params), tuple(report.buffers), engine="arithmetic")
    return plan, model


def planned_report(planned: Any, report: Any) -> Any | None:
    """The report `api.inspect_module` gives of the planned model, from `plan_stand_ins`' stand-ins: names, counts,
    roles, ties, buffers and the module tree (what the plan's tree shows), without the MoE summary and the
    conventions, which read the config object. None where the model's shared layers need the config (ALBERT's
    groups): the caller builds for the tree."""
    from .count import count_module
    from .report import ModelInfo, make_report
    from .sharing import find_shared_layers

    if find_shared_layers(report.tree) != tuple(report.shared_layers):
        return None
    counted = count_module(planned)
    name = type(planned).__name__
    info = ModelInfo(source=f"a live {name} module", source_kind="module", label=name, class_name=name,
                     class_reason="the module passed in", model_type=report.model.model_type, native=None,
                     transformers_version=None, engine="module")
    return make_report(info, counted, report.model.base_model_prefix, shared_layers=find_shared_layers(counted.tree))


def _config_dtype(config: dict[str, Any] | None) -> str | None:
    """The dtype a built config holds (transformers keeps `dtype` over `torch_dtype`): its name, "" when it names
    none, None when it is not one this mirrors (no config, "auto", another type: the build decides)."""
    if not isinstance(config, dict):
        return None
    value = config.get("dtype")
    value = config.get("torch_dtype") if value is None else value
    if value is None:
        return ""
    return value if value in FLOAT_DTYPES else None


class _PlanTensor(StubTensor):
    """A stand-in parameter whose flag the plan sets (`apply_rules` calls requires_grad_, as on a torch one)."""

    __slots__ = ()

    def requires_grad_(self, requires_grad: bool = True) -> "_PlanTensor":
        self.requires_grad = requires_grad
        return self


def _stand_in_copy(root: Any, *, requires_grad: bool | None = None, memo: dict[int, Any] | None = None) -> Any:
    """A copy of stand-in modules, as copy.deepcopy copies modules: shared modules and tied tensors stay shared
    within the copy, every tensor is new. `requires_grad`: the copies' flag (None: the original's)."""
    memo = {} if memo is None else memo
    if id(root) in memo:
        return memo[id(root)]
    copied = type(root)(root.is_embedding)
    memo[id(root)] = copied
    for store, source in ((copied._parameters, root._parameters), (copied._buffers, root._buffers)):
        for local, tensor in source.items():
            if id(tensor) not in memo:
                flag = tensor.requires_grad if requires_grad is None or source is root._buffers else requires_grad
                memo[id(tensor)] = _PlanTensor(tuple(tensor.shape), tensor.dtype, flag)
            store[local] = memo[id(tensor)]
    copied._non_persistent_buffers_set = set(root._non_persistent_buffers_set)
    for attr, child in root._modules.items():
        copied._modules[attr] = None if child is None else _stand_in_copy(child, requires_grad=requires_grad,
                                                                           memo=memo)
    return copied


def _trainable_and_total(model: Any) -> tuple[int, int]:
    """PEFT's get_nb_trainable_parameters(): each parameter once (no 4-bit ones here)."""
    trainable = total = 0
    for _, param in model.named_parameters():
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    return trainable, total


def _stand_in_cast(model: Any, dtype: str, *, adapters: bool) -> frozenset[str]:
    """_cast_adapters (adapters) or _cast_base (every other floating parameter) on stand-ins: the names."""
    names = set()
    for name, param in model.named_parameters():
        if bool(ADAPTER.search(name + ".")) != adapters:
            continue
        if adapters or param.dtype.name.startswith(("float", "bfloat")):  # torch's is_floating_point
            param.dtype = stub_dtype(dtype)
            names.add(name)
    return frozenset(names)


# ---- PEFT's wrapping, mirrored


def _with_stand_in_adapters(model: Any, report: Any, options: PlanOptions,
                            facts: PeftFacts) -> tuple[Any, tuple[str, ...]] | None:
    """get_peft_model(model, LoraConfig(...)) on stand-ins: (the PeftModel, its resolved target_modules), or None."""
    task = next((task for suffix, task in TASK_TYPES if report.model.class_name.endswith(suffix)), None)
    if task not in PEFT_MODEL_CLASSES:
        return None
    model_type = report.model.model_type
    # PeftModelForSequenceClassification extends modules_to_save before the adapters are injected, so the
    # classifier is never a LoRA target
    saved = tuple(options.modules_to_save) + (facts.seq_cls_saved if task == "SEQ_CLS" else ())
    target = _target_modules(model, report, options, facts, task)
    if target is None:
        return None
    names = [name for name, _ in model.named_modules()]
    chosen = [name for name in names if name and _is_target(name, target, saved)]
    if not chosen:
        return None  # PEFT raises: its own message comes from the build
    resolved = _condensed(target, names, facts.condense_from)
    wrappers = _inject(model, chosen, options, model_type, facts)
    if wrappers is None or not _save_modules(model, saved, wrappers):
        return None
    peft = stub_class(PEFT_MODEL_CLASSES[task])()
    tuner = stub_class("LoraModel")()
    tuner._modules["model"] = model
    peft._modules["base_model"] = tuner
    return peft, tuple(sorted(resolved))


def _target_modules(model: Any, report: Any, options: PlanOptions, facts: PeftFacts,
                    task: str | None) -> set[str] | None:
    """LoraConfig's target_modules as inject_adapter resolves them: the given names, the model type's defaults, or
    all-linear's full module names."""
    model_type = report.model.model_type
    if options.target is None:
        default = facts.default_targets.get(model_type)
        if default is None or isinstance(default, str):  # none: PEFT raises; a string is a regex, not mirrored
            return None
        target = set(default)
    elif options.target == (facts.all_linear,):
        target = None
    else:
        target = set(options.target)
    # transformers 5: PEFT converts an MoE model's targets before it fills in the defaults (so none are left:
    # PEFT refuses), and turns the experts' and router's old module names into target parameters (LoRA on
    # parameters, not mirrored here); other names stay as they are
    pattern = facts.conversion_patterns.get(model_type, model_type)
    renamed = facts.moe_renamed.get(pattern) or facts.moe_renamed.get(model_type) or frozenset()
    if renamed and (options.target is None or target is None
                    or any(t == old or t.endswith("." + old) for t in target for old in renamed)):
        return None
    return _all_linear(model, report, facts, task) if target is None else target


def _is_target(key: str, target: set[str], saved: tuple[str, ...]) -> bool:
    """check_target_module_exists: never inside a module to save (PEFT's regex, as it writes it), else the whole
    name or a dotted suffix."""
    if any(re.match(rf"(^|.*\.){name}($|\..*)", key) for name in saved):
        return False
    return key in target or any(key.endswith(f".{t}") for t in target)


def _condensed(target: set[str], names: list[str], condense_from: int) -> set[str]:
    """The target_modules PEFT keeps: from `condense_from` names on, the fewest suffixes that still name exactly the
    targets (tuners_utils._find_minimal_target_modules, which the reported targets come from)."""
    if len(target) < condense_from:
        return target
    ends = tuple("." + t for t in target)
    others = [name for name in names if name not in target and not name.endswith(ends)]

    def suffixes(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[i:]) for i in range(len(parts))][::-1]

    taken = {s for name in others for s in suffixes(name)}
    required: set[str] = set()
    for item, candidates in sorted(((t, suffixes(t)) for t in target), key=lambda pair: pair[1]):
        for suffix in candidates:
            if suffix in required or suffix in taken:
                continue
            if not any(item.endswith("." + r) for r in required):
                required.add(suffix)
                break
    return required or set(target)


def _all_linear(model: Any, report: Any, facts: PeftFacts, task: str | None) -> set[str] | None:
    """_maybe_include_all_linear_layers: every nn.Linear and Conv1D but the output embedding (or, without one, a
    sequence classifier's head). None where a module might be an nn.Linear under another class name (a router, a
    head subclassing it), or the output embedding cannot be told without the class."""
    names: set[str] = set()
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in LINEAR_CLASSES:
            names.add(name)
        elif not module.is_embedding and has_matrix(module):
            return None
    output = _output_embedding(model, report)
    if output is False:
        return None
    excluded = output
    if output is None and task == "SEQ_CLS":
        excluded = next((name for name in facts.seq_cls_heads if model._modules.get(name) is not None), None)
    if excluded is not None:  # under the first name the module has, as PEFT looks it up
        head = model._modules[excluded]
        names.discard(next(name for name, module in model.named_modules() if module is head))
    return names


def _output_embedding(model: Any, report: Any) -> str | None | bool:
    """transformers' get_output_embeddings(), by default `lm_head` when get_input_embeddings() finds one: the root's
    child it returns, None, or False where the class decides otherwise or it cannot be told from here."""
    chain = class_chain(report.model.class_name, report.model.model_type)
    if chain is None or defines(chain, "get_output_embeddings"):
        return False
    if "lm_head" not in model._modules:
        return None
    return "lm_head" if _finds_input_embeddings(model, chain, report) else False


def _finds_input_embeddings(model: Any, chain: list[ast.ClassDef], report: Any, depth: int = 0) -> bool:
    """Whether EmbeddingAccessMixin.get_input_embeddings() returns rather than raises: an override returns; the
    default looks at `_input_embed_layer` on the model, its `embeddings`, its `model`, then the base model."""
    if defines(chain, "get_input_embeddings"):
        return True
    name = class_attribute(chain, "_input_embed_layer") or "embed_tokens"
    children = model._modules
    if name in children or any(name in getattr(children.get(part), "_modules", {}) for part in ("embeddings", "model")):
        return True
    if "language_model" in children or depth:
        return False  # a multimodal model's text model, or a base model's own base model: not followed here
    base = children.get(report.model.base_model_prefix or "")
    inner = None if base is None else class_chain(type(base).__name__, report.model.model_type)
    return inner is not None and _finds_input_embeddings(base, inner, report, depth + 1)


def _inject(model: Any, chosen: list[str], options: PlanOptions, model_type: str,
            facts: PeftFacts) -> set[int] | None:
    """Replace each chosen module by its LoRA layer, in named_modules() order as inject_adapter does; the ids of
    the LoRA layers, or None where a layer type is not mirrored or PEFT would refuse it."""
    if any(key.startswith(other + ".") for key in chosen for other in chosen):
        return None  # a target inside another: never a layer type mirrored here
    wrappers: set[int] = set()
    for key in chosen:
        parent_name, _, attr = key.rpartition(".")
        parent = _submodule(model, parent_name)
        target = parent._modules[attr]
        if model_type in facts.mamba_types and attr in facts.mamba_refused:
            return None
        layer = _lora_layer(target, options)
        if layer is None:
            return None
        parent._modules[attr] = layer
        wrappers.add(id(layer))
    return wrappers


def _submodule(model: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        model = model._modules[part]
    return model


def _lora_layer(base: Any, options: PlanOptions) -> Any | None:
    """PEFT's lora.Linear (nn.Linear, Conv1D) or lora.Embedding around `base`, its children in the order
    LoraLayer.__init__ registers them: lora_A r × in and lora_B out × r (Conv1D's weight is in × out); an embedding's
    lora_embedding_A r × num and lora_embedding_B dim × r; DoRA's magnitude, one per output. Adapters are created in
    torch's default dtype, float32, and train; the base is frozen."""
    weight = base._parameters.get("weight")
    kind = type(base).__name__
    embedding = base.is_embedding
    if weight is None or len(weight.shape) != 2 or (kind not in LINEAR_CLASSES and not embedding) or (
            kind in LINEAR_CLASSES and embedding):
        return None
    rows, columns = weight.shape
    # (outputs, inputs); an embedding's (dim, num)
    out, width = (columns, rows) if kind == "Conv1D" or embedding else (rows, columns)
    layer = stub_class("Embedding" if embedding else "Linear")()
    dicts = {name: stub_class(cls)() for name, cls in (
        ("lora_dropout", "ModuleDict"), ("lora_A", "ModuleDict"), ("lora_B", "ModuleDict"),
        ("lora_embedding_A", "ParameterDict"), ("lora_embedding_B", "ParameterDict"),
        ("lora_magnitude_vector", "ModuleDict"))}
    layer._modules.update(base_layer=base, **dicts)
    dicts["lora_dropout"]._modules["default"] = stub_class("Dropout" if options.dropout > 0 else "Identity")()
    r = options.lora
    if embedding:
        dicts["lora_embedding_A"]._parameters["default"] = _adapter((r, width))
        dicts["lora_embedding_B"]._parameters["default"] = _adapter((out, r))
    else:
        dicts["lora_A"]._modules["default"] = _adapter_linear((r, width))
        dicts["lora_B"]._modules["default"] = _adapter_linear((out, r))
    if options.dora:
        magnitude = stub_class("DoraEmbeddingLayer" if embedding else "DoraLinearLayer")()
        magnitude._parameters["weight"] = _adapter((out,))
        dicts["lora_magnitude_vector"]._modules["default"] = magnitude
    return layer


def _adapter(shape: tuple[int, ...]) -> _PlanTensor:
    return _PlanTensor(shape, stub_dtype("float32"), True)


def _adapter_linear(shape: tuple[int, int]) -> Any:
    linear = stub_class("Linear")()
    linear._parameters["weight"] = _adapter(shape)  # bias=False (lora_bias is PEFT's default, off)
    return linear


def _save_modules(model: Any, saved: tuple[str, ...], wrappers: set[int]) -> bool:
    """_set_trainable: each module whose path ends with a name to save becomes a ModulesToSaveWrapper (the original,
    frozen, and a trainable deep copy). False where PEFT's plain `endswith` picks what a whole dotted name would not
    (pre_classifier for classifier), or a module inside a LoRA layer, inside another picked one, or at two paths."""
    paths = _every_path(model)
    picked = [(path, module) for path, module in paths if any(path.endswith(name) for name in saved)]
    inside = [path for path, module in paths if id(module) in wrappers]
    counts: dict[int, int] = {}
    for _, module in paths:
        counts[id(module)] = counts.get(id(module), 0) + 1
    for path, module in picked:
        if (not any(path == name or path.endswith("." + name) for name in saved) or counts[id(module)] > 1
                or any(path.startswith(other + ".") for other, _ in picked)
                or any(path.startswith(layer + ".") for layer in inside)):
            return False
    for path, module in picked:
        parent_name, _, attr = path.rpartition(".")
        wrapper = stub_class("ModulesToSaveWrapper")()
        copies = stub_class("ModuleDict")()
        copies._modules["default"] = _stand_in_copy(module, requires_grad=True)
        wrapper._modules.update(original_module=module, modules_to_save=copies)
        _submodule(model, parent_name)._modules[attr] = wrapper
    return True


def _every_path(model: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """named_modules(remove_duplicate=False): a shared module under each of its paths."""
    found = [(prefix, model)]
    for attr, child in model._modules.items():
        if child is not None:
            found += _every_path(child, f"{prefix}.{attr}" if prefix else attr)
    return found
