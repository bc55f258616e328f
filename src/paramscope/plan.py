"""Fine-tuning plans: which parameters train, exactly as PEFT counts them, and what the plan's step costs.

    input → meta build (Report, module) → rules in the order given (--train / --freeze / --train-last) →
    adapters applied by PEFT itself on the meta device (--lora, --dora, --rslora, --modules-to-save) →
    counts by role (PEFT's own trainable and total) → the plan's training memory (cost/training_estimate.py)

Rules: a pattern is a role or role group ("head.classifier", "embeddings", "attention") or a glob over parameter
names. When the first rule trains something, everything else starts frozen; when it freezes something,
everything else starts trainable. Each later rule overrides the earlier ones for what it names, and the report
echoes what each matched. With adapters, PEFT freezes the base first and the rules then apply to the base.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from .display import HtmlDisplay
from .errors import OptionError, UnsupportedError, short_repr
from .selection import check_pattern, last_blocks, match_parameters
from .frozen import FrozenDict, freeze_fields

TASK_TYPES = (("ForCausalLM", "CAUSAL_LM"), ("LMHeadModel", "CAUSAL_LM"), ("ForSequenceClassification", "SEQ_CLS"),
              ("ForTokenClassification", "TOKEN_CLS"), ("ForConditionalGeneration", "SEQ_2_SEQ_LM"),
              ("ForQuestionAnswering", "QUESTION_ANS"))
MAX_RANK = 1 << 16
MAX_MODULE_NAMES = 1_000  # --target and --modules-to-save: a model has a few dozen distinct module names
MODULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")  # a module's name or dotted path, as PEFT matches it
# fp16 adapters are left out: under fp16 autocast the grad scaler refuses fp16 gradients (PEFT's
# autocast_adapter_dtype exists for that reason)
ADAPTER_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
QLORA_ADAPTER_DTYPE = "bfloat16"  # the QLoRA paper's: a 4-bit base, bf16 adapters, bf16 compute
BASE_DTYPES = {"auto": "auto", "fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}


@dataclass(frozen=True)
class PlanOptions:
    rules: tuple[tuple[str, str], ...] = ()  # ("train" | "freeze" | "train-last", pattern or K), in order
    lora: int | None = None  # the rank r
    alpha: int | None = None  # PEFT's default: 8
    dropout: float = 0.0
    target: tuple[str, ...] | None = None  # module names, ("all-linear",), or None: PEFT's default for the model
    dora: bool = False
    rslora: bool = False
    modules_to_save: tuple[str, ...] = ()
    qlora: str | None = None  # "nf4" or "nf4-dq": the base's nn.Linear weights stored 4-bit (bitsandbytes)
    # the adapters' dtype: "float32" | "bfloat16"; None: bf16 with --qlora (QLoRA's recipe), else --precision's
    adapter_dtype: str | None = None
    # LoRA/DoRA's frozen base under mixed precision: "auto" (None): the checkpoint's dtype, as transformers 5 loads
    # it (dtype="auto"); or "float32" | "bfloat16" | "float16"
    base_dtype: str | None = None

    def check(self) -> None:
        if self.lora is not None and not 1 <= self.lora <= MAX_RANK:
            raise OptionError("{0} must be a rank between 1 and {limit:,}, got {lora}", "lora", limit=MAX_RANK,
                              lora=self.lora)
        if self.lora is None and (self.dora or self.rslora or self.target or self.modules_to_save
                                  or self.alpha is not None):
            raise OptionError("{0}, {1}, {2}, {3} and {4} need {5} R", "alpha", "target", "dora", "rslora",
                              "modules_to_save", "lora")
        if self.qlora is not None and self.qlora not in ("nf4", "nf4-dq"):
            raise OptionError("{0}: the QLoRA base is nf4 or nf4-dq, got {qlora!r}", "qlora", qlora=self.qlora)
        if self.qlora is not None and self.lora is None:
            raise OptionError("{0} needs {1} R (the adapters' rank)", 'qlora', 'lora')
        if self.adapter_dtype is not None:
            if self.adapter_dtype not in ADAPTER_DTYPES.values():
                raise OptionError("{0} is fp32 or bf16, got {value!r}", "adapter_dtype", value=self.adapter_dtype)
            if self.lora is None:
                raise OptionError("{0} needs {1} R", "adapter_dtype", "lora")
        if self.base_dtype is not None:
            if self.base_dtype not in BASE_DTYPES.values():
                raise OptionError("{0} is auto, fp32, bf16 or fp16, got {value!r}", "base_dtype",
                                  value=short_repr(self.base_dtype, 40))
            if self.lora is None or self.qlora is not None:
                raise OptionError("{0} needs {1} R without {2} (QLoRA's base is 4-bit)", "base_dtype", "lora", "qlora")
        for option, names in (("target", self.target or ()), ("modules_to_save", self.modules_to_save)):
            if len(names) > MAX_MODULE_NAMES:
                raise OptionError("{0}: {count:,} names; at most {limit:,}", option, count=len(names),
                                  limit=MAX_MODULE_NAMES)
            for name in names:
                if name != "all-linear" and not MODULE_NAME.fullmatch(name):
                    raise OptionError(
                        "{0}: {name} is not a module name: PEFT matches module names whole or as a dotted suffix "
                        "(q_proj, attn.c_attn; all-linear for every linear layer), never as a pattern", option,
                        name=short_repr(name, 60))
        if not 0 <= self.dropout < 1:
            raise OptionError("{0} must be in [0, 1), got {dropout}", "dropout", dropout=self.dropout)
        for kind, value in self.rules:
            if kind in ("train", "freeze"):
                check_pattern(value, option=kind)
            if kind == "train-last":
                try:
                    int(value)
                except ValueError:
                    raise OptionError("{0} takes a number of blocks, got {value!r}", "train_last", value=value) from None


@dataclass(frozen=True)
class RuleMatch:
    action: str  # "train" | "freeze"
    pattern: str
    tensors: int
    parameters: int


@dataclass(frozen=True)
class Plan(HtmlDisplay):
    """What a fine-tuning plan trains, and the counts that follow.

    Read-only like every result: tuples and FrozenDicts (frozen.py). The one live object is `module`, the meta
    module the plan was applied to (what `plan_memory` and `plan_flops` trace); a torch module is mutable by
    nature, so it takes no part in `==` or `hash` (compare=False): both are the plan's figures alone, and two
    plans with the same figures are equal, and hash alike, whichever module they hold."""

    method: str  # "full" | "freeze" | "lora" | "dora" | "qlora"
    rules: tuple[RuleMatch, ...]
    targets: tuple[str, ...]  # adapter target modules as PEFT resolved them
    trainable: int
    frozen: int
    adapter: int  # parameters the adapters add
    total: int  # base + adapters, as PEFT counts
    by_role: FrozenDict[str, tuple[int, int]]  # role → (trainable, frozen)
    module: Any = field(repr=False, compare=False, default=None)  # the meta module with the plan applied
    peft_counts: tuple[int, int] | None = None  # PEFT's get_nb_trainable_parameters(), where adapters are used
    quantized: tuple[str, ...] = ()  # QLoRA: the base weights stored 4-bit (canonical names)
    storage: str | None = None  # QLoRA: "nf4" | "nf4-dq"
    adapter_dtype: str | None = None  # the adapters' own dtype; None: they follow --precision
    own_dtype: frozenset[str] = frozenset()  # the module's parameters kept in adapter_dtype (names in `module`)
    # LoRA/DoRA under mixed precision: the frozen base's dtype, its parameters (names in `module`) kept in it, and
    # where the dtype came from
    base_dtype: str | None = None
    base_own: frozenset[str] = frozenset()
    base_dtype_from: str = ""
    # the base's counted tensors (the report the plan was made from): QLoRA's weights as `memory --dtype nf4` counts
    # them, logical parameters and their scales
    base_params: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    base_buffers: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    # what counted: "build" (PEFT applied to the meta build) or "arithmetic" (the template's stand-ins and PEFT's
    # arithmetic, no build: plan_counts); the same figures either way, so it takes no part in `==`
    engine: str = field(default="build", compare=False)
    # plan_store.plan_key: the config, class and options that decide the planned module (None: a user's module);
    # the plan's derived memory recipes and FLOPs are kept under it, so the same plan asked again needs no build
    key: str | None = field(default=None, compare=False)
    # QLoRA: each nn.Linear the 4-bit stand-ins replaced, by its path in `module` (counted_module puts them back)
    quantized_modules: FrozenDict[str, Any] = field(default_factory=FrozenDict, repr=False, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "by_role")

    def __repr__(self) -> str:
        """One line: `<Plan lora: 294,912 of 109,809,210 parameters train (0.2686%) · …>`; the whole plan displays
        in Jupyter (`_repr_html_`) and saves with `.to_html(path)`."""
        method = self.method + (f" ({self.storage})" if self.storage else "")
        share = self.trainable / self.total * 100 if self.total else 0.0
        adapters = ""
        if self.adapter:
            targets = ", ".join(self.targets)
            if len(targets) > 60:  # all-linear's every name, a user's pattern
                targets = f"{len(self.targets)} target{'s' if len(self.targets) != 1 else ''}"
            adapters = f" · adapters add {self.adapter:,} on {targets}"
        return f"<Plan {method}: {self.trainable:,} of {self.total:,} parameters train ({share:.4f}%){adapters}>"


COMPARABLE = ("full", "freeze", "lora", "qlora")


def compared_plans(text: str, options: PlanOptions) -> list[tuple[str, PlanOptions]]:
    """--compare full,freeze,lora,qlora → [(name, PlanOptions)], each checked before any build. `freeze` is the
    rules given, else the last 2 blocks; lora and qlora take the adapter options given, rank 8 by default."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMPARABLE]
    if unknown or not names or len(set(names)) != len(names):
        raise OptionError("{0} takes plans from {plans}, each once; got {text!r}", "compare", plans=",".join(COMPARABLE),
                          text=text)
    adapters = dict(lora=options.lora or 8, alpha=options.alpha, dropout=options.dropout, target=options.target,
                    rslora=options.rslora, modules_to_save=options.modules_to_save,
                    adapter_dtype=options.adapter_dtype)
    plans = []
    for name in names:
        if name == "full":
            plan = PlanOptions()
        elif name == "freeze":
            plan = PlanOptions(rules=options.rules or (("train-last", "2"),))
        elif name == "lora":
            plan = PlanOptions(rules=options.rules, base_dtype=options.base_dtype, **adapters)
        else:
            plan = PlanOptions(rules=options.rules, qlora=options.qlora or "nf4", **adapters)
        plan.check()
        plans.append((name, plan))
    return plans


