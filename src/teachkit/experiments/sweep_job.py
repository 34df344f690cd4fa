"""One sweep job in its own process: ``python -m teachkit.experiments.sweep_job --recipe R --config F --lock L``.

Takes an exclusive lock on ``L`` (released when the process ends, however it ends), so a run folder is never
trained by two processes at once (a rerun while an orphaned job still runs); then runs recipe ``R`` on the
config file ``F`` with ``resume=True``: a new run starts, an interrupted one resumes exactly, a finished one
returns at once. Exit status: 0 done, 2 a user error (one line), 75 the run is busy elsewhere, anything else
a crash (its traceback is in the job's log).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from teachkit.errors import TeachkitError

BUSY = 75


def _lock(path: str) -> object | None:
    """An open file holding an exclusive lock on ``path``, or None when another process holds it."""
    import fcntl

    f = open(path, "a+")  # noqa: SIM115 - held for the process's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teachkit-sweep-job")
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--lock", required=True)
    args = parser.parse_args(argv)
    held = _lock(args.lock)
    if held is None:
        print(f"teachkit: error: another process is running this job (lock {args.lock}); wait for it or stop it",
              file=sys.stderr)
        return BUSY
    try:
        from teachkit.config import load_config
        from teachkit.recipes import RECIPES

        cfg = load_config(args.config, resume=True)
        result = RECIPES.get(args.recipe)(cfg, resume=True)
        s = result.summary
        m = s.get("select_metric", "acc")
        print(json.dumps({"run": str(result.run_dir), f"val_{m}": s.get(f"val_{m}"), f"test_{m}": s.get(f"test_{m}"),
                          f"test_{m}_at_best": s.get(f"test_{m}_at_best"), "wall_time_s": s.get("wall_time_s")}))
        return 0
    except TeachkitError as e:
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("teachkit: interrupted; the run keeps its last finished epoch", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
