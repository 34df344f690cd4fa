"""Pro-KD (Rezagholizadeh et al. 2022) on the full MNIST: LeNet teacher, MLP-100 and MLP-30 students, paired seeds.

Data: ``mnist_full``, the classic 50,000 train / 10,000 valid (the validation split) / 10,000 test files; val and
test are fixed. Per seed s (``--seeds``, default 5): a LeNet teacher trained on all 50,000 training images with
train.seed=s, recorded after every epoch (save_every 1), then for each student capacity (``--capacities``, default
MLP-100 and MLP-30, one hidden layer) six students with train.seed=s: no KD, KD (the final teacher), Annealing-KD
(the final teacher, annealed temperature), RCO (the recorded checkpoints as anchors), Pro-KD replay (the recorded
trajectory) and Pro-KD online (the teacher trained again inside the student's run, epoch by epoch; its cost
counts those teacher epochs). The paper's budget rule: every student trains as many epochs as Pro-KD's phase I
(sum of prokd.student_epochs over the teacher epochs) plus phase II; ``train.epochs`` is that budget for every
method. Teacher SGD lr 0.05, students SGD lr 0.01 (as benchmarks/prokd_study.py), momentum 0.9, wd 5e-4, cosine,
batch 128 for all. Prints the plan with its predicted wall time first (``--plan`` stops there), one line per
finished run, then per capacity a Markdown table (mean +- std over seeds, paired 95% t intervals against KD and
no KD) and a verdict read off the intervals; writes results.md/.json and curves.png (validation accuracy per epoch,
mean over seeds, teacher curve included) into ``--out``, and for full runs into benchmarks/results.

    OMP_NUM_THREADS=1 python benchmarks/prokd_mnist_full.py [--seeds 5] [--threads 1] [--capacities 100,30]
        [--teacher small|lenet5] [--teacher-epochs 3] [--phase2-epochs 3] [--out runs/prokd_mnist_full] [--plan]
        [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from teachkit.config import from_dict
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval, pyplot
from teachkit.recipes import RECIPES
from teachkit.recipes.common import device_of, load_data, with_changes

#: teacher choices: LeNet-5 as registered (conv 20/50, FC 500) and a narrower one (conv 10/20, FC 100)
TEACHERS = {"small": {"name": "lenet", "options": {"channels": [10, 20], "fc": 100}},
            "lenet5": {"name": "lenet", "options": {"channels": [20, 50], "fc": 500}}}
#: the full study's setting (see CHOICE for why); --quick replaces some of it (QUICK)
SETTING: dict[str, Any] = {
    "data": "mnist_full", "teacher": "small", "teacher_epochs": 3, "batch_size": 128, "eval_batch_size": 500,
    "teacher_lr": 0.05, "student_lr": 0.01,
    # Pro-KD: T_i = max(1, tau_max - floor((i - 1) / stage_epochs)) for teacher epoch i: 3, 2, 1
    "tau_max": 3, "stage_epochs": 1, "student_epochs_per_stage": 1, "phase2_epochs": 3,
    "reduction": "mean",  # prokd_study's: F.mse_loss over logits (the summed ||.||^2 is 10x the gradient at lr 0.01)
}
QUICK = {"data": "mnist5k", "teacher_epochs": 2, "tau_max": 2, "phase2_epochs": 1}
CHOICE = ("Teacher LeNet conv 10/20 + FC 100, not LeNet-5's 20/50 + FC 500: an epoch costs ~20 s against ~41 s "
          "here, and online Pro-KD trains the teacher again for every student capacity, so teacher epochs are "
          "3 x seeds x teacher_epochs; with LeNet-5 the 5-seed study would take ~48 min instead of ~30. Batch 128 "
          "(per epoch LeNet-5 41 s against 46 s at batch 64, the small one 19 s against 26 s). 3 teacher epochs "
          "(tau_max 3: T = 3, 2, 1, reaching 1 in phase I) and 3 CE epochs in phase II: 6 student epochs, ~30 min; "
          "--teacher-epochs 4 --phase2-epochs 2 (T = 4..1, 6 epochs) predicts ~35 min.")
METHODS = ["no KD", "KD", "Annealing-KD", "RCO", "Pro-KD replay", "Pro-KD online"]
RECIPE = {"no KD": "train", "KD": "kd", "Annealing-KD": "annealing", "RCO": "rco", "Pro-KD replay": "prokd",
          "Pro-KD online": "prokd"}
FOLDER = {"no KD": "nokd", "KD": "kd", "Annealing-KD": "annealing", "RCO": "rco", "Pro-KD replay": "prokd-replay",
          "Pro-KD online": "prokd-online"}
#: seconds measured on this machine (2 cores, another CPU-bound job running, OMP_NUM_THREADS=1, torch 1 thread),
#: for 50,000 training images at batch 128 (val and test evaluated every epoch included); scaled linearly with the
#: training-set size. teacher_epoch: one teacher epoch; teacher_forward: one pass over the training set at eval
#: batch 500 (a teacher-output cache build, once per checkpoint and seed: the cache is shared by every run);
#: epoch_ce / epoch_cached: a student epoch on labels only / on cached teacher logits; epoch_per_batch: a student
#: epoch running the teacher on every batch (teacher.cache=off; not used: online Pro-KD caches each checkpoint's
#: outputs too, since MNIST has no augmentation); run: fixed overhead of a run (model, folders, checkpoints)
TIMES = {"teacher_epoch": {"small": 20.0, "lenet5": 41.0}, "teacher_forward": {"small": 5.0, "lenet5": 16.0},
         "epoch_per_batch": {"small": 9.0, "lenet5": 20.0},
         "epoch_ce": {100: 1.95, 30: 1.6}, "epoch_cached": {100: 2.6, 30: 2.0}, "run": 0.8}
COVERS = ("per seed s, a new teacher (init and batch order: train.seed=s, recorded every epoch) and new students "
          "(train.seed=s: init and batch order; all on the full training split); paired within a seed (every method "
          "of seed s follows teacher s and starts from the same student init); val/test fixed ({split})")
#: how each dataset's val/test are fixed (the COVERS wording)
FIXED_SPLITS = {"mnist_full": "the official valid/test files of mnist.pkl.gz",
                "mnist5k": "the carved test split and val split of data.split_seed=0"}
COMPARISONS = [("Pro-KD > KD", "Pro-KD replay", "KD"), ("Pro-KD > no KD", "Pro-KD replay", "no KD"),
               ("KD > no KD", "KD", "no KD"), ("Pro-KD > Annealing-KD", "Pro-KD replay", "Annealing-KD")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--out", default="runs/prokd_mnist_full")
    ap.add_argument("--capacities", default="100,30", help="student hidden widths, comma-separated")
    ap.add_argument("--teacher", choices=sorted(TEACHERS), default=SETTING["teacher"])
    ap.add_argument("--teacher-epochs", type=int, default=SETTING["teacher_epochs"],
                    help="teacher epochs E; Pro-KD tau_max = E (T = E, ..., 1) and RCO anchors = E")
    ap.add_argument("--phase2-epochs", type=int, default=SETTING["phase2_epochs"], help="Pro-KD phase II (CE) epochs")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: mnist5k, <= 2 seeds, 2 teacher epochs, 3 student epochs; nothing in benchmarks/")
    ap.add_argument("--plan", action="store_true", help="print the plan and exit")
    args = ap.parse_args(argv)
    try:
        args.capacities = [int(c) for c in args.capacities.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--capacities {args.capacities!r}: comma-separated integers, e.g. 100,30")
    if not args.capacities or min(args.capacities) < 1:
        ap.error("--capacities needs at least one positive width")
    if min(args.seeds, args.threads, args.teacher_epochs) < 1 or args.phase2_epochs < 0:
        ap.error("--seeds, --threads and --teacher-epochs must be >= 1, --phase2-epochs >= 0")
    if args.quick:
        args.seeds = min(args.seeds, 2)
    return args


def setting_of(args: argparse.Namespace) -> dict[str, Any]:
    s = {**SETTING, "teacher": args.teacher, "teacher_epochs": args.teacher_epochs, "tau_max": args.teacher_epochs,
         "phase2_epochs": args.phase2_epochs}
    if args.quick:
        s.update(QUICK)
    s["phase1_epochs"] = s["student_epochs_per_stage"] * s["teacher_epochs"]
    s["budget"] = s["phase1_epochs"] + s["phase2_epochs"]
    s["rco_anchors"] = s["teacher_epochs"]  # every recorded checkpoint once, the last the final teacher
    return s


def budget_rule(s: dict[str, Any]) -> str:
    return (f"epoch budget: Pro-KD phase I = prokd.student_epochs ({s['student_epochs_per_stage']}) x "
            f"{s['teacher_epochs']} teacher epochs = {s['phase1_epochs']}, phase II (CE) = {s['phase2_epochs']}, so "
            f"every student (no KD, KD, Annealing-KD, RCO, Pro-KD) trains train.epochs = {s['phase1_epochs']} + "
            f"{s['phase2_epochs']} = {s['budget']} epochs")


def predict(s: dict[str, Any], n_train: int, seeds: int, capacities: list[int]) -> dict[str, float]:
    """Expected seconds per run kind and in total, from :data:`TIMES` scaled to ``n_train`` images."""
    scale = n_train / 50_000
    t, e, b, p1 = s["teacher"], s["teacher_epochs"], s["budget"], s["phase1_epochs"]
    teacher_epoch, forward = TIMES["teacher_epoch"][t] * scale, TIMES["teacher_forward"][t] * scale

    def student(h: int, kind: str) -> float:
        ce = TIMES["epoch_ce"].get(h, TIMES["epoch_ce"][100] * (0.6 + 0.004 * h)) * scale
        cached = TIMES["epoch_cached"].get(h, TIMES["epoch_cached"][100] * (0.6 + 0.004 * h)) * scale
        if kind == "no KD":
            return TIMES["run"] + b * ce
        if kind in ("KD", "RCO"):
            return TIMES["run"] + b * cached
        return TIMES["run"] + p1 * cached + (b - p1) * ce

    out = {"teacher": e * teacher_epoch + TIMES["run"], "cache_builds_per_seed": e * forward}
    for h in capacities:
        for m in METHODS:
            out[f"{m} MLP-{h}"] = student(h, m) + (e * teacher_epoch if m == "Pro-KD online" else 0.0)
    per_seed = sum(out.values())
    out["per_seed"] = per_seed
    out["total"] = seeds * per_seed + 3.0  # + data loading
    return out


def plan_text(args: argparse.Namespace, s: dict[str, Any], sizes: dict[str, int], pred: dict[str, float],
              command: str) -> str:
    n_students = len(args.capacities) * len(METHODS)
    lines = [f"plan: Pro-KD on {s['data']} ({'quick smoke run' if args.quick else 'full study'}), "
             f"{args.seeds} seed(s), torch threads {torch.get_num_threads()}",
             f"data: train {sizes['train']:,} / val {sizes['val']:,} / test {sizes['test']:,} images (1x28x28); "
             "val and test fixed",
             f"teacher: {TEACHERS[s['teacher']]} x {s['teacher_epochs']} epochs, SGD lr {s['teacher_lr']} momentum 0.9 "
             f"wd 5e-4 cosine, batch {s['batch_size']}, recorded every epoch, train.seed = s",
             f"students: MLP-{', MLP-'.join(map(str, args.capacities))} (one hidden layer), SGD lr {s['student_lr']} "
             "momentum 0.9 wd 5e-4 cosine, train.seed = s",
             f"Pro-KD: tau_max {s['tau_max']}, stage_epochs {s['stage_epochs']}, student_epochs "
             f"{s['student_epochs_per_stage']} per teacher epoch, reduction {s['reduction']}; Annealing-KD: the same "
             f"schedule on the final teacher; RCO: {s['rco_anchors']} anchors (every recorded epoch); KD: Hinton, "
             "kd.temperature/alpha defaults",
             budget_rule(s),
             f"runs: {args.seeds} teachers + {args.seeds} seeds x {len(args.capacities)} capacities x {len(METHODS)} "
             f"methods = {args.seeds * (1 + n_students)} runs; per kind: teacher {args.seeds}, "
             + ", ".join(f"{m} {args.seeds * len(args.capacities)}" for m in METHODS)
             + f"; teacher epochs trained in all: {args.seeds * s['teacher_epochs'] * (1 + len(args.capacities))} "
             f"({args.seeds * s['teacher_epochs']} recorded + {args.seeds * len(args.capacities) * s['teacher_epochs']}"
             " inside online Pro-KD)",
             "measured seconds (this machine, 1 thread, 50,000 images, batch 128): teacher epoch "
             + ", ".join(f"{k} {v:g}" for k, v in TIMES["teacher_epoch"].items())
             + "; teacher pass over the training set (cache build) "
             + ", ".join(f"{k} {v:g}" for k, v in TIMES["teacher_forward"].items())
             + "; student epoch, labels only " + ", ".join(f"MLP-{k} {v:g}" for k, v in TIMES["epoch_ce"].items())
             + ", cached teacher logits " + ", ".join(f"MLP-{k} {v:g}" for k, v in TIMES["epoch_cached"].items())
             + ", teacher run per batch (cache off) " + ", ".join(f"{k} {v:g}"
                                                                  for k, v in TIMES["epoch_per_batch"].items()),
             f"expected wall time: teacher {pred['teacher']:.0f} s + cache builds "
             f"{pred['cache_builds_per_seed']:.0f} s per seed; per student run: "
             + ", ".join(f"{k} {v:.0f}" for k, v in pred.items()
                         if k not in ("teacher", "cache_builds_per_seed", "per_seed", "total"))
             + f" s; per seed {pred['per_seed']:.0f} s; total ~{pred['total'] / 60:.1f} min",
             f"command: {command}"]
    return "\n".join(lines)


def base_config(s: dict[str, Any], out_dir: Path, hidden: int):
    optim = {"name": "sgd", "lr": s["teacher_lr"], "momentum": 0.9, "weight_decay": 5e-4, "schedule": "cosine"}
    return from_dict({"out_dir": str(out_dir),
                      "data": {"name": s["data"], "batch_size": s["batch_size"],
                               "eval_batch_size": s["eval_batch_size"]},
                      "model": {"name": "mlp", "options": {"hidden": [hidden]}},
                      "optim": {**optim, "lr": s["student_lr"]},
                      "train": {"epochs": s["budget"], "progress": False},
                      "teacher": {"model": TEACHERS[s["teacher"]], "optim": optim, "epochs": s["teacher_epochs"]},
                      "prokd": {"tau_max": s["tau_max"], "stage_epochs": s["stage_epochs"],
                                "student_epochs": s["student_epochs_per_stage"], "reduction": s["reduction"]},
                      "rco": {"anchors": s["rco_anchors"]}})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    s = setting_of(args)
    omp = os.environ.get("OMP_NUM_THREADS")
    command = shlex.join([*([f"OMP_NUM_THREADS={omp}"] if omp else []), "python", "benchmarks/prokd_mnist_full.py",
                          *(sys.argv[1:] if argv is None else argv)])
    full_command = "OMP_NUM_THREADS=1 python benchmarks/prokd_mnist_full.py --seeds 5 --threads 1"
    out_dir = Path(args.out) / f"{s['data']}-{time.strftime('%Y%m%d-%H%M%S')}"
    bases = {h: base_config(s, out_dir, h) for h in args.capacities}
    base = bases[args.capacities[0]]
    t_load = time.perf_counter()
    splits = load_data(base.data, device_of(base))
    sizes = {"train": len(splits.train.y), "val": len(splits.val.y), "test": len(splits.test.y)}
    pred = predict(s, sizes["train"], args.seeds, args.capacities)
    print(plan_text(args, s, sizes, pred, command), flush=True)
    print(f"why this setting: {CHOICE}", flush=True)
    if args.plan:
        print(f"full run: {full_command}")
        return
    print(f"intervals cover: {covers(s)}", flush=True)
    t0 = t_load
    total = args.seeds * (1 + len(args.capacities) * len(METHODS))
    done = 0
    teachers: list[Any] = []
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {h: {m: [] for m in METHODS} for h in args.capacities}

    def progress(what: str, summary: dict[str, Any], seconds: float) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{total}] {what}: test {summary['test_acc']:.2f}%  {seconds:.1f} s  "
              f"(elapsed {time.perf_counter() - t0:.0f} s)", flush=True)

    for seed in range(args.seeds):
        tcfg = with_changes(base, name=f"seed{seed}-teacher", model=base.teacher.model, optim=base.teacher.optim,
                            train={"epochs": s["teacher_epochs"], "save_every": 1, "seed": seed})
        t = time.perf_counter()
        teacher = RECIPES.get("train")(tcfg, splits=splits, run_dir=out_dir / f"seed{seed}" / "teacher")
        teachers.append(teacher)
        progress(f"seed {seed} teacher", teacher.summary, time.perf_counter() - t)
        for h in args.capacities:
            for method in METHODS:
                changes: dict[str, Any] = {"train": {"seed": seed}}
                if method == "Pro-KD online":  # trains its own teacher (teacher.model/optim/epochs, seed = s)
                    changes["prokd"] = {"mode": "online"}
                elif method != "no KD":
                    changes["teacher"] = {"checkpoint": str(teacher.run_dir)}
                    changes["prokd"] = {"mode": "replay"}
                cfg = with_changes(bases[h], name=f"seed{seed}-mlp{h}-{FOLDER[method]}", **changes)
                t = time.perf_counter()
                result = RECIPES.get(RECIPE[method])(cfg, splits=splits,
                                                     run_dir=out_dir / f"seed{seed}" / f"mlp{h}" / FOLDER[method])
                seconds = time.perf_counter() - t
                runs[h][method].append({**result.summary, "wall_s": seconds,
                                        "curve": [r["val"]["acc"] for r in result.history]})
                progress(f"seed {seed} MLP-{h} {method}", result.summary, seconds)
    results = collect(args, s, sizes, pred, teachers, runs, time.perf_counter() - t0, command)
    text = render(results)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.md").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out_dir / "curves.png")
    written = [out_dir / "results.md", out_dir / "results.json", out_dir / "curves.png"]
    if not args.quick:
        keep = Path(__file__).resolve().parent / "results"
        keep.mkdir(exist_ok=True)
        (keep / "prokd_mnist_full.md").write_text(text + "\n")
        (keep / "prokd_mnist_full.json").write_text(json.dumps(results, indent=2) + "\n")
        plot(results, keep / "prokd_mnist_full.png")
        written += [keep / "prokd_mnist_full.md", keep / "prokd_mnist_full.json", keep / "prokd_mnist_full.png"]
    print("written: " + ", ".join(str(p) for p in written))


def collect(args: argparse.Namespace, s: dict[str, Any], sizes: dict[str, int], pred: dict[str, float],
            teachers: list[Any], runs: dict[int, dict[str, list[dict[str, Any]]]], wall: float,
            command: str) -> dict[str, Any]:
    """The results record: settings, teacher, and per capacity every method's figures, intervals and verdict."""
    n = min(len(t.history) for t in teachers)
    out: dict[str, Any] = {
        "dataset": s["data"], "quick": args.quick, "seeds": args.seeds, "setting": s,
        "teacher_model": TEACHERS[s["teacher"]], "data_sizes": sizes, "budget_rule": budget_rule(s),
        "interval_covers": covers(s), "command": command, "threads": torch.get_num_threads(),
        "predicted_wall_time_s": pred["total"], "wall_time_s": wall, "times_measured_s": TIMES,
        "teacher": {"val_acc": [t.summary["val_acc"] for t in teachers],
                    "test_acc": [t.summary["test_acc"] for t in teachers],
                    "wall_s": [t.summary.get("wall_time_s", 0.0) for t in teachers],
                    "curve": [sum(t.history[i]["val"]["acc"] for t in teachers) / len(teachers) for i in range(n)]},
        "capacities": {}}
    for h, per_method in runs.items():
        test = {m: [r["test_acc"] for r in rs] for m, rs in per_method.items()}
        students = {}
        for m, rs in per_method.items():
            students[m] = {"test_acc": test[m], "val_acc": [r["val_acc"] for r in rs],
                           "test_acc_at_best": [r["test_acc_at_best"] for r in rs],
                           "cost": rs[0].get("cost", {}), "wall_s": [r["wall_s"] for r in rs],
                           "diff_vs_kd": None if m == "KD" else list(paired_interval(test[m], test["KD"])),
                           "diff_vs_no_kd": None if m == "no KD" else list(paired_interval(test[m], test["no KD"])),
                           "diff_vs_annealing": None if m == "Annealing-KD" else
                           list(paired_interval(test[m], test["Annealing-KD"])),
                           "curve": [r["curve"] for r in rs]}
        verdict = {}
        for claim, a, b in COMPARISONS:
            m, lo, hi = paired_interval(test[a], test[b])
            verdict[claim] = {"outcome": outcome(lo, hi), "diff": [m, lo, hi]}
        same = max(abs(x - y) for x, y in zip(test["Pro-KD online"], test["Pro-KD replay"], strict=True))
        out["capacities"][str(h)] = {"students": students, "verdict": verdict,
                                     "online_minus_replay_max_abs": same}
    return out