def make_plan(report: Any, module: Any, options: PlanOptions, *, key: str | None = None) -> Plan:
    """Apply the plan to a copy of `module` (built on meta) and count, by role. `key`: the plan's key
    (plan_store.plan_key), for a module built from a config."""
    options.check()
    model = copy.deepcopy(module)
    params = {p.name: p for p in report.params}
    peft_counts = None
    targets: tuple[str, ...] = ()
    if options.lora is not None:
        check_targets(module, options.target)
        model, targets = _with_adapters(model, options)
        peft_counts = tuple(model.get_nb_trainable_parameters())
    trainable = apply_rules(model, report, options.rules, adapters=options.lora is not None)
    by_role, adapter, total, n_trainable = tally(each_once(model.named_parameters(remove_duplicate=False)), params)
    method = method_of(options)
    quantized: tuple[str, ...] = ()
    replaced: FrozenDict = FrozenDict()
    if options.qlora:
        quantized, replaced = _quantize_base(model, module, report, options.qlora)
    adapter_dtype = options.adapter_dtype or (QLORA_ADAPTER_DTYPE if options.qlora else None)
    own = _cast_adapters(model, adapter_dtype) if adapter_dtype else frozenset()
    base_dtype, base_from, base_own = None, "", frozenset()
    if options.lora is not None and not options.qlora:
        base_dtype, base_from = base_dtype_of(options.base_dtype, getattr(module, "config", None))
        # an fp32 base is what mixed precision keeps anyway: nothing to hold in its own dtype
        base_own = _cast_base(model, base_dtype) if base_dtype != "float32" else frozenset()
    return Plan(method, trainable, targets, n_trainable, total - n_trainable, adapter, total, by_role, model,
                peft_counts, quantized, options.qlora, adapter_dtype, own, base_dtype, base_own, base_from,
                tuple(report.params), tuple(report.buffers), key=key, quantized_modules=replaced)


