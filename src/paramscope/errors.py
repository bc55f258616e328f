"""The one error family paramscope raises for bad input.

The CLI turns any ParamscopeError into a single line on stderr and a non-zero exit;
anything else escaping is a bug in paramscope, not in the user's input.
"""


class ParamscopeError(Exception):
    """Base class: the CLI prints str(err) on one line and exits with err.exit_code."""

    exit_code = 2


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


def short_repr(value: object, limit: int = 100) -> str:
    """repr() cut short for a one-line message: names and values come from files and may be megabytes long, or be
    integers too long to print."""
    try:
        text = repr(value)
    except Exception:  # broad on purpose: a value's own __repr__ (a user's object, a config's) may raise anything
        text = f"<{type(value).__name__}>"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
