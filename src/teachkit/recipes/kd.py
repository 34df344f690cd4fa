"""Two-stage KD: a frozen teacher (from a checkpoint or trained first in the same run), then a student.

The student's loss is the ``kd`` section's :class:`~teachkit.losses.DistillObjective` (CE plus weighted
distillation losses). Training stages a method needs first (HSAKD's teacher heads) run through the engine
in their own sub-folder, with exact resume, before the student starts.

A distillation term that swamps the labels is a warning after the first epoch: on the first steps of epoch 1
the gradient of each weighted term on the student's weights is measured next to the label term's (CE, or the
squared error of real-valued targets), and a method whose gradient is more than 200x the label term's (the
shipped weights give about 1-60x) is named with the ratio and the weight to lower (paper gammas were tuned for
CIFAR ResNets; FitNet's gamma 100 collapsed an MLP to the majority class). Loss *values* are not compared:
Hinton KD's T^2 factor makes its value large by design, so that its gradient matches CE's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from teachkit import distributed
from teachkit.config import RunConfig
from teachkit.data import Splits
from teachkit.data.text import tokenizer_of
from teachkit.engine import Callback, OptimConfig, Trainer, load_checkpoint
from teachkit.engine.checkpoint import strip, write_json
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, DistillLoss, DistillObjective, build_objective, needs_of
from teachkit.models import Tapped
from teachkit.options import from_mapping
from teachkit.recipes.common import RunResult, folder_wall_time
from teachkit.recipes.context import RunContext
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TEACHER_DIR, TeacherSource, declare_teacher_use
from teachkit.recipes.teacher_cache import TeacherOutputs, ViewTeacherOutputs, run_teacher_outputs
from teachkit.types import Progress, StepOutput, TrainingStage

#: a distillation term whose gradient on the student's weights is this many times the label term's is warned about
DOMINANCE = 200.0
#: the steps of epoch 1 whose per-term gradients are measured
PROBE_STEPS = 4
#: the names a label term has in the objective's terms (classification, real-valued targets)
LABEL_TERMS = ("ce", "l2")


def method_terms(terms: Mapping[str, Any], methods: Sequence[str]) -> dict[str, Any]:
    """The label term (``label``) and each method's terms summed (``crd.s`` + ``crd.t`` -> ``crd``)."""
    out: dict[str, Any] = {}
    for key in LABEL_TERMS:
        if key in terms:
            out["label"] = terms[key]
    for method in methods:
        parts = [v for k, v in terms.items() if k == method or k.startswith(f"{method}.")]
        if parts:
            out[method] = sum(parts[1:], parts[0])
    return out


class GradientProbe:
    """Gradient norms of the label term and of each method's weighted terms on the student's weights, over the
    first ``steps`` steps of epoch 1 (one extra backward per term there, none afterwards)."""

    def __init__(self, student: nn.Module, methods: Sequence[str], steps: int = PROBE_STEPS) -> None:
        self.params = [p for p in student.parameters() if p.requires_grad]
        self.methods = list(methods)
        self.steps = steps
        self.calls = 0
        self.norms: dict[str, list[Tensor]] = {}
        #: how the label term is named in messages: CE, or the squared error of real-valued targets
        self.label_name = "CE"

    def __call__(self, terms: Mapping[str, Tensor], progress: Progress) -> None:
        if progress.epoch != 0 or self.calls >= self.steps or not self.params or not torch.is_grad_enabled():
            return
        self.calls += 1
        groups = method_terms(terms, self.methods)
        if "label" not in groups:  # a method that replaces CE: nothing to compare with
            self.steps = 0
            return
        self.label_name = "CE" if "ce" in terms else "squared-error"
        for name, value in groups.items():
            if not (isinstance(value, Tensor) and value.requires_grad):
                continue
            try:
                grads = torch.autograd.grad(value, self.params, retain_graph=True, allow_unused=True)
            except RuntimeError:  # a graph that cannot be walked twice (a compiled backward): measure nothing
                self.steps, self.norms = 0, {}
                return
            squares = [g.detach().float().pow(2).sum() for g in grads if g is not None]
            norm = torch.stack(squares).sum().sqrt() if squares else torch.zeros(())
            self.norms.setdefault(name, []).append(norm)

    def ratios(self) -> dict[str, float]:
        """Each method's gradient norm over the label term's: the median over the measured steps (one host read);
        empty without a label term."""
        if "label" not in self.norms or len(self.norms) < 2:
            return {}
        label = torch.stack(self.norms["label"])
        names = [n for n in self.norms if n != "label"]
        values = torch.stack([(torch.stack(self.norms[n]) / label).median() for n in names]).tolist()
        return {n: v for n, v in zip(names, values, strict=True) if math.isfinite(v)}