def method_of(options: PlanOptions) -> str:
    if options.lora is not None:
        return "dora" if options.dora else "qlora" if options.qlora else "lora"
    return "freeze" if options.rules else "full"


def each_once(named: Any) -> Any:
    """(name, parameter) pairs, each parameter once under its first name."""
    seen: set[int] = set()
    for name, param in named:
        if id(param) not in seen:
            seen.add(id(param))
            yield name, param


def tally(named: Any, params: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], int, int, int]:
    """(role → (trainable, frozen), adapter parameters, total, trainable) of the planned model's parameters."""
    by_role: dict[str, list[int]] = {}
    adapter = total = trainable = 0
    for name, param in named:
        role, is_adapter = _role_of(name, params)
        numel = param.numel()
        adapter += numel if is_adapter else 0
        by_role.setdefault(role, [0, 0])[0 if param.requires_grad else 1] += numel
        total += numel
        trainable += numel if param.requires_grad else 0
    return {k: (v[0], v[1]) for k, v in sorted(by_role.items())}, adapter, total, trainable


def base_dtype_of(asked: str | None, config: Any) -> tuple[str, str]:
    """(dtype, where it came from) of a LoRA/DoRA plan's base: as asked, or the checkpoint's (config dtype)."""
    if asked not in (None, "auto"):
        return asked, "--base-dtype"
    stored = None
    for key in ("dtype", "torch_dtype"):
        value = getattr(config, key, None) if config is not None else None
        if value is not None:
            stored = str(value).removeprefix("torch.")
            break
    if stored in ("bfloat16", "float16", "float32"):
        return stored, "the checkpoint's dtype (config dtype), as transformers 5 loads it (dtype=\"auto\")"
    return "float32", "float32: the config names no dtype, and transformers 5 loads such a checkpoint in float32"


