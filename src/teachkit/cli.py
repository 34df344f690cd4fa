"""Command line: ``teachkit {train,distill,run,eval,list,demo,sweep,report,predict,export}``. Parses and calls; no
logic of its own.

Every user mistake is one line ``teachkit: error: ...`` on stderr and exit status 2, never a traceback
(``--debug`` or ``TEACHKIT_DEBUG=1`` print it too); an I/O failure that escapes (disk full, a folder under a
file) is reported the same way as ``cannot write PATH: REASON``. Plugins (``--plugin MODULE``,
``TEACHKIT_PLUGINS=a,b``, ``plugins:`` in the config) are imported before the config is validated; code named
by a run folder or checkpoint only with ``--trust-code`` (see :mod:`teachkit.trust`).
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from teachkit.errors import ConfigError, TeachkitError
from teachkit.trust import TRUST_ENV, reading_from, trusting

PLUGINS_ENV = "TEACHKIT_PLUGINS"
DEBUG_ENV = "TEACHKIT_DEBUG"


def _add_debug_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true",
                   help=f"on an error, print the full traceback before the one-line message (also ${DEBUG_ENV}=1)")


def _add_trust_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-code", action="store_true",
                   help="import model factories and plugins that a run folder or checkpoint names (code read from "
                        "disk; without this flag only the ones you name in this command run)")


def _add_plugin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help=f"import MODULE first (it registers models, datasets, losses, recipes); repeatable; "
                        f"also ${PLUGINS_ENV}=a,b and 'plugins:' in the config")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=0.05")
    p.add_argument("--resume", action="store_true", help="continue the run folder's last checkpoint")
    p.add_argument("--quiet", action="store_true", help="print only errors and the final summary line")
    _add_plugin_arg(p)
    _add_trust_arg(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="teachkit",
                                     description="Knowledge distillation with the teacher in the loop.")
    sub = parser.add_subparsers(dest="command", required=True)
    train_help = f"train one model on labels (train.loss: {label_losses()})"
    _add_run_args(sub.add_parser("train", help=train_help, description=f"{train_help[0].upper()}{train_help[1:]}."))
    _add_run_args(sub.add_parser("distill", help="distil a student from a teacher (checkpoint or trained first)"))
    run = sub.add_parser("run", help="run any registered recipe (teachkit list recipes) on a config")
    run.add_argument("recipe", help="recipe name, e.g. prokd, annealing, rco, takd, eskd, l2t")
    _add_run_args(run)
    ev = sub.add_parser("eval", help="evaluate a checkpoint (file or run folder; a TAKD/ESKD/BAN run: its student)")
    ev.add_argument("checkpoint")
    ev.add_argument("overrides", nargs="*", metavar="data.options.key=value",
                    help="change dataset options for this evaluation, e.g. data.options.decode=beam "
                         "data.options.beam=5 (translation)")
    ev.add_argument("--data", help="dataset name (default: the one it was trained on)")
    ev.add_argument("--root", help="folder holding the dataset files (mnist, cifar10, cifar100)")
    ev.add_argument("--split", choices=["val", "test"], default="test")
    ev.add_argument("--select", choices=["last", "best"], default="last", help="which checkpoint of a run folder")
    ev.add_argument("--quiet", action="store_true", help="print only errors and the final JSON line")
    _add_plugin_arg(ev)
    _add_trust_arg(ev)
    ls = sub.add_parser("list", help="list registered models, datasets, losses, recipes, evaluators, callbacks (with "
                                     "options)")
    ls.add_argument("what", nargs="?", choices=["models", "datasets", "losses", "recipes", "evaluators", "callbacks",
                                                "all"],
                    default="all")
    ls.add_argument("name", nargs="?", default=None,
                    help="one entry: a table of its options (type, default, allowed values, help)")
    _add_plugin_arg(ls)
    demo = sub.add_parser("demo", help="images: CE vs MSE teacher, KD vs no KD; text: no KD vs KD vs Pro-KD on "
                                       "tweets with a MiniLM teacher; nmt: no KD vs word-level vs sequence-level "
                                       "KD; lm: no KD vs forward/reverse KL vs GKD vs Pro-KD for causal LMs; several "
                                       "paired seeds (offline)")
    demo.add_argument("--task", choices=["images", "text", "nmt", "lm"], default="images",
                      help="images (default), text (MiniLM-L6 teacher on the tweet corpus), nmt (Transformer "
                           "teacher, LSTM students on a generated translation task) or lm (GPT-2-style causal LMs "
                           "on generated addition problems); times: see README (measured)")
    demo.add_argument("--data", choices=["mnist5k", "digits", "mnist1d"], default="mnist5k",
                      help="dataset of the image demo")
    demo.add_argument("--seeds", type=int, default=None, help="student seeds (default per dataset)")
    demo.add_argument("--out", default="runs/demo", help="folder for the demo's runs and results")
    demo.add_argument("--quick", action="store_true", help="a smaller, faster setting (for smoke tests)")
    demo.add_argument("--sweep", action="store_true",
                      help="images: run the demo as the shipped sweep file (teachkit sweep machinery: shared "
                           "teachers, workers, status file, report)")
    demo.add_argument("--workers", type=int, default=1, help="with --sweep: local worker processes")
    sw = sub.add_parser("sweep", help="run a sweep file: a grid/list of runs with shared teachers, resumable, on "
                                      "local workers or Ray; writes a status file and a report")
    sw.add_argument("sweep_file", metavar="SWEEP.yaml")
    sw.add_argument("overrides", nargs="*", metavar="key=value",
                    help="dotted overrides for every run, e.g. data.root=/path/to/cifar")
    sw.add_argument("--workers", type=int, default=None,
                    help="jobs at a time (local default 1; ray default: the cluster's CPUs / --threads)")
    sw.add_argument("--backend", default="local", help="local (worker processes, default) or ray (RAY_ADDRESS)")
    sw.add_argument("--threads", type=int, default=None,
                    help="CPU threads per job (local default: cores / workers; ray default 1)")
    sw.add_argument("--gpus-per-run", type=float, default=0.0, help="ray: GPUs each run requests (default 0)")
    sw.add_argument("--out-dir", default=None, help="override the sweep file's out_dir")
    sw.add_argument("--dry-run", action="store_true", help="print the plan (runs, shared teachers, order); run nothing")
    sw.add_argument("--status", action="store_true",
                    help="print the state of the sweep (e.g. running elsewhere) from its status file; run nothing")
    sw.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    sw.add_argument("--quiet", action="store_true", help="print only errors and the final lines")
    _add_plugin_arg(sw)
    _add_trust_arg(sw)
    rp = sub.add_parser("report", help="aggregate run folders (summary.json) into Markdown/CSV tables and plots, "
                                       "with paired intervals and published numbers")
    rp.add_argument("runs_dir", metavar="RUNS_DIR")
    rp.add_argument("--by", nargs="+", default=None, metavar="KEY",
                    help="group rows by these keys: sweep labels, recipe, teacher.loss, teacher.model, pair or "
                         "dotted config keys, e.g. --by kd.method teacher.loss; a row's runs (its seeds) give mean "
                         "+- sample std, and with --baseline a paired 95%% t interval (default: the sweep's axes "
                         "without seeds, or the config keys that vary, and a run column naming the rows' folders)")
    rp.add_argument("--baseline", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                    help="the row paired differences are taken against, e.g. variant=no-kd")
    rp.add_argument("--select", choices=["last", "best"], default="last",
                    help="the test figure compared: last epoch, or at the best-validation epoch")
    rp.add_argument("--metric", default=None, help="metric to report (default: the runs' select metric)")
    rp.add_argument("--out", default=None, help="folder for report.md/.csv and plots (default RUNS_DIR/report)")
    rp.add_argument("--no-plots", action="store_true", help="tables only")
    rp.add_argument("--teachers", action="store_true", help="report teacher runs as rows too (default: a table of "
                                                            "their own)")
    _add_predict_parsers(sub)
    for command in sub.choices.values():
        _add_debug_arg(command)
        command.epilog = CONFIG_EPILOG
    parser.epilog = CONFIG_EPILOG
    return parser


#: the closing line of every ``--help``: where the configuration reference is
CONFIG_EPILOG = ("Configuration reference: docs/configuration.md; the options of one model, dataset, loss, recipe "
                 "or evaluator: teachkit list KIND NAME (e.g. teachkit list losses kd).")


def label_losses() -> str:
    """The registered label losses (``ce / mse / ...``), for ``train --help``."""
    from teachkit.losses import OBJECTIVES

    return " / ".join(OBJECTIVES.names())


def _add_predict_parsers(sub: Any) -> None:
    """``teachkit predict`` and ``teachkit export`` (bodies in :mod:`teachkit.predict.commands`)."""
    pr = sub.add_parser("predict", help="predict raw inputs (CSV / Parquet / .npz / images / text) with a run's "
                                        "model and preprocessing; one CSV row per input")
    pr.add_argument("run", metavar="RUN", help="run folder, export folder or checkpoint file")
    pr.add_argument("input", metavar="INPUT", help="CSV / Parquet table, .npz (array x), image file or folder, "
                                                   "text file (one input per line)")
    pr.add_argument("--out", default=None, metavar="FILE", help="write the CSV here (atomically); default stdout")
    pr.add_argument("--select", choices=["best", "last"], default="best", help="which checkpoint of a run folder")
    pr.add_argument("--proba", action="store_true", help="add one probability column per class")
    _add_trust_arg(pr)
    ex = sub.add_parser("export", help="export a run's model as a self-contained folder (safetensors, config.json, "
                                       "model card; --onnx for image and tabular models)")
    ex.add_argument("run", metavar="RUN", help="run folder or checkpoint file")
    ex.add_argument("folder", metavar="DIR", help="the export folder to create (must be new or empty)")
    ex.add_argument("--select", choices=["best", "last"], default="best", help="which checkpoint of a run folder")
    ex.add_argument("--onnx", action="store_true", help="also write model.onnx (raw inputs -> logits); needs "
                                                        "pip install 'teachkit[onnx]'")
    ex.add_argument("--force", action="store_true", help="replace DIR when it is not empty")
    _add_trust_arg(ex)


def summary_line(command: str, result) -> str:
    """``train finished: RUN  val 88.20%  test 86.18%  (best val ... at epoch k, test there ...)  12.3s``."""
    s = result.summary
    m = s.get("select_metric", "acc")
    percent = s.get("select_metric_percent", m == "acc")

    def fmt(value: float) -> str:
        text = f"{value:.2f}%" if percent else f"{value:.4g}"
        return text if m == "acc" else f"{m} {text}"

    wall = s.get("cost", {}).get("wall_time_s", s["wall_time_s"])  # a composed recipe's total
    warnings = s.get("warnings") or []
    said = f"  ({len(warnings)} warning{'s' if len(warnings) > 1 else ''} in summary.json)" if warnings else ""
    return (f"{command} finished: {result.run_dir}  val {fmt(s[f'val_{m}'])}  test {fmt(s[f'test_{m}'])}  "
            f"(best val {fmt(s[f'best_val_{m}'])} at epoch {s['best_epoch']}, test there {fmt(s[f'test_{m}_at_best'])})"
            f"  {wall:.1f}s{said}")


# ----------------------------------------------------------------------------- helpers


def plugin_names(given: Sequence[str] = ()) -> list[str]:
    """The plugins of ``$TEACHKIT_PLUGINS`` (comma-separated) then ``--plugin`` ones, without repeats."""
    env = [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]
    return list(dict.fromkeys([*env, *given]))


def check_folder(path: str | Path, what: str) -> None:
    """ConfigError unless ``path`` is, or can be made as, a folder: no part of it may be a file."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                where = "is a file" if part == path else f"is under {str(part)!r}, which is a file"
                raise ConfigError(f"{what} {str(path)!r} {where}, not a folder; choose another path")
            return