def dominant_terms(ratios: Mapping[str, float], weights: Mapping[str, float], limit: float = DOMINANCE,
                   label: str = "CE") -> list[str]:
    """Warnings for methods whose gradient on the student's weights is more than ``limit`` x the label term's
    (``ratios``: method -> ratio), each naming the ratio and a ``kd.gamma`` that brings it back to ``limit``."""
    out = []
    for method, ratio in ratios.items():
        if not ratio > limit:
            continue
        gamma = weights.get(method)
        change = (f"lower kd.gamma.{method} (now {gamma:g}) to about {gamma * limit / ratio:.2g} or less"
                  if gamma else f"lower kd.gamma.{method}")
        out.append(f"on the first steps of epoch 1 the gradient of the {method} term on the student's weights is "
                   f"{ratio:,.0f}x the {label} term's (over {limit:g}x: the labels barely steer this student); "
                   f"{change}")
    return out


class FirstEpochCheck(Callback):
    """Warns after epoch 1 when a method's gradient dwarfs the label term's (:func:`dominant_terms`)."""

    def __init__(self, probe: GradientProbe, weights: Mapping[str, float], limit: float = DOMINANCE) -> None:
        self.probe, self.weights, self.limit = probe, dict(weights), limit

    def on_epoch_end(self, trainer: Trainer, record: dict) -> None:
        if record.get("epoch") == 1:
            for message in dominant_terms(self.probe.ratios(), self.weights, self.limit, self.probe.label_name):
                trainer.warn(message)


def build_distill_objective(ctx: RunContext, student: nn.Module,
                            teacher: nn.Module) -> tuple[DistillObjective, Tapped, Tapped]:
    """The objective for ``kd.method``, built from probed taps of one dummy batch (2 samples, eval mode);
    each side is asked only for the taps the methods read of it."""
    student_needs, teacher_needs = needs_of(ctx.cfg.kd.methods)
    s_tap = Tapped(student, want=student_needs, side="student")
    t_tap = Tapped(teacher, want=teacher_needs, side="teacher")
    probe = ctx.splits.train.x[:2]
    with torch.no_grad():
        was = student.training
        student.eval()
        s_probe, t_probe = s_tap(probe), t_tap(probe)
        student.train(was)
    for line in inferred_taps(s_tap, t_tap):
        if ctx.cfg.train.progress and distributed.is_main():
            print(f"teachkit: {line}", file=sys.stderr)
    objective = build_objective(ctx.cfg.kd, s_probe, t_probe, num_classes=ctx.splits.num_classes,
                                num_samples=len(ctx.splits.train), teacher_model=t_tap)
    return objective.to(ctx.device), s_tap, t_tap


def inferred_taps(*taps: Tapped) -> list[str]:
    """One line per side whose ``embedding`` tap was inferred (``student: embedding tap inferred as the input of
    'head' (the last nn.Linear)``): printed when the objective is built and kept in the summary's ``notes``."""
    return [f"{t.side}: embedding tap inferred as the input of {t.inferred!r} (the last nn.Linear)"
            for t in taps if t.inferred is not None]


def check_tokenizers(ctx: RunContext) -> None:
    """Methods comparing token-level tensors (hidden states, attention maps) need one tokenizer for teacher and
    student: a one-line ConfigError when the data carries the teacher's own tokenisation. A causal LM's logits are
    per token too: with two tokenizers only a vocabulary-agnostic method (``uld``) compares them."""
    options = ctx.cfg.data.options or {}
    if not options.get("teacher_tokenizer"):
        return
    if hasattr(ctx.splits.train.x, "token_targets"):  # per-token logits over two vocabularies
        aligned = [m for m in ctx.cfg.kd.methods if not LOSSES.get(m).vocabulary_agnostic]
        student = (tokenizer_of(ctx.splits.train.x, "student") or {}).get("name", options.get("tokenizer"))
        if aligned:
            raise ConfigError(f"kd.method={aligned[0]} compares per-token distributions over one vocabulary, but "
                              f"data.options.teacher_tokenizer={options['teacher_tokenizer']!r} gives the teacher "
                              f"another tokenizer than the student's ({student!r}); use kd.method=uld (Universal "
                              "Logit Distillation) or one tokenizer")
    token_level = [m for m in ctx.cfg.kd.methods if LOSSES.get(m).token_level]
    if token_level:
        raise ConfigError(f"kd.method={token_level[0]} compares token-level tensors, so teacher and student need one "
                          f"tokenizer, but data.options.teacher_tokenizer={options['teacher_tokenizer']!r} differs "
                          f"from data.options.tokenizer={options.get('tokenizer')!r}; use a logit method (kd, dkd, "
                          "...) or one tokenizer")


def cached_teacher(ctx: RunContext, t_tap: Tapped, objective: DistillObjective) -> TeacherOutputs:
    """The frozen teacher's outputs for the student's batches: cached once when ``teacher.cache`` and the run
    allow it, per epoch for augmented views (:mod:`teachkit.recipes.teacher_cache`; the trainer takes
    ``outputs.callbacks()``), else computed per batch."""
    transforms = any(type(m).transform_batch is not DistillLoss.transform_batch for m in objective.methods.values())
    return run_teacher_outputs(ctx, t_tap, needs_of(ctx.cfg.kd.methods)[1], transforms, views=True)