def _cast_base(model: Any, dtype: str) -> frozenset[str]:
    """Store every floating parameter but the adapters in `dtype` (on meta); returns their names."""
    import torch

    names = set()
    target = getattr(torch, dtype)
    for name, param in model.named_parameters():
        if not ADAPTER.search(name + ".") and param.dtype.is_floating_point:
            if param.dtype != target:
                param.data = param.data.to(target)
            names.add(name)
    return frozenset(names)


def _cast_adapters(model: Any, dtype: str) -> frozenset[str]:
    """Store the adapters' parameters (LoRA's A and B, DoRA's magnitude) in `dtype`, on meta as PEFT's
    `autocast_adapter_dtype=False` leaves them; returns their names."""
    import torch

    names = set()
    for name, param in model.named_parameters():
        if ADAPTER.search(name + "."):
            param.data = param.data.to(getattr(torch, dtype))
            names.add(name)
    return frozenset(names)


def _quantize_base(model: Any, base: Any, report: Any, storage: str) -> tuple[tuple[str, ...], FrozenDict]:
    """QLoRA: the frozen base nn.Linear weights transformers' bitsandbytes quantiser would replace (the same
    choice `memory --dtype nf4` makes) become 4-bit stand-ins in the planned model (cost/bnb4.py)."""
    from .cost.traced.bnb4 import quantize_base
    from .cost.model_view import from_module
    from .cost.memory.quantization import weight_format
    from .cost.memory.weights import quantized_names

    fmt = weight_format(storage, compute_dtype="bfloat16")
    names = quantized_names(from_module(base), report.params, fmt)
    by_base_name = _base_parameters(model)
    weights = {id(by_base_name[name]) for name in names if name in by_base_name
               and not by_base_name[name].requires_grad}
    replaced = quantize_base(model, weights, fmt)
    kept = {id(module.weight) for module in replaced.values()}
    quantized = tuple(sorted(name for name in names if name in by_base_name and id(by_base_name[name]) in kept))
    return quantized, FrozenDict(replaced)


