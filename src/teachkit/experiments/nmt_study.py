"""No KD vs word-level KD vs sequence-level KD on a generated translation task (``teachkit demo --task nmt``).

Protocol: the offline ``toy_translation`` corpus (a synthetic grammar with word reordering and agreement, a few
hundred word types; its own train / valid / test splits, generated deterministically). One teacher -- a small
Transformer trained with CE on the training split -- then, for every seed s, three LSTM-attention students with
the same initialisation, batch order and budget (``train.seed=s``):

- no KD: CE on the references;
- word-level KD (Kim & Rush 2016, Sec. 3.1): per target token, (1 - alpha) NLL + alpha KL(teacher || student)
  with teacher forcing on the gold prefix, alpha 0.5, T 1 (``teachkit distill``, ``kd.method=kd``);
- sequence-level KD (Kim & Rush 2016, Sec. 3.2): CE on the teacher's beam translations of the training sources
  (``teachkit run seqkd``; decoded once, cached, read by every seed).

Selection: each run's best epoch by validation BLEU (the ``valid`` split; the teacher never sees valid or test);
test BLEU is only reported, two ways (sacreBLEU on detokenised text and tokenised BLEU). What the spread and the
intervals cover: student seeds only (initialisation, dropout and batch order); the teacher, the corpus and the
splits are fixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from teachkit.config import RunConfig, from_dict
from teachkit.errors import ConfigError
from teachkit.experiments.paired import paired_seed_runs, plot_epoch_bands, publish
from teachkit.experiments.progress import RunsProgress
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, paired_interval
from teachkit.recipes import RECIPES, distill, train_model
from teachkit.recipes.common import device_of, load_data, with_changes

METHODS = ("no-kd", "word-kd", "seq-kd")
LABELS = {"no-kd": "no KD (CE on references)", "word-kd": "word-level KD (alpha 0.5, T 1)",
          "seq-kd": "sequence-level KD (teacher beam outputs)"}
INTERVAL_COVERS = ("student seeds only (initialisation, dropout and batch order: train.seed=s); one teacher, one "
                   "generated corpus and fixed train/valid/test splits")


@dataclass(frozen=True)
class NMTSetting:
    """Data, models and budgets of the translation study (sized for 2 CPU cores)."""

    train: int = 12000
    valid: int = 300
    test: int = 500
    #: the students' transfer set: this many of the training pairs (the teacher trains on all of them)
    subset: int = 3000
    teacher_epochs: int = 10
    student_epochs: int = 24
    seeds: int = 3
    batch_size: int = 32
    teacher_batch_size: int = 64
    teacher_lr: float = 2e-3
    student_lr: float = 1e-2
    teacher: dict[str, Any] = field(default_factory=lambda: {
        "name": "transformer_seq2seq", "options": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 128,
                                                   "heads": 4, "ffn": 256, "dropout": 0.1}})
    student: dict[str, Any] = field(default_factory=lambda: {
        "name": "lstm_attn", "options": {"layers": 1, "embed_dim": 64, "hidden": 64, "dropout": 0.1}})
    seqkd_beam: int = 4
    options: dict[str, Any] = field(default_factory=dict)

    def quick(self) -> NMTSetting:
        return replace(self, train=400, valid=60, test=60, subset=200, teacher_epochs=2, student_epochs=2, seeds=2,
                       seqkd_beam=2)


def base_config(s: NMTSetting, out_dir: Path) -> RunConfig:
    """The students' config: toy_translation (the students' transfer set a seeded subset of the training pairs),
    LSTM-attention student, AdamW at a constant learning rate with gradient clipping 1 (a decaying rate stalled
    some seeds before their attention aligned); the Transformer teacher: its own learning rate, a one-epoch
    warm-up, then a linear decay."""
    optim = {"name": "adamw", "lr": s.student_lr, "weight_decay": 0.0, "betas": [0.9, 0.98], "schedule": "constant",
             "grad_clip": 1.0}
    teacher_optim = {**optim, "lr": s.teacher_lr, "schedule": "linear", "warmup_epochs": 1.0}
    return from_dict({
        "out_dir": str(out_dir),
        "data": {"name": "toy_translation", "batch_size": s.batch_size, "eval_batch_size": 250,
                 "train_subset": s.subset, "subset_seed": 0,
                 "options": {"train": s.train, "valid": s.valid, "test": s.test, **s.options}},
        "model": s.student, "optim": optim,
        "train": {"epochs": s.student_epochs, "progress": False},
        "teacher": {"model": s.teacher, "optim": teacher_optim, "epochs": s.teacher_epochs},
        "kd": {"method": "kd", "alpha": 0.5, "temperature": 1.0},
        "seqkd": {"mode": "seq", "beam": s.seqkd_beam},
    })


def run_nmt_study(s: NMTSetting, out: str | Path, seeds: int | None = None, title: str = "translation demo") -> dict:
    """Train the teacher once, then per seed the three students; print, write and plot the results."""
    n_seeds = s.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise ConfigError(f"--seeds={n_seeds} is not allowed: must be >= 1")
    out_dir = Path(out) / f"toy_translation-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = base_config(s, out_dir)
    t0 = time.perf_counter()
    full = load_data(cfg.data, device_of(cfg), subset=False)  # the teacher's data: every training pair
    splits = load_data(cfg.data, device_of(cfg))
    vocab = splits.num_classes
    print(f"teachkit {title} on toy_translation (generated grammar, vocabulary {vocab}): {cfg.teacher.model.name} "
          f"teacher {s.teacher_epochs} epochs on {len(full.train)} training pairs, {cfg.model.name} students "
          f"{s.student_epochs} epochs on {len(splits.train)} of them; valid {len(splits.val)}, test "
          f"{len(splits.test)} pairs; {n_seeds} seeds x "
          f"{len(METHODS)} methods -> {out_dir}")
    print(f"intervals cover: {INTERVAL_COVERS}")
    bar = RunsProgress(1 + n_seeds * len(METHODS))
    teacher_dir = out_dir / "teacher"
    teacher = train_model(with_changes(cfg, name="teacher", model=cfg.teacher.model, optim=cfg.teacher.optim,
                                       train={"epochs": s.teacher_epochs},
                                       data={"batch_size": s.teacher_batch_size}),
                          splits=full, run_dir=teacher_dir).summary
    bar.done("teacher", teacher)
    runs, histories = paired_seed_runs(
        with_changes(cfg, teacher={"checkpoint": str(teacher_dir)}),
        {"no-kd": lambda c, d: train_model(c, splits=splits, run_dir=d),
         "word-kd": lambda c, d: distill(c, splits=splits, run_dir=d),
         "seq-kd": lambda c, d: RECIPES.get("seqkd")(c, splits=splits, run_dir=d)},
        n_seeds, out_dir, "bleu", bar.done)
    bar.close()
    results = summarize(s, n_seeds, teacher, runs, histories, time.perf_counter() - t0,
                        {"teacher_train": len(full.train), "train": len(splits.train), "val": len(splits.val),
                         "test": len(splits.test), "vocabulary": vocab})
    text = render(results, title)
    return publish(results, text, out_dir, plot)


def summarize(s: NMTSetting, n_seeds: int, teacher: dict, runs: dict[str, list[dict]],
              histories: dict[str, list[list[float]]], wall: float, sizes: dict[str, int]) -> dict:
    """Per method: test BLEU (both conventions) at the best-on-val epoch, last-epoch BLEU, paired differences."""
    base = [r["test_bleu_at_best"] for r in runs["no-kd"]]
    students = {}
    for method, rs in runs.items():
        at_best = [r["test_bleu_at_best"] for r in rs]
        entry = {"test_bleu_at_best_val": at_best, "test_bleu_last": [r["test_bleu"] for r in rs],
                 "test_bleu_tok_last": [r["test_bleu_tok"] for r in rs],
                 "best_val_bleu": [r["best_val_bleu"] for r in rs], "val_bleu_per_epoch": histories[method],
                 "wall_time_s": sum(r["wall_time_s"] for r in rs),
                 "teacher_forward_sentences": sum(r.get("cost", {}).get("teacher_forward_images", 0) for r in rs)}
        if method != "no-kd":
            entry["diff_vs_no_kd"] = paired_interval(at_best, base)
        if method == "seq-kd":
            entry["teacher_bleu_tok_train"] = rs[0].get("seqkd", {}).get("teacher_bleu_tok_train")
        students[method] = entry
    return {"setting": {**{k: v for k, v in s.__dict__.items() if k != "options"}, "seeds": n_seeds},
            "sizes": sizes, "interval_covers": INTERVAL_COVERS, "wall_time_s": wall,
            "teacher": {"val_bleu": teacher["val_bleu"], "test_bleu": teacher["test_bleu"],
                        "test_bleu_tok": teacher["test_bleu_tok"], "wall_time_s": teacher["wall_time_s"]},
            "students": students}


def render(r: dict, title: str = "translation demo") -> str:
    s, n = r["setting"], r["sizes"]
    t = r["teacher"]
    lines = [f"## teachkit {title}: toy_translation, {s['seeds']} paired seeds (teacher trained on "
             f"{n['teacher_train']} pairs, students on {n['train']} of them; valid {n['val']}, test {n['test']} "
             f"pairs; vocabulary {n['vocabulary']})", "",
             f"Teacher ({s['teacher']['name']}, {s['teacher_epochs']} epochs): val BLEU {t['val_bleu']:.2f}, test "
             f"BLEU {t['test_bleu']:.2f} (tokenised {t['test_bleu_tok']:.2f}), {t['wall_time_s']:.0f} s. Greedy "
             "decoding for every BLEU.", "",
             f"| student ({s['student']['name']}, {s['student_epochs']} epochs) | test BLEU at best val epoch | "
             "test BLEU last epoch | tokenised BLEU last epoch | vs no KD [95% CI] | wall s |",
             "|---|---|---|---|---|---|"]
    for method, e in r["students"].items():
        lines.append(f"| {LABELS[method]} | {fmt_mean_std(e['test_bleu_at_best_val'])} | "
                     f"{fmt_mean_std(e['test_bleu_last'])} | {fmt_mean_std(e['test_bleu_tok_last'])} | "
                     f"{fmt_interval(e.get('diff_vs_no_kd'))} | {e['wall_time_s']:.0f} |")
    seq = r["students"].get("seq-kd", {}).get("teacher_bleu_tok_train")
    if seq is not None:
        lines += ["", f"The teacher's beam translations of the training sources score {seq:.2f} tokenised BLEU "
                      "against the references (what sequence-level KD trains on)."]
    lines += ["", "mean +- std over seeds (sample std); intervals are paired 95% t intervals over seeds; they cover "
              f"{r['interval_covers']}. Total wall time {r['wall_time_s']:.0f} s."]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> Path | None:
    """Validation BLEU per epoch per method (mean over seeds, band = min..max); None without matplotlib."""
    return plot_epoch_bands({m: e["val_bleu_per_epoch"] for m, e in r["students"].items()}, LABELS,
                            {"no-kd": "#999999", "word-kd": "#4c72b0", "seq-kd": "#dd8452"}, path,
                            ylabel="val BLEU (sacreBLEU, greedy)", reference=r["teacher"]["val_bleu"],
                            title=f"toy_translation: {r['setting']['student']['name']} students, "
                                  f"{r['setting']['seeds']} seeds")