def covers(s: dict[str, Any]) -> str:
    """What the paired intervals cover, for the setting's dataset."""
    return COVERS.format(split=FIXED_SPLITS.get(s["data"], "data.split_seed=0"))


def outcome(lo: float, hi: float) -> str:
    """``reproduced`` when the paired interval lies above 0, ``reversed`` below 0, else ``not resolved``
    (a single seed has no interval: not resolved)."""
    if lo > 0:
        return "reproduced"
    if hi < 0:
        return "reversed"
    return "not resolved"


def render(r: dict[str, Any]) -> str:
    s, t = r["setting"], r["teacher"]
    lines = [f"## Pro-KD on {r['dataset']} ({r['seeds']} seeds{', quick smoke run' if r['quick'] else ''}): teacher "
             f"{r['teacher_model']['name']} {r['teacher_model'].get('options', {})}, MLP students",
             "", f"Data: train {r['data_sizes']['train']:,} / val {r['data_sizes']['val']:,} / test "
             f"{r['data_sizes']['test']:,}. Teacher (one per seed, {s['teacher_epochs']} epochs, recorded every "
             f"epoch): val {fmt_mean_std(t['val_acc'])}%, test {fmt_mean_std(t['test_acc'])}%.",
             f"The paper's budget rule, {r['budget_rule']}. Pro-KD: tau_max {s['tau_max']:g}, stage_epochs "
             f"{s['stage_epochs']}, reduction {s['reduction']}; RCO {s['rco_anchors']} anchors."]
    for h, c in r["capacities"].items():
        lines += ["", f"### student MLP-{h}", "",
                  "| method | val % (last) | test % (last) | test % at best val | test diff vs KD [95% CI] "
                  "| diff vs no KD [95% CI] | teacher epochs trained | teacher forward images | wall s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, e in c["students"].items():
            cost = e["cost"]
            wall = sum(e["wall_s"]) / len(e["wall_s"])
            lines.append(f"| {m} | {fmt_mean_std(e['val_acc'])} | {fmt_mean_std(e['test_acc'])} | "
                         f"{fmt_mean_std(e['test_acc_at_best'])} | {fmt_interval(e['diff_vs_kd'])} | "
                         f"{fmt_interval(e['diff_vs_no_kd'])} | {cost.get('teacher_epochs_trained', 0)} | "
                         f"{cost.get('teacher_forward_images', 0):,} | {wall:.1f} |")
        lines += ["", f"Verdict MLP-{h} (paired 95% intervals of the last-epoch test accuracy; Pro-KD = replay): "
                  + "; ".join(f"{claim}: {v['outcome']} ({fmt_interval(v['diff'])})"
                              for claim, v in c["verdict"].items())
                  + f". Pro-KD online vs replay: largest |test difference| over seeds "
                  f"{c['online_minus_replay_max_abs']:.2f} points"
                  + (" (the online teacher retraces the recorded one)." if c["online_minus_replay_max_abs"] == 0
                     else ".")]
    lines += ["", "Intervals: paired 95% t intervals over seeds (mean difference [low, high]); what they cover: "
              f"{r['interval_covers']}. 'reproduced': the interval lies above 0; 'reversed': below 0; 'not "
              "resolved': it includes 0. mean +- std over seeds. Teacher epochs trained / forward images: the "
              "first seed's run cost (its summary's `cost`); the teacher-output cache is shared within the study, so "
              "the first run that follows a checkpoint pays its forward pass and later ones read it (online Pro-KD's "
              "retrained teacher has the recorded weights, so it reads them too). wall s: mean seconds per run, "
              "teacher training and cache builds included.",
              f"Total wall time {r['wall_time_s']:.0f} s (predicted {r['predicted_wall_time_s']:.0f} s), "
              f"{r['threads']} thread(s). Command: `{r['command']}`."]
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    from matplotlib.ticker import MaxNLocator

    caps = list(r["capacities"].items())
    fig, axes = plt.subplots(1, len(caps), figsize=(6 * len(caps), 4), squeeze=False)
    for ax, (h, c) in zip(axes[0], caps, strict=True):
        t = r["teacher"]["curve"]
        ax.plot(range(1, len(t) + 1), t, "k--", lw=1.5, label="teacher")
        for m, e in c["students"].items():
            curves = e["curve"]
            n = min(len(cv) for cv in curves)
            online = m == "Pro-KD online"  # drawn over replay (identical when the teacher retraces its trajectory)
            ax.plot(range(1, n + 1), [sum(cv[i] for cv in curves) / len(curves) for i in range(n)], lw=1.2,
                    label=m, ls=":" if online else "-", marker="x" if online else "o", ms=4)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation accuracy % (mean over seeds)")
        ax.set_title(f"MLP-{h} student, {r['dataset']}, {r['seeds']} seeds")
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