def apply_rules(model: Any, report: Any, rules: tuple[tuple[str, str], ...], *, adapters: bool) -> tuple[RuleMatch, ...]:
    """Set requires_grad on the base parameters rule by rule; returns what each rule matched."""
    if not rules:
        return ()
    by_base_name = _base_parameters(model)
    first_trains = rules[0][0] in ("train", "train-last")
    if not adapters:
        for param in by_base_name.values():
            param.requires_grad_(not first_trains)
    matches = []
    numel = {p.name: p.numel for p in report.params}
    for kind, value in rules:
        if kind == "train-last":
            names, described = last_blocks(report.params, int(value))
            count = int(value)
            action, pattern = "train", (f"the last block ({described})" if count == 1 else
                                        f"last {count} blocks ({described})")
        else:
            names = match_parameters(report.params, value, option=kind)
            action, pattern = kind, value
        for name in names:
            param = by_base_name.get(name)
            if param is not None:
                param.requires_grad_(action == "train")
        matches.append(RuleMatch(action, pattern, len(names), sum(numel[n] for n in names)))
    return tuple(matches)


def _base_parameters(model: Any) -> dict[str, Any]:
    """The base model's parameters under their names before PEFT wrapped them."""
    return {_base_name(name): param for name, param in model.named_parameters()}


def _base_name(name: str) -> str:
    name = re.sub(r"^base_model\.model\.", "", name)
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".") \
        .replace(".original_module.", ".")


ADAPTER = re.compile(r"\.(lora_[A-Za-z_]+|lora_magnitude_vector)\.")


def _role_of(name: str, params: dict[str, Any]) -> tuple[str, bool]:
    """(role, is an adapter) of a parameter of the planned model."""
    adapter = ADAPTER.search(name + ".")
    if adapter:
        kind = adapter.group(1)
        return ("adapter.dora_magnitude" if "magnitude" in kind else f"adapter.{kind}"), True
    base = _base_name(name)
    param = params.get(base)
    if param is None:
        param = next((p for p in params.values() if base in p.aliases), None)
    return (param.role if param is not None else "other"), False


def check_targets(root: Any, target: tuple[str, ...] | None) -> None:
    """Refuse --target names that match no module LoRA can adapt, as PEFT matches them (the whole name or a dotted
    suffix), listing the model's adaptable module names. `root` is the built module or a template's stand-ins:
    the check needs no build."""
    if not target or target == ("all-linear",):
        return
    adaptable = [name for name, sub in root.named_modules()
                 if name and not any(True for _ in sub.children()) and has_matrix(sub)]
    missing = [t for t in target if not any(n == t or n.endswith("." + t) for n in adaptable)]
    if missing:
        short = sorted({n.rsplit(".", 1)[-1] for n in adaptable})
        raise OptionError("{0} {missing} matches no module that LoRA adapts; this model's are: {names} (or "
                          "all-linear)", "target", missing=", ".join(short_repr(m, 60) for m in missing[:5]),
                          names=", ".join(short[:40]) + (f", … ({len(short)} names)" if len(short) > 40 else ""))


def has_matrix(module: Any) -> bool:
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    return weight is not None and len(tuple(weight.shape)) >= 2


