"""User-facing errors.

Anything raised as :class:`TeachkitError` is a user mistake (bad config value, missing file, ...):
the CLI prints its message on one line and exits with status 2, without a traceback.
"""

from __future__ import annotations


class TeachkitError(Exception):
    """A user mistake, reported as one line by the CLI (exit status 2)."""


class ConfigError(TeachkitError):
    """A configuration key, value or type that is not allowed."""


class DataError(TeachkitError):
    """Dataset files missing, truncated or malformed."""


class CheckpointError(TeachkitError):
    """A checkpoint that is missing, truncated, or fails its hash check."""


class NonFiniteLossError(TeachkitError):
    """Training produced NaN or Inf; the last good checkpoint is kept."""


class WriteError(TeachkitError):
    """A file of the run folder could not be written (disk full, read-only, a file in the way): one line
    naming the file and the system's reason; what was written before is kept."""