_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EEXIST, errno.ENOTDIR, errno.EDQUOT}


def os_error_line(e: OSError) -> str:
    """``cannot write PATH: No space left on device`` for an OSError that escaped to the CLI."""
    name = e.filename2 if e.filename2 is not None and e.errno in _WRITE_ERRNOS else e.filename
    path = Path(os.fsdecode(name)) if isinstance(name, (str, bytes, os.PathLike)) else None
    if path is not None and path.name.startswith(".") and path.name.endswith(".tmp"):
        path = path.parent  # an atomic write's temporary file: the folder says more
    op = "write" if e.errno in _WRITE_ERRNOS else "read" if e.errno == errno.ENOENT else "read or write"
    reason = e.strerror or str(e) or type(e).__name__
    where = f" {str(path)!r}" if path is not None else ""
    return f"cannot {op}{where}: {reason}"


def recorded_plugins_of(file: Path) -> list[str]:
    """The plugins in the ``config.yaml`` of the run folder holding checkpoint ``file`` (none if unreadable)."""
    from teachkit.config import read_yaml

    for folder in (file.parent.parent, file.parent):
        if (folder / "config.yaml").is_file():
            try:
                plugins = read_yaml(folder / "config.yaml").get("plugins")
            except ConfigError:
                return []
            return [p for p in plugins if isinstance(p, str)] if isinstance(plugins, list) else []
    return []