def _with_adapters(model: Any, options: PlanOptions) -> tuple[Any, tuple[str, ...]]:
    import torch

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise UnsupportedError("{0} needs PEFT: pip install peft", "lora") from None
    task_type = next((task for suffix, task in TASK_TYPES if type(model).__name__.endswith(suffix)), None)
    target: Any = None
    if options.target:
        target = "all-linear" if options.target == ("all-linear",) else list(options.target)
    config = LoraConfig(r=options.lora, lora_alpha=options.alpha if options.alpha is not None else 8,
                        lora_dropout=options.dropout, target_modules=target, use_dora=options.dora,
                        use_rslora=options.rslora, modules_to_save=list(options.modules_to_save) or None,
                        task_type=task_type)
    import warnings

    try:
        with torch.device("meta"), warnings.catch_warnings():
            # PEFT calling transformers' renamed helpers, PEFT's notes (fan_in_fan_out set for Conv1D): the report
            # says what matters; nothing leaks to stderr
            warnings.simplefilter("ignore")
            wrapped = get_peft_model(model, config)
    except ValueError as err:  # PEFT's own message: no default targets for this model, a target not found, …
        raise UnsupportedError(f"PEFT: {str(err).strip().splitlines()[0][:200]}") from None
    resolved = wrapped.peft_config["default"].target_modules
    targets = tuple(sorted(resolved)) if isinstance(resolved, (set, list, tuple)) else (str(resolved),)
    return wrapped, targets



def counted_module(plan: Plan) -> Any:
    """The planned module as a count shows it: QLoRA's 4-bit stand-ins back as the nn.Linear they replaced, so the
    tree and treemaps count logical parameters, as PEFT and the plan's totals do (not packed bytes)."""
    from .cost.traced.bnb4 import logical_copy

    check_built(plan)
    return logical_copy(plan.module, dict(plan.quantized_modules)) if plan.quantized_modules else plan.module


def plan_memory(plan: Plan, options: Any = None) -> Any:
    """The plan's training step's memory (a MemoryEstimate, as `estimate_training` gives), for `options`
    (TrainingOptions; default: its defaults). The planned module is a live one: its weights take --precision's
    dtype, except the adapters when the plan stores them in their own (bf16 with --qlora)."""
    from .cost.memory.training import TrainingOptions, estimate_training

    check_built(plan)
    options = TrainingOptions() if options is None else options
    # the planned module's own report, QLoRA's 4-bit stand-ins counted as stored, is no page's to draw: the plan's
    # page draws what trains (counted_module)
    estimate = dataclasses.replace(estimate_training(plan.module, _with_own_dtypes(plan, options),
                                                     structure=plan.key), report=None)
    if plan.storage and plan.base_params:
        estimate = _qlora_weights(plan, estimate)
    return _named_recipe(plan, estimate, options, plan.module)


def cached_plan_memory(plan: Plan, planned: Any, root: Any, view: Any, options: Any = None) -> Any:
    """The plan's memory without a build, from what an earlier run kept (its derived recipe, under the plan's key),
    or an analytic recipe (a plan without adapters): as `plan_memory` gives it, or None (the caller builds).
    `planned` is the planned model's report and `root` its stand-ins (plan_arithmetic); `view` the engines' view
    of them (cost facts)."""
    from .cost.memory.training import TrainingOptions, step_estimate

    options = TrainingOptions() if options is None else options
    options.check()
    if plan.key is None or plan.storage:
        return None
    estimate = step_estimate(planned, view, _with_own_dtypes(plan, options), live=True, structure=plan.key)
    return None if estimate is None else _named_recipe(plan, estimate, options, root)


def _with_own_dtypes(plan: Plan, options: Any) -> Any:
    """The options with the parameters the plan keeps in their own dtype: its adapters (bf16 with --qlora), and
    under mixed precision its 16-bit base."""
    mixed = options.precision.endswith("-mixed")
    return dataclasses.replace(options, own_dtype=plan.own_dtype | (plan.base_own if mixed else frozenset()))


def _named_recipe(plan: Plan, estimate: Any, options: Any, root: Any) -> Any:
    """The estimate with the plan's recipe named (the base's dtype and where it came from, what autocast casts)."""
    mixed = options.precision.endswith("-mixed")
    if plan.base_dtype and mixed:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        adapters = short.get(plan.adapter_dtype or "float32", plan.adapter_dtype)
        compute = options.precision.split("-")[0]
        notes = [f"the recipe people run: the frozen base in {short[plan.base_dtype]} ({plan.base_dtype_from}), the "
                 f"adapters in {adapters} (PEFT's autocast_adapter_dtype), {compute} autocast (the Trainer's); "
                 "--base-dtype changes the base"]
        if short[plan.base_dtype] != compute:
            cast = 2 * _base_matmul_elements(root)
            notes.append(f"the base is {short[plan.base_dtype]} and autocast computes in {compute}: each of its "
                         f"matmul weights is cast to {compute} and the copy is saved for backward (up to {cast:,} B "
                         f"in all); --base-dtype {compute}, or --precision {short[plan.base_dtype]}-mixed where the "
                         "base is 16-bit, avoids it")
        estimate = dataclasses.replace(estimate, notes=tuple(notes) + tuple(estimate.notes),
                                       settings=dict(estimate.settings, base_dtype=plan.base_dtype,
                                                     base_dtype_from=plan.base_dtype_from))
    return estimate


