"""The ``teachkit`` command's entry point, outside the ``teachkit`` package on purpose.

Importing ``teachkit`` imports torch and registers every model, dataset, loss and recipe, which takes a few
seconds; a Ctrl-C then would print a long ``KeyboardInterrupt`` traceback. This module installs a handler
first, which prints one line and exits with status 130, then imports and runs :func:`teachkit.cli.main`
(which takes Ctrl-C over once it runs).
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130


def _interrupted_early(signum: int, frame: object) -> None:
    sys.stderr.write("teachkit: interrupted before the command started; nothing was written\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)


def main() -> int:
    """Install the early Ctrl-C handler, then run the command line."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when Ctrl-C is ignored (nohup, &)
        signal.signal(signal.SIGINT, _interrupted_early)
    from teachkit.cli import main as run_command

    return run_command()


if __name__ == "__main__":
    sys.exit(main())
