"""Command line: ``teachkit {train,distill,eval,list,demo}``. Parses and calls; no logic of its own."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from teachkit.errors import TeachkitError


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=0.05")
    p.add_argument("--resume", action="store_true", help="continue the run folder's last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="teachkit",
                                     description="Knowledge distillation with the teacher in the loop.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_args(sub.add_parser("train", help="train one model on labels (ce / mse / mse-logits)"))
    _add_run_args(sub.add_parser("distill", help="distil a student from a teacher (checkpoint or trained first)"))
    run = sub.add_parser("run", help="run any registered recipe (teachkit list recipes) on a config")
    run.add_argument("recipe", help="recipe name, e.g. prokd, annealing, rco, takd, eskd, l2t")
    _add_run_args(run)
    ev = sub.add_parser("eval", help="evaluate a checkpoint (file or run folder) on a dataset split")
    ev.add_argument("checkpoint")
    ev.add_argument("--data", help="dataset name (default: the one it was trained on)")
    ev.add_argument("--root", help="folder holding the dataset files (mnist, cifar10, cifar100)")
    ev.add_argument("--split", choices=["val", "test"], default="test")
    ev.add_argument("--select", choices=["last", "best"], default="last", help="which checkpoint of a run folder")
    ls = sub.add_parser("list", help="list registered models, datasets, losses, recipes, evaluators (with options)")
    ls.add_argument("what", nargs="?", choices=["models", "datasets", "losses", "recipes", "evaluators", "all"],
                    default="all")
    demo = sub.add_parser("demo", help="CE vs MSE teacher, KD vs no-KD students, several seeds (offline)")
    demo.add_argument("--data", choices=["mnist5k", "digits", "mnist1d"], default="mnist5k")
    demo.add_argument("--seeds", type=int, default=None, help="student seeds (default per dataset)")
    demo.add_argument("--out", default="runs/demo", help="folder for the demo's runs and results")
    demo.add_argument("--quick", action="store_true", help="a smaller, faster setting (for smoke tests)")
    return parser


def summary_line(command: str, result) -> str:
    """``train finished: RUN  val 88.20%  test 86.18%  (best val ... at epoch k, test there ...)  12.3s``."""
    s = result.summary
    m = s.get("select_metric", "acc")
    percent = s.get("select_metric_percent", m == "acc")

    def fmt(value: float) -> str:
        text = f"{value:.2f}%" if percent else f"{value:.4g}"
        return text if m == "acc" else f"{m} {text}"

    wall = s.get("cost", {}).get("wall_time_s", s["wall_time_s"])  # a composed recipe's total
    return (f"{command} finished: {result.run_dir}  val {fmt(s[f'val_{m}'])}  test {fmt(s[f'test_{m}'])}  "
            f"(best val {fmt(s[f'best_val_{m}'])} at epoch {s['best_epoch']}, test there {fmt(s[f'test_{m}_at_best'])})"
            f"  {wall:.1f}s")


def _run(args: argparse.Namespace) -> int:
    if args.command in ("train", "distill", "run"):
        from teachkit.config import load_config, with_changes
        from teachkit.recipes import RECIPES

        recipe = RECIPES.get({"train": "train", "distill": "kd"}.get(args.command) or args.recipe)
        cfg = load_config(args.config, args.overrides)
        if args.quiet:
            cfg = with_changes(cfg, train={"progress": False})
        result = recipe(cfg, resume=args.resume)
        s = result.summary
        print(summary_line(args.command, result))
        if "test_acc_omitted" in s:
            print(f"zero/few-shot: test accuracy on omitted classes {s['test_acc_omitted']:.2f}%, "
                  f"on kept classes {s['test_acc_kept']:.2f}%")
        return 0
    if args.command == "eval":
        from teachkit.config import DataConfig, from_dict
        from teachkit.engine import EVALUATORS
        from teachkit.recipes.common import check_compatible, load_data, load_model

        model, state = load_model(args.checkpoint, args.select)
        data_cfg = dict(state.get("data", {}) or {})
        data_cfg.pop("train_subset", None)
        if args.data:
            data_cfg = {"name": args.data} if args.data != data_cfg.get("name") else data_cfg
        if args.root:
            data_cfg["root"] = args.root
        splits = load_data(from_dict(data_cfg, DataConfig), device="cpu")
        check_compatible(state, splits)
        metrics = EVALUATORS.get(splits.task)(splits, 1000).evaluate(model)[args.split]
        print(json.dumps({"checkpoint": str(args.checkpoint), "dataset": splits.name, "split": args.split,
                          **metrics}))
        return 0
    if args.command == "list":
        from teachkit.data import DATASETS
        from teachkit.engine import EVALUATORS
        from teachkit.losses import LOSSES, OBJECTIVES
        from teachkit.models import MODELS
        from teachkit.options import describe
        from teachkit.recipes import RECIPES

        groups = {"models": [MODELS], "datasets": [DATASETS], "losses": [OBJECTIVES, LOSSES], "recipes": [RECIPES],
                  "evaluators": [EVALUATORS]}
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
        return 0
    if args.command == "demo":
        from teachkit.experiments.demo import run_demo

        run_demo(args.data, seeds=args.seeds, out=args.out, quick=args.quick)
        return 0
    raise AssertionError(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user mistakes print one line to stderr and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except TeachkitError as e:
        print(f"teachkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("teachkit: interrupted; the last finished epoch's checkpoint is kept (use --resume)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that stopped early (`teachkit list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
