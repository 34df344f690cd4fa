"""L2T-DLF's MNIST experiment on the full MNIST (50,000 / 10,000 / 10,000), at the paper's student settings.

Wu et al. 2018 (supplement, Sec. 2.1 and 2.4): MLP 784-500-10 (batch 20) and LeNet conv5x5(20)-pool-conv5x5(50)-pool-
FC500 (batch 500), momentum SGD lr 0.01, momentum 0.9; teacher Adam lr 1e-4, betas 0.9 / 0.999, eps 1e-8, 60 teacher
steps; dev measure the smooth error (k = 50) on the valid split (the authors' dev set, never test). Per seed and model:

- ``CE``: the same student trained with cross-entropy (the ``train`` recipe);
- ``DLF fixed at Phi_0``: the dynamic loss at the teachers' common start Phi_0 = (I, 0), -p_y / (1 + p_y), no
  teacher training (what the learned teacher adds is the difference to it);
- ``L2T-DLF static / gated / attention``: the ``l2t`` recipe with that teacher model (attention: K = 4).

Every method trains the same student for the same number of epochs on the same batch stream (``train.seed=s``).
Teacher episodes ``continue`` the teacher-training student: ``inner_steps`` differentiated steps, then
``episode_gap`` plain steps under the current teacher, spread over the schedule. Test error is the last epoch's
(no selection on test). What is shorter than the paper (the budget of 2 CPU cores) is printed in the plan and
written with the results: the number of student epochs, and for LeNet the number of teacher steps and the episode
length. Writes ``benchmarks/results/l2t_mnist_full_<models>.{md,json,png}`` (e.g. ``_mlp``).

    python benchmarks/l2t_mnist_full.py [--models mlp,lenet] [--seeds 5] [--threads 1] [--plan] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from teachkit.config import from_dict
from teachkit.experiments.stats import mean_std, paired_interval, pyplot
from teachkit.recipes import RECIPES
from teachkit.recipes.common import load_data
from teachkit.recipes.context import RunContext
from teachkit.recipes.l2t import StudentStateTracker, build_teacher, train_student

RESULTS = Path(__file__).parent / "results"
TRAIN_IMAGES = 50_000
QUICK_IMAGES = 1_000
FIXED = "DLF fixed at Phi_0"
METHODS = ("CE", FIXED, "L2T-DLF static", "L2T-DLF gated", "L2T-DLF attention")
TEACHER_OF = {"L2T-DLF static": "static", "L2T-DLF gated": "gated", "L2T-DLF attention": "attention"}
COVERS = ("student seeds (train.seed=s: the student's and the teacher-training student's initialisation and batch "
          "order, and the teacher model's initialisation); fixed official train/valid/test files; paired within a "
          "seed (every method sees the same initial student and batch stream)")


@dataclass(frozen=True)
class ModelSetting:
    """One student of the paper and the budget it gets here."""

    name: str
    model: dict[str, Any]
    batch_size: int
    epochs: int
    teacher_steps: int
    inner_steps: int
    #: measured on this machine, one thread, full MNIST: s per student epoch (with its val/test evaluation), s per
    #: differentiated inner step (forward, backward and the reverse pass's Hessian-vector product)
    epoch_s: float
    inner_step_s: float
    #: the training images (all of them; ``--quick`` uses a subset)
    train_images: int = TRAIN_IMAGES

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.train_images // self.batch_size)

    @property
    def episode_gap(self) -> int:
        """Plain steps after each episode so that the teacher phase spans the student's whole schedule."""
        return max(0, self.epochs * self.steps_per_epoch // self.teacher_steps - self.inner_steps)

    def expected_s(self, methods: tuple[str, ...] = METHODS) -> float:
        """Expected seconds per seed: every method's student, plus each learned teacher's phase."""
        teacher_phase = self.teacher_steps * self.inner_steps * self.inner_step_s + self.epochs * self.epoch_s * 0.8
        return self.epochs * self.epoch_s * len(methods) + teacher_phase * sum(m in TEACHER_OF for m in methods)


SETTINGS = {
    "mlp": ModelSetting("MLP 784-500-10", {"name": "mlp", "options": {"hidden": [500]}}, batch_size=20, epochs=10,
                        teacher_steps=60, inner_steps=20, epoch_s=8.5, inner_step_s=0.04),
    "lenet": ModelSetting("LeNet 20-50-500", {"name": "lenet"}, batch_size=500, epochs=2, teacher_steps=20,
                          inner_steps=3, epoch_s=36.0, inner_step_s=1.0),
}


def config(s: ModelSetting, out: Path, name: str, seed: int, method: str) -> Any:
    base: dict[str, Any] = {
        "name": name, "out_dir": str(out),
        "data": {"name": "mnist_full", "batch_size": s.batch_size},
        "model": s.model,
        "optim": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "schedule": "constant"},
        "train": {"epochs": s.epochs, "seed": seed, "progress": False, "device": "cpu"},
    }
    if method == "CE":
        base["train"]["loss"] = "ce"
    else:
        base["l2t"] = {"teacher_model": TEACHER_OF.get(method, "static"), "teacher_steps": s.teacher_steps,
                       "inner_steps": s.inner_steps, "episode_gap": s.episode_gap, "memory": "full",
                       "objective": "smooth_error", "smooth_k": 50.0, "teacher_lr": 1e-4,
                       "teacher_betas": [0.9, 0.999], "teacher_eps": 1e-8, "dev_batch_size": 500, "attention_k": 4}
    return from_dict(base)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_one(s: ModelSetting, key: str, method: str, seed: int, out: Path, splits: Any) -> dict[str, Any]:
    name = f"{key}-{method.replace(' ', '_')}-seed{seed}"
    t0 = time.perf_counter()
    cfg = config(s, out, name, seed, method)
    if method == FIXED:  # the final-student phase alone, under the untrained static teacher
        ctx = RunContext.open(cfg, splits=splits)
        fit, _ = train_student(ctx, build_teacher("static", splits.num_classes, StudentStateTracker.dim),
                               meta={"loss": "dlf-identity"})
        summary, run_dir = fit.summary, ctx.run_dir
    else:
        result = RECIPES.get("train" if method == "CE" else "l2t")(cfg, splits=splits)
        summary, run_dir = result.summary, result.run_dir
    return {"model": key, "method": method, "seed": seed, "test_err": 100 - summary["test_acc"],
            "val_err": 100 - summary["val_acc"], "time_s": time.perf_counter() - t0,
            "teacher_log": read_jsonl(run_dir / "teacher_log.jsonl"), "phi_log": read_jsonl(run_dir / "phi_log.jsonl")}


