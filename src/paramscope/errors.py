"""The one error family paramscope raises: every public error, in one module.

The CLI turns any ParamscopeError into a single line on stderr and a non-zero exit; anything else escaping is a bug in
paramscope, not in the user's input. Messages speak of parameters and values as the Python API names them
(`batch must be between 1 and 1,048,576, got 0`); an error that names options keeps them apart, so the CLI spells
them as its flags (`--batch must be …`) with `spelled(flag_of)`.
"""

from __future__ import annotations

from typing import Callable


class ParamscopeError(Exception):
    """Base class: the CLI prints the message on one line and exits with err.exit_code.

    `ParamscopeError(message)` is a plain message. `ParamscopeError(template, *options, **values)` names options:
    the template holds `{0}`, `{1}`… for the options (Python parameter names) and `{name}` for the values, so
    values read from files never reach the format string."""

    exit_code = 2

    def __init__(self, message: str = "", *options: str, **values: object):
        self.template, self.options, self.values = message, options, values
        super().__init__(self.spelled())

    def spelled(self, spell: Callable[[str], str] | None = None) -> str:
        """The message with each option spelled by `spell` (the CLI: its flag); as Python names it otherwise."""
        if not self.options and not self.values:
            return self.template
        return self.template.format(*(spell(o) if spell else o for o in self.options), **self.values)


class OptionError(ParamscopeError):
    """A value given for an option (a keyword argument, a CLI flag) is unknown, out of range, or does not fit the
    other options or the model."""


class UnsupportedError(ParamscopeError):
    """The model cannot do what was asked: gradient checkpointing, a traced step, a storage format it does not
    declare in a way paramscope knows."""


class SourceError(ParamscopeError):
    """The model could not be found or read (file, directory, preset, hub)."""


class ConfigError(ParamscopeError):
    """The config was read but describes no buildable model."""


class ModelClassError(ParamscopeError):
    """The requested class or task is unknown or does not fit the config."""


class RemoteCodeError(ParamscopeError):
    """The config needs code from the hub and --trust-remote-code was not given."""


class CheckpointError(ParamscopeError):
    """A checkpoint file is malformed, hostile or in an unsupported format."""


class FormulaError(ParamscopeError):
    """A formula could not be derived, or a derived formula disagrees with the meta-device count."""


class FormulaMismatchError(FormulaError):
    """The formula and the meta build disagree: a bug in paramscope, reported instead of a number."""

    exit_code = 1


class AssumptionError(ConfigError):
    """The config violates an assumption under which the formula was derived."""


class TemplateError(ParamscopeError):
    """A template could not be recorded (the build answered; nothing is wrong with the config)."""


__all__ = ["AssumptionError", "CheckpointError", "ConfigError", "FormulaError", "FormulaMismatchError",
           "ModelClassError", "OptionError", "ParamscopeError", "RemoteCodeError", "SourceError", "TemplateError",
           "UnsupportedError", "short_repr"]


def short_repr(value: object, limit: int = 100) -> str:
    """repr() cut short for a one-line message: names and values come from files and may be megabytes long, or be
    integers too long to print."""
    try:
        text = repr(value)
    except Exception:  # broad on purpose: a value's own __repr__ (a user's object, a config's) may raise anything
        text = f"<{type(value).__name__}>"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