def check_built(plan: Plan) -> None:
    if plan.module is None:  # plan_counts': figures without a build, nothing to trace
        raise UnsupportedError("this plan was counted without a build (plan_counts): its memory and FLOPs trace the "
                               "planned module make_plan gives")


def _qlora_weights(plan: Plan, estimate: Any) -> Any:
    """QLoRA's weights as `memory --dtype nf4` gives them: format nf4, its quantised parameters counted logically,
    the absmax and code books as the format's overhead (its own row), rather than the stand-ins' packed bytes and
    buffers. The same bytes in all (checked: weights and buffers add up to the step's resident ones)."""
    from .api import inspect_module
    from .cost.memory.quantization import weight_format
    from .cost.memory.states import as_trained
    from .cost.memory.weights import weight_memory

    fmt = weight_format(plan.storage, compute_dtype="bfloat16")
    adapters = [p for p in inspect_module(plan.module).params if ADAPTER.search(p.name + ".")]
    precision = estimate.settings["precision"]
    params = as_trained(plan.base_params, precision) + as_trained(adapters, precision, plan.own_dtype)
    old = estimate.weights
    weights = weight_memory(params, plan.base_buffers, fmt, quantized=frozenset(plan.quantized),
                            components=sorted({p.name.split(".")[0] for p in params}))
    if weights.bytes + weights.buffer_bytes != old.bytes + old.buffer_bytes:
        return estimate  # the stand-ins' own count stands (never seen: the stand-ins store what the format says)
    return dataclasses.replace(estimate, weights=weights)


def _base_matmul_elements(root: Any) -> int:
    """Elements of the frozen base's nn.Linear weights (what autocast casts, matmul by matmul), in the planned
    module or its stand-ins (by class name: PEFT's own wrapper, also named Linear, holds no weight of its own)."""
    seen: set[int] = set()
    total = 0
    for name, sub in root.named_modules():
        weight = sub._parameters.get("weight")
        if _is_linear(sub) and not ADAPTER.search(name + ".") and weight is not None \
                and id(weight) not in seen and not weight.requires_grad:
            seen.add(id(weight))
            total += weight.numel()
    return total


def _is_linear(module: Any) -> bool:
    if getattr(module, "paramscope_stub", False):
        return type(module).__name__ == "Linear"
    import torch

    return isinstance(module, torch.nn.Linear)


def plan_flops(plan: Plan, *, batch: int, seq: int, checkpointing: bool = False) -> Any:
    """The plan's training-step FLOPs, counted by FlopCounterMode on fake tensors: adapters add their matmuls;
    frozen weights still pass the input's gradient back (where something before them trains) but compute no
    weight gradient. A plan with a key reads them from the cache where an earlier run kept them at this point,
    and keeps them; a plan counted without a build (no module) answers from the cache only, else None."""
    from .cost.traced.flops import count_flops
    from .cost.traced.step import StepSettings
    from .plan_store import PLANS, find_flops, keep_flops

    point = dict(batch=batch, seq=seq, checkpointing=checkpointing)
    if plan.key is not None:
        cached = find_flops(PLANS, plan.key, **point)
        if cached is not None or plan.module is None:
            return cached
    check_built(plan)
    counted = count_flops(plan.module, StepSettings(batch=batch, seq=seq, grad_checkpointing=checkpointing),
                          training=True)
    if plan.key is not None:
        keep_flops(PLANS, plan.key, counted, **point)
    return counted
