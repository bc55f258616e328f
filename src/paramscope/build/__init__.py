"""From a config dict to a model on the meta device: validate, read the config, choose the class, build.

torch and transformers are imported inside the functions, so that `import paramscope` stays light. The names below
are the package's API (`from paramscope.build import make_config`); each lives in the module of its concern:

    limits.py        the bounds a config and its build are held to (MAX_LAYERS, MAX_MODULES, MAX_COST_LAYERS, …)
    size_checks.py   validate_config_dict: sizes before any import (positive, within the limits, heads that split,
                     int64 products, sub-configs by path); check_cost_layers, check_num_labels
    field_checks.py  the fields beyond sizes the cost engines read: top-k, windows, dtype, label ids, rope,
                     quantization
    config_read.py   make_config: the dict read into a PretrainedConfig, with notes (config_notes,
                     extra_config_notes)
    remote_code.py   a repo's own classes named by auto_map: remote_class, a remote config, the refusal without trust
    class_choice.py  choose_class: --class, --task (TASKS, TASK_ALIASES), architectures[0], auto_map, AutoModel
    meta.py          build_on_meta / build_class_on_meta: on meta, in a dtype, within the module budget
    quiet.py         transformers' logs and warnings kept off stderr; an exception's first line

The flow: validate_config_dict → make_config → choose_class → build_on_meta.
"""

from .class_choice import TASK_ALIASES, TASKS, ClassChoice, choose_class, resolve_task
from .config_read import config_notes, extra_config_notes, make_config, transformers_version
from .limits import MAX_COST_LAYERS, MAX_DIMENSION, MAX_LABELS, MAX_LAYERS, MAX_MODULES
from .meta import build_class_on_meta, build_on_meta
from .quiet import quiet_transformers
from .remote_code import remote_class
from .size_checks import check_cost_layers, check_num_labels, validate_config_dict

__all__ = [
    "MAX_COST_LAYERS", "MAX_DIMENSION", "MAX_LABELS", "MAX_LAYERS", "MAX_MODULES", "TASKS", "TASK_ALIASES",
    "ClassChoice", "build_class_on_meta", "build_on_meta", "check_cost_layers", "check_num_labels", "choose_class",
    "config_notes", "extra_config_notes", "make_config", "quiet_transformers", "remote_class", "resolve_task",
    "transformers_version", "validate_config_dict",
]
