"""The error hierarchy fxlens raises on purpose: one base, one class per stage.

`FxlensError` is the common base, so a caller (the CLI) can catch everything fxlens reports
deliberately while letting genuine bugs surface as tracebacks. Each message says what failed,
where, and what to try; callers chain the cause with ``raise ... from e``.

"""

from __future__ import annotations


class FxlensError(Exception):
    """Base of every error fxlens raises on purpose."""


class LoadError(FxlensError):
    """A model file or preset could not be turned into a module and example inputs."""


class CaptureError(FxlensError):
    """No capture method could trace the model into a graph."""


class RuleError(FxlensError):
    """A cost rule failed on a node, or was registered wrongly."""


class DuplicateRuleError(RuleError, ValueError):
    """A rule key (op, code) registered twice; the message names both definition sites."""


class ReportError(FxlensError):
    """A report could not be read, written, rendered or compared."""


class ValidationError(FxlensError):
    """A captured graph could not be run for real (`analyze validate`)."""