def teacher_forward_cost(outputs: TeacherOutputs, trainer: Trainer) -> dict[str, int]:
    """Teacher forwards done this session and saved by the cache (the per-batch forwards it replaced), over all
    processes (a collective under torchrun: every process calls it). Each process counts the forwards its own
    teacher ran (its share of every batch; a cache it filled itself: the whole transfer set) and the view cache
    the rows it read, so both are summed; the static cache saves every sample the run has seen (already global)."""
    views = isinstance(outputs, ViewTeacherOutputs)
    own = torch.tensor([outputs.forwards, outputs.forwards_saved(trainer.samples_seen) if views else 0],
                       dtype=torch.float64)
    forwards, reads = (int(v) for v in distributed.all_reduce_sum(own).tolist())
    return {"teacher_forward_images": forwards,
            "teacher_forwards_saved": reads if views else outputs.forwards_saved(trainer.samples_seen)}


def run_stage(ctx: RunContext, stage: TrainingStage) -> None:
    """Train ``stage`` through the engine in ``run_dir/<stage.name>`` (resumed exactly after a crash), or
    load it when that folder holds a finished stage; then ``stage.finish()``."""
    folder = ctx.run_dir / stage.name
    last = folder / "checkpoints" / "last.safetensors"
    if (folder / "summary.json").is_file() and last.is_file():
        tensors, _ = load_checkpoint(last)
        for name, module in stage.modules.items():
            module.load_state_dict(strip(f"{name}/", tensors))
    else:
        splits = ctx.full_splits() if stage.data == "full" else ctx.splits
        optim = from_mapping(OptimConfig, stage.optim, f"{stage.name}.optim")
        evaluator = stage.evaluator(splits, ctx.cfg.data.eval_batch_size)
        trainer = Trainer(stage.modules, stage.step, ctx.batches(splits, stage.batch_size), optim, evaluator, folder,
                          loop=ctx.loop(epochs=stage.epochs, save_every=0, select_metric=None, select_mode="auto"),
                          meta={"stage": stage.name}, callbacks=ctx.user_callbacks(),
                          resume=ctx.resume, desc=f"{ctx.cfg.name} {stage.name}")
        while not trainer.done:
            trainer.run_epoch()
        trainer.finish()
    stage.finish()


@RECIPES.register("kd", "two-stage KD: frozen teacher (checkpoint or trained first), then the student")
def distill(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
            run_dir: Path | None = None) -> RunResult:
    """Distil ``cfg.model`` from the teacher with loss ``kd.method``; the teacher is never updated."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    check_tokenizers(ctx)
    source = TeacherSource(ctx, regression_ok=all(LOSSES.get(m).regression_ok for m in cfg.kd.methods))
    teacher, teacher_state = source.frozen()
    ctx.seed()
    student = ctx.model()
    objective, s_tap, t_tap = build_distill_objective(ctx, student, teacher)
    stages = objective.training_stages(t_tap, s_tap)
    for stage in stages:
        run_stage(ctx, stage)

    outputs = cached_teacher(ctx, t_tap, objective)
    probe = GradientProbe(student, cfg.kd.methods, steps=0 if ctx.compiles else PROBE_STEPS)

    def step(batch, progress):
        seen = objective.transform_batch(batch)  # keeps the original samples first
        t_out = outputs(seen)
        s_out = s_tap(seen.x)
        # the training metrics read the original samples' outputs (all rows: one per target token in translation)
        shown = s_out.logits if seen is batch else s_out.logits[:batch.size]
        terms = objective(s_out, t_out, seen, progress)
        probe(terms, progress)
        return StepOutput(terms, shown)

    meta = ctx.meta("+".join(cfg.kd.methods))
    meta["teacher"] = {"epoch": teacher_state.get("epoch"), "loss": teacher_state.get("loss"),
                       **{k: v for k, v in teacher_state.items() if k.startswith(("val_", "test_"))},
                       "inference": source.inference}
    trainer = ctx.trainer({"model": student, "objective": objective}, step, meta=meta,
                          callbacks=[FirstEpochCheck(probe, objective.weights), *outputs.callbacks()],
                          frozen={"teacher": teacher})
    source.report(trainer)
    while not trainer.done:
        trainer.run_epoch()
    notes = inferred_taps(s_tap, t_tap)
    result = trainer.finish(**({"notes": notes} if notes else {}), teacher_cache=outputs.report(),
                            cost={"teacher_epochs_trained": source.epochs_trained, "student_epochs": cfg.train.epochs,
                                  **teacher_forward_cost(outputs, trainer),
                                  # every session of the student, its in-command teacher and training stages
                                  "wall_time_s": trainer.wall_time + sum(
                                      folder_wall_time(ctx.run_dir / name)
                                      for name in [*([] if source.given else [TEACHER_DIR]),
                                                   *(stage.name for stage in stages)])})
    write_json(ctx.run_dir / "teacher.json", meta["teacher"])
    return RunResult(ctx.run_dir, result.summary, student, result.history)


declare_teacher_use("kd", "frozen")