def plan(args: argparse.Namespace, settings: dict[str, ModelSetting]) -> str:
    lines = [f"command: {' '.join([Path(sys.executable).name, *sys.argv])}",
             f"data: mnist_full (train 50,000, val = the file's valid 10,000 (the teacher's dev set), test 10,000); "
             f"{len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}); {torch.get_num_threads()} thread(s)"]
    total = 0.0
    for key, s in settings.items():
        per_seed = s.expected_s(args.methods)
        total += per_seed * len(args.seeds)
        lines.append(f"{key}: {s.name}, batch {s.batch_size}, {s.epochs} epochs ({s.epochs * s.steps_per_epoch:,} "
                     f"steps) for every method; L2T-DLF: {s.teacher_steps} teacher steps of {s.inner_steps} "
                     f"differentiated steps + {s.episode_gap} plain steps; runs: {len(args.methods)} methods x "
                     f"{len(args.seeds)} seeds = {len(args.methods) * len(args.seeds)}; expected "
                     f"{per_seed / 60:.1f} min per seed")
    lines.append(f"expected total: {total / 60:.0f} min (estimated from per-epoch and per-step times measured on "
                 "the 2-core CPU machine, one thread)")
    return "\n".join(lines)


def table(runs: list[dict[str, Any]], key: str) -> list[str]:
    seeds = sorted({r["seed"] for r in runs if r["model"] == key})
    by = {m: {r["seed"]: r for r in runs if r["model"] == key and r["method"] == m} for m in METHODS}
    ce = [by["CE"][s]["test_err"] for s in seeds]
    lines = ["| method | test error % | val error % | Δ test vs CE (95% CI) | dev M (teacher step 1 → last) "
             "| time / seed (s) |", "|---|---|---|---|---|---|"]
    for m in METHODS:
        if len(by[m]) != len(seeds):
            continue
        te, ve = [by[m][s]["test_err"] for s in seeds], [by[m][s]["val_err"] for s in seeds]
        delta = "—" if m == "CE" else "{:+.2f} ({:+.2f}, {:+.2f})".format(*paired_interval(te, ce))
        dev = "—"
        if m in TEACHER_OF:
            first = mean_std([by[m][s]["teacher_log"][0]["dev_objective"] for s in seeds])[0]
            last = mean_std([by[m][s]["teacher_log"][-1]["dev_objective"] for s in seeds])[0]
            dev = f"{first:.4f} → {last:.4f}"
        t = sum(by[m][s]["time_s"] for s in seeds) / len(seeds)
        lines.append(f"| {m} | {'{:.2f} ± {:.2f}'.format(*mean_std(te))} | {'{:.2f} ± {:.2f}'.format(*mean_std(ve))} "
                     f"| {delta} | {dev} | {t:.0f} |")
    lines += ["", "Per seed test error %:", "", "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]
    lines += [f"| {m} | " + " | ".join(f"{by[m][s]['test_err']:.2f}" for s in seeds) + " |"
              for m in METHODS if len(by[m]) == len(seeds)]
    return lines


def verdicts(runs: list[dict[str, Any]], key: str) -> list[str]:
    seeds = sorted({r["seed"] for r in runs if r["model"] == key})
    have = {m for r in runs if r["model"] == key for m in [r["method"]]}
    err = {m: [next(r["test_err"] for r in runs if r["model"] == key and r["method"] == m and r["seed"] == s)
               for s in seeds] for m in METHODS if m in have}
    out = []
    for m in [m for m in METHODS[1:] if m in err and "CE" in err]:
        d, lo, hi = paired_interval(err[m], err["CE"])
        word = "lower error than CE (the paper's direction)" if hi < 0 else \
            "higher error than CE (reversed)" if lo > 0 else "not resolved (the interval includes 0)"
        out.append(f"- {m}: {word}: {d:+.2f} ({lo:+.2f}, {hi:+.2f}) points")
    return out


def dev_curves(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """The teacher-training dev measure M at every teacher step (mean over seeds) per model and teacher."""
    plt = pyplot()
    if plt is None:
        return None
    keys = sorted({r["model"] for r in runs})
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for m in TEACHER_OF:
            logs = [r["teacher_log"] for r in runs if r["model"] == key and r["method"] == m and r["teacher_log"]]
            if not logs:
                continue
            n = min(len(x) for x in logs)
            ax.plot(range(1, n + 1), [sum(x[i]["dev_objective"] for x in logs) / len(logs) for i in range(n)],
                    marker=".", label=m)
        ax.set_xlabel("teacher step")
        ax.set_ylabel("dev smooth error M (mean over seeds)")
        ax.set_title(f"{SETTINGS[key].name} on full MNIST")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(runs: list[dict[str, Any]], args: argparse.Namespace, settings: dict[str, ModelSetting],
           wall: float) -> str:
    lines = ["# L2T-DLF on the full MNIST: cross-entropy vs static / gated / attention teachers", "",
             f"`python benchmarks/l2t_mnist_full.py {shlex.join(sys.argv[1:])}` — one run, {wall / 60:.1f} min on "
             f"{torch.get_num_threads()} CPU thread(s), torch {torch.__version__}."
             + (f" Rows of methods other than {', '.join(args.methods)} come from `{args.merge}` (an earlier run "
                "of the same settings and seeds; every run is deterministic, so the pairing holds)."
                if args.merge else ""),
             "",
             "Data: `mnist_full` (the classic mnist.pkl.gz: 50,000 train, its 10,000 valid images as the validation "
             "split and the teacher's dev set, 10,000 test). Students and optimiser as the paper's supplement "
             "(momentum SGD lr 0.01, m 0.9, constant lr, no weight decay); teacher Adam lr 1e-4, betas 0.9/0.999, "
             "eps 1e-8; dev measure the smooth error (k = 50) on a 500-image dev batch of the validation split; "
             "exact hypergradients (`memory: full`). Error = last-epoch test error in % (no selection on test); "
             "mean ± sample std over seeds; Δ vs CE = paired mean difference with its 95% t interval. "
             f"Intervals cover: {COVERS}.", ""]
    for key, s in settings.items():
        lines += [f"## {s.name}, batch {s.batch_size}", "",
                  f"Budget: {s.epochs} student epoch(s) ({s.epochs * s.steps_per_epoch:,} SGD steps) for every method; "
                  f"L2T-DLF: {s.teacher_steps} teacher steps, each an episode of {s.inner_steps} differentiated steps "
                  f"then {s.episode_gap} plain steps, so the teacher phase spans the student's schedule.", ""]
        lines += table(runs, key) + ["", "Verdict (paired 95% intervals over seeds):", ""] + verdicts(runs, key) + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp,lenet", help="comma-separated: mlp, lenet")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/l2t_mnist_full")
    ap.add_argument("--plan", action="store_true", help="print what it will run and the expected time, then exit")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 teacher steps, 2 seeds, tiny budgets")
    ap.add_argument("--epochs", type=int, help="override every model's student epochs")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    ap.add_argument("--merge", help="a results JSON of an earlier run of the same settings and seeds: its runs of "
                                    "other methods join this run's in the report (e.g. to add a method)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    bad = [k for k in keys if k not in SETTINGS]
    if bad or not keys:
        ap.error(f"--models={args.models!r}: choose from {', '.join(SETTINGS)}")
    settings = {k: SETTINGS[k] for k in keys}
    args.methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not args.methods or any(m not in METHODS for m in args.methods):
        ap.error(f"--methods={','.join(args.methods)!r}: choose from {', '.join(METHODS)}")
    if args.epochs:
        settings = {k: replace(s, epochs=args.epochs) for k, s in settings.items()}
    if args.quick:
        settings = {k: replace(s, epochs=1, teacher_steps=2, inner_steps=2, train_images=QUICK_IMAGES)
                    for k, s in settings.items()}
        args.seeds = min(args.seeds, 2)
    args.seeds = list(range(args.seeds))
    print(plan(args, settings), flush=True)
    if args.plan:
        return
    t0 = time.perf_counter()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    data = config(next(iter(settings.values())), out, "data", 0, "CE").data
    if args.quick:  # a 1,000-image transfer set: the smoke test checks the pipeline, not the numbers
        data = replace(data, train_subset=QUICK_IMAGES)
    splits = load_data(data, torch.device("cpu"))
    runs = []
    for key, s in settings.items():
        for seed in args.seeds:
            for method in args.methods:
                r = run_one(s, key, method, seed, out, splits)
                runs.append(r)
                print(f"{key} seed {seed} {method:<18} test err {r['test_err']:5.2f}%  val err {r['val_err']:5.2f}%  "
                      f"({r['time_s']:.0f} s)", flush=True)
    wall = time.perf_counter() - t0
    if args.merge:  # earlier runs of the other methods (same settings and seeds: deterministic, so paired)
        earlier = json.loads(Path(args.merge).read_text())
        runs = [r for r in earlier["runs"] if r["method"] not in args.methods] + runs
    text = report(runs, args, settings, wall)
    print(text)
    dest = out if args.quick else RESULTS
    dest.mkdir(parents=True, exist_ok=True)
    stem = "l2t_mnist_full_" + "_".join(settings)  # one file set per model list: separate runs never collide
    (dest / f"{stem}.md").write_text(text + "\n")
    (dest / f"{stem}.json").write_text(json.dumps({"settings": {k: asdict(s) for k, s in settings.items()},
                                                   "covers": COVERS, "runs": runs}, indent=1) + "\n")
    png = dev_curves(runs, dest / f"{stem}.png")
    print(f"results: {dest / (stem + '.md')}" + (f", plot: {png}" if png else ""))


if __name__ == "__main__":
    main()