def rounded(value: Any, percent: bool) -> Any:
    """A metric for the eval line: percentages to 2 decimals, other numbers to 4 significant digits."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value):
        return value
    return round(value, 2) if percent else float(f"{value:.4g}")


def _say(args: argparse.Namespace, text: str) -> None:
    if not getattr(args, "quiet", False):
        print(f"teachkit: {text}", file=sys.stderr)


# ----------------------------------------------------------------------------- commands


def _train(args: argparse.Namespace) -> int:
    from teachkit import distributed
    from teachkit.config import load_config, with_changes
    from teachkit.recipes import RECIPES
    from teachkit.registry import import_plugins

    plugins = import_plugins(plugin_names(args.plugin))
    cfg = load_config(args.config, args.overrides, plugins=plugins, resume=args.resume)
    recipe = RECIPES.get({"train": "train", "distill": "kd"}.get(args.command) or args.recipe)
    main = distributed.is_main()  # under torchrun, rank 0 alone prints
    if args.quiet or not main:
        cfg = with_changes(cfg, train={"progress": False})
    result = recipe(cfg, resume=args.resume)
    s = result.summary
    if not main:
        return 0
    print(summary_line(args.command, result))
    if "test_acc_omitted" in s and not args.quiet:
        print(f"zero/few-shot: test accuracy on omitted classes {s['test_acc_omitted']:.2f}%, "
              f"on kept classes {s['test_acc_kept']:.2f}%")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from teachkit.config import DataConfig, from_dict, merge, parse_overrides
    from teachkit.engine import EVALUATORS
    from teachkit.recipes.common import check_compatible, checkpoint_file, load_data, load_model, student_of
    from teachkit.registry import import_plugins

    folder, role = student_of(Path(args.checkpoint))
    file = checkpoint_file(folder, args.select)
    import_plugins(plugin_names(args.plugin))  # the user's own first: those a run folder records need trust
    with reading_from(f"run folder of {str(file)!r} (its config.yaml)"):
        import_plugins(recorded_plugins_of(file))
    model, state = load_model(file, args.select)
    epoch = state.get("epoch")
    _say(args, f"evaluating {role}: {file}" + (f" (epoch {epoch})" if isinstance(epoch, int) else ""))
    data_cfg = dict(state.get("data", {}) or {})
    data_cfg.pop("train_subset", None)
    if args.data:
        data_cfg = {"name": args.data} if args.data != data_cfg.get("name") else data_cfg
    if args.root:
        data_cfg["root"] = args.root
    changes = parse_overrides(args.overrides)
    if set(changes) - {"data"} or set(changes.get("data", {})) - {"options"}:
        raise ConfigError(f"teachkit eval takes only data.options.* overrides (e.g. data.options.decode=beam); got "
                          f"{' '.join(args.overrides)}")
    if changes:
        data_cfg = merge(data_cfg, changes["data"])
    splits = load_data(from_dict(data_cfg, DataConfig), device="cpu")
    check_compatible(state, splits, file, who=f"the model in {str(file)!r}")
    evaluator = EVALUATORS.get(splits.task)(splits, 1000)
    metrics = evaluator.evaluate(model)[args.split]
    shown = {k: rounded(v, evaluator.is_percent(k)) for k, v in metrics.items()}
    print(json.dumps({"checkpoint": str(file), "epoch": epoch, "select": args.select, "dataset": splits.name,
                      "split": args.split, **shown}))
    return 0


def _list(args: argparse.Namespace) -> int:
    from teachkit.data import DATASETS
    from teachkit.engine import CALLBACKS, EVALUATORS
    from teachkit.losses import LOSSES, OBJECTIVES
    from teachkit.models import MODELS
    from teachkit.models.zoo import describe_builder
    from teachkit.options import describe
    from teachkit.recipes import RECIPES
    from teachkit.registry import import_plugins

    import_plugins(plugin_names(args.plugin))
    if args.name is not None:
        from teachkit.recipes.catalog import describe_entry

        if args.what == "all":
            raise ConfigError(f"teachkit list {args.name}: name a kind first, e.g. teachkit list losses {args.name} "
                              "(kinds: models, datasets, losses, recipes, evaluators, callbacks)")
        print(describe_entry(args.what, args.name))
        return 0
    groups = {"models": [MODELS], "datasets": [DATASETS], "losses": [OBJECTIVES, LOSSES], "recipes": [RECIPES],
              "evaluators": [EVALUATORS], "callbacks": [CALLBACKS]}
    for name, registries in groups.items():
        if args.what not in (name, "all"):
            continue
        for reg in registries:
            print(f"{reg.kind}s:" if not reg.kind.endswith("s") else f"{reg.kind}:")
            width = max((len(e.name) for e in reg.entries()), default=0)
            for e in reg.entries():
                print(f"  {e.name:<{width}}  {e.description}")
                if e.options is not None:
                    print(f"  {'':<{width}}    options: {describe(e.options)}")
                elif reg is MODELS and describe_builder(e.obj):
                    print(f"  {'':<{width}}    options: {describe_builder(e.obj)}")
    return 0


def _sweep_reporter(no_report: bool):
    """The report written at the end of a sweep (its file's ``report:`` options), or None."""
    if no_report:
        return None

    def write(plan) -> Any:
        from teachkit.experiments.report import run_report

        opts = plan.spec.report
        return run_report(plan.folder, by=opts.get("by"), baseline=opts.get("baseline"),
                          select=opts.get("select", "last"), metric=opts.get("metric"), out=plan.folder / "report")

    return write


def _sweep(args: argparse.Namespace) -> int:
    from teachkit.experiments.sweep import run_sweep
    from teachkit.registry import import_plugins

    plugins = import_plugins(plugin_names(args.plugin))
    if plugins:  # the job processes import them too
        os.environ[PLUGINS_ENV] = ",".join(plugins)
    if args.trust_code:  # and trust what this sweep's run folders name, as the driver does
        os.environ[TRUST_ENV] = "1"
    if args.out_dir is not None:
        check_folder(args.out_dir, "sweep --out-dir")
    if args.status:
        from teachkit.experiments.sweep import show_status

        print(show_status(args.sweep_file, args.out_dir))
        return 0
    given = args.workers is not None
    result = run_sweep(args.sweep_file, workers=args.workers if given else 1, workers_given=given,
                       backend=args.backend, threads=args.threads, overrides=args.overrides,
                       gpus_per_run=args.gpus_per_run, out_dir=args.out_dir, dry_run=args.dry_run, quiet=args.quiet,
                       reporter=_sweep_reporter(args.no_report))
    return 0 if result.ok else 1


def _report(args: argparse.Namespace) -> int:
    from teachkit.experiments.report import run_report

    if args.out is not None:
        check_folder(args.out, "report --out")
    run_report(Path(args.runs_dir), by=args.by, baseline=args.baseline, select=args.select, metric=args.metric,
               out=Path(args.out) if args.out else None, plots=not args.no_plots, teachers=args.teachers)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from teachkit.experiments.demo import run_demo

    check_folder(args.out, "demo --out")
    if args.sweep:
        from teachkit.experiments.demo import demo_sweep_file
        from teachkit.experiments.sweep import run_sweep

        if args.task != "images" or args.data != "mnist5k" or args.seeds is not None or args.quick:
            raise ConfigError("demo --sweep runs the shipped images demo sweep (mnist5k, 8 seeds); it takes no "
                              "--task/--data/--seeds/--quick: edit a copy of the sweep file and run teachkit sweep")
        result = run_sweep(demo_sweep_file(), workers=args.workers, out_dir=args.out,
                           reporter=_sweep_reporter(False))
        return 0 if result.ok else 1
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"demo --seeds {args.seeds} is out of range: must be >= 1")
    if args.task == "text":
        from teachkit.experiments.text_study import TextSetting, run_text_study

        setting = TextSetting().quick() if args.quick else TextSetting()
        run_text_study(setting, args.out, seeds=args.seeds)
        return 0
    if args.task == "nmt":
        from teachkit.experiments.nmt_study import NMTSetting, run_nmt_study

        nmt = NMTSetting().quick() if args.quick else NMTSetting()
        run_nmt_study(nmt, args.out, seeds=args.seeds)
        return 0
    if args.task == "lm":
        from teachkit.experiments.lm_study import LMSetting, run_lm_study

        lm = LMSetting().quick() if args.quick else LMSetting()
        run_lm_study(lm, args.out, seeds=args.seeds)
        return 0
    run_demo(args.data, seeds=args.seeds, out=args.out, quick=args.quick)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command in ("train", "distill", "run"):
        return _train(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "list":
        return _list(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "report":
        return _report(args)
    if args.command in ("predict", "export"):
        from teachkit.predict.commands import export_command, predict_command

        if args.command == "predict":
            return predict_command(args.run, args.input, args.out, args.select, args.proba)
        return export_command(args.run, args.folder, args.select, args.onnx, args.force)
    raise AssertionError(args.command)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides allowed after options as well (``--plugin m a=1``)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    unknown = [item for item in extra if item not in overrides]
    if unknown or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    if args.command == "list" and args.name is not None and "=" in args.name:  # list takes no overrides
        parser.error(f"unrecognized arguments: {args.name}")
    return args


def debugging(args: argparse.Namespace) -> bool:
    """Whether errors print their full traceback too (``--debug`` or ``TEACHKIT_DEBUG=1``)."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true",
                                                                                                   "yes")


def print_traceback(e: BaseException) -> None:
    """The traceback behind a one-line error, including the exception it was raised from (``from None`` hides
    that cause from the one-line message, not from ``--debug``)."""
    e.__suppress_context__ = False
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)


def interrupted_line(args: argparse.Namespace) -> str:
    if args.command == "sweep" or getattr(args, "sweep", False):
        return ("teachkit: interrupted; every run keeps its last finished epoch: rerun the same command to continue "
                "(finished runs are skipped, interrupted ones resume)")
    if args.command in ("train", "distill", "run"):
        return "teachkit: interrupted; the last finished epoch's checkpoint is kept (use --resume)"
    return "teachkit: interrupted"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user mistakes and escaped I/O errors print one line to stderr and exit with status 2,
    Ctrl-C one line and status 130."""
    if threading_main():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt from here on
    args = parse(argv)
    try:
        with trusting(getattr(args, "trust_code", False)):
            return _run(args)
    except TeachkitError as e:
        if debugging(args):
            print_traceback(e)
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_line(args), file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that stopped early (`teachkit list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # last resort: a write or read the code did not expect to fail (disk full, ...)
        if debugging(args):
            print_traceback(e)
        print(f"teachkit: error: {os_error_line(e)}", file=sys.stderr)
        return 2


def threading_main() -> bool:
    """Whether this is the main thread of the main interpreter (signal handlers can be set only there)."""
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
