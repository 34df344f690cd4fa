"""Small-scale Pro-KD study: a large teacher-student capacity gap, every trajectory method, paired seeds.

Default: MNIST-1D (generated locally), a wide CNN teacher (cnn1d, 128 channels) recorded every epoch,
trained anew for every seed (teacher seed = the seed; val/test fixed by data.split_seed), a tiny MLP
student (one hidden layer of 32) on the full training split; per seed: no KD, KD, TAKD
(TA: cnn1d with 8 channels), RCO, Annealing-KD, Pro-KD (replay of the recorded teacher) and an
early-stopped teacher (ESKD, teacher epoch E/3), all at the same student epochs (student and TA lr 0.01,
teacher lr 0.05). Prints a Markdown table (mean +- std over seeds, paired difference against KD) and
plots student validation accuracy against epoch for each method next to the teacher's own curve.
The intervals cover teacher seed and student seed (``COVERS``). <= 20 minutes on 2 CPU cores.

    python benchmarks/prokd_study.py [--data mnist1d|mnist5k] [--seeds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from teachkit.config import from_dict
from teachkit.experiments.stats import mean_std, paired_interval
from teachkit.recipes import RECIPES
from teachkit.recipes.common import device_of, load_data, with_changes

SETTINGS = {
    "mnist1d": {"teacher": {"name": "cnn1d", "options": {"channels": 128}},
                "student": {"name": "mlp", "options": {"hidden": [32]}},
                "assistant": {"name": "cnn1d", "options": {"channels": 8}},
                "teacher_epochs": 30, "student_epochs": 40, "tau_max": 5, "stage_epochs": 6, "lr": 0.05,
                "student_lr": 0.01},
    "mnist5k": {"teacher": {"name": "lenet", "options": {"channels": [64, 128], "fc": 1024}},
                "student": {"name": "mlp", "options": {"hidden": [16]}},
                "assistant": {"name": "lenet", "options": {"channels": [6, 16], "fc": 84}},
                "teacher_epochs": 15, "student_epochs": 20, "tau_max": 5, "stage_epochs": 3, "lr": 0.05,
                "student_lr": 0.01},
}
METHODS = ["no KD", "KD", "TAKD", "RCO", "Annealing-KD", "Pro-KD", "ESKD"]
COVERS = ("per seed s, a new teacher (init and batch order, train.seed=s, recorded every epoch) and new students "
          "(train.seed=s: init and batch order; every student uses the full training split, so there is no "
          "subset to draw); val/test fixed (data.split_seed=0); paired within a seed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=sorted(SETTINGS), default="mnist1d")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="runs/prokd_study")
    ap.add_argument("--quick", action="store_true", help="2-3 epochs, 1 seed: a smoke test")
    args = ap.parse_args()
    s = dict(SETTINGS[args.data])
    if args.quick:
        s.update(teacher_epochs=3, student_epochs=4, stage_epochs=1, tau_max=3)
        args.seeds = 1
    out_dir = Path(args.out) / f"{args.data}-{time.strftime('%Y%m%d-%H%M%S')}"
    optim = {"name": "sgd", "lr": s["lr"], "momentum": 0.9, "weight_decay": 5e-4, "schedule": "cosine"}
    student_optim = {**optim, "lr": s["student_lr"]}  # students and the TA; lr 0.05 collapsed KD-trained small nets
    base = from_dict({"out_dir": str(out_dir), "data": {"name": args.data, "batch_size": 64},
                      "model": s["student"], "optim": student_optim,
                      "train": {"epochs": s["student_epochs"], "progress": False},
                      "teacher": {"model": s["teacher"], "optim": optim, "epochs": s["teacher_epochs"]},
                      "prokd": {"mode": "replay", "tau_max": s["tau_max"], "stage_epochs": s["stage_epochs"],
                                "reduction": "mean"},
                      "rco": {"anchors": 4}, "takd": {"assistant": s["assistant"]},
                      "eskd": {"epoch": max(1, s["teacher_epochs"] // 3)}})
    device = device_of(base)
    splits = load_data(base.data, device)
    t0 = time.perf_counter()
    runs = {m: [] for m in METHODS}
    curves = {m: [] for m in METHODS}
    teachers = []
    recipe_of = {"no KD": "train", "KD": "kd", "TAKD": "takd", "RCO": "rco", "Annealing-KD": "annealing",
                 "Pro-KD": "prokd", "ESKD": "eskd"}
    print(f"intervals cover: {COVERS}")
    bar = tqdm(total=args.seeds * (1 + len(METHODS)), desc="runs", dynamic_ncols=True)
    for seed in range(args.seeds):
        teacher_cfg = with_changes(base, name=f"seed{seed}-teacher", model=base.teacher.model, optim=base.teacher.optim,
                                   train={"epochs": s["teacher_epochs"], "save_every": 1, "seed": seed})
        teacher = RECIPES.get("train")(teacher_cfg, splits=splits, run_dir=out_dir / f"seed{seed}" / "teacher")
        teachers.append(teacher)
        bar.update(1)
        recorded = {"checkpoint": str(teacher.run_dir)}
        for method in METHODS:
            cfg = with_changes(base, name=f"seed{seed}-{recipe_of[method]}", train={"seed": seed}, teacher=recorded)
            result = RECIPES.get(recipe_of[method])(cfg, splits=splits,
                                                    run_dir=out_dir / f"seed{seed}" / recipe_of[method])
            runs[method].append(result.summary)
            curves[method].append([r["val"]["acc"] for r in result.history])
            bar.update(1)
    bar.close()
    kd = [r["test_acc"] for r in runs["KD"]]
    results = {"dataset": args.data, "seeds": args.seeds, "setting": s, "wall_time_s": time.perf_counter() - t0,
               "interval_covers": COVERS,
               "teacher": {"val_acc": [t.summary["val_acc"] for t in teachers],
                           "test_acc": [t.summary["test_acc"] for t in teachers],
                           "curve": [sum(t.history[i]["val"]["acc"] for t in teachers) / len(teachers)
                                     for i in range(min(len(t.history) for t in teachers))]},
               "students": {m: {"test_acc": [r["test_acc"] for r in rs], "val_acc": [r["val_acc"] for r in rs],
                                "test_acc_at_best": [r["test_acc_at_best"] for r in rs],
                                "cost": rs[0].get("cost", {}),
                                "diff_vs_kd": paired_interval([r["test_acc"] for r in rs], kd) if m != "KD" else None,
                                "curve": curves[m]} for m, rs in runs.items()}}
    text = render(results)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.md").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out_dir / "curves.png")
    if not args.quick:
        keep = Path(__file__).parent / "results"
        keep.mkdir(exist_ok=True)
        (keep / f"prokd_study_{args.data}.md").write_text(text + "\n")
        plot(results, keep / f"prokd_study_{args.data}.png")
    print(f"results: {out_dir / 'results.md'}, plot: {out_dir / 'curves.png'}")


def fmt(values: list[float]) -> str:
    m, sd = mean_std(values)
    return f"{m:.2f} +- {sd:.2f}"


def render(r: dict) -> str:
    s = r["setting"]
    lines = [f"## Pro-KD study: {r['dataset']} ({r['seeds']} seeds); teacher {s['teacher']['name']} "
             f"{s['teacher'].get('options', {})}, student {s['student']['name']} {s['student'].get('options', {})}",
             "", f"Teacher (one per seed): val {fmt(r['teacher']['val_acc'])}%, test {fmt(r['teacher']['test_acc'])}% "
             f"after {s['teacher_epochs']} epochs. Students: {s['student_epochs']} epochs each.", "",
             "| method | val % (last) | test % (last) | test % at best val | test diff vs KD [95% CI] "
             "| teacher epochs trained | teacher forward images |", "|---|---|---|---|---|---|---|"]
    for m, e in r["students"].items():
        diff = "" if e["diff_vs_kd"] is None else "{:+.2f} [{:+.2f}, {:+.2f}]".format(*e["diff_vs_kd"])
        cost = e["cost"]
        lines.append(f"| {m} | {fmt(e['val_acc'])} | {fmt(e['test_acc'])} | {fmt(e['test_acc_at_best'])} | {diff} | "
                     f"{cost.get('teacher_epochs_trained', 0)} | {cost.get('teacher_forward_images', 0):,} |")
    lines += ["", "A teacher is trained per seed and recorded every epoch; Pro-KD, RCO and ESKD replay it, KD and "
              "Annealing-KD use its final epoch, TAKD distils a TA from it. mean +- std over seeds; intervals are "
              f"paired 95% t intervals. What varies with the seed (what they cover): {r['interval_covers']}. "
              f"Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    t = r["teacher"]["curve"]
    ax.plot(range(1, len(t) + 1), t, "k--", lw=1.5, label="teacher")
    for m, e in r["students"].items():
        curves = e["curve"]
        n = min(len(c) for c in curves)
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
        ax.plot(range(1, n + 1), mean, lw=1.2, label=m)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy % (mean over seeds)")
    ax.set_title(f"Pro-KD study on {r['dataset']}")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
