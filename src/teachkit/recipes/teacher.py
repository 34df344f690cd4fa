"""Where a run's teacher comes from, one way for every recipe.

:class:`TeacherSource` reads the ``teacher`` section: a checkpoint (``teacher.checkpoint``: a file or a run
folder, ``teacher.select`` last|best) or a teacher trained in this command into ``run_dir/teacher`` on the
full training split (reused when that run finished, resumed exactly when it did not). It hands the
teacher out as

- :meth:`TeacherSource.frozen`: the final teacher, frozen (kd, takd, eskd's students);
- :meth:`TeacherSource.recorded`: its recorded trajectory (every ``save_every`` epochs: eskd, checkpoint
  search, Pro-KD replay);
- :meth:`TeacherSource.trajectory`: a :class:`TeacherTrajectory` giving "the teacher after epoch k", either
  ``online`` (a teacher :class:`~teachkit.engine.Trainer` advanced epoch by epoch alongside the student,
  recording every epoch plus the initialisation as epoch 0) or ``replay`` (the sha256-verified checkpoints
  of a recorded run). Both hand out the same weights, so students that follow them are identical.

Every teacher loaded from a checkpoint or trajectory is checked against the student's data: same class count
and input shape, and no possible overlap of its training data with the student's val/test split
(:mod:`teachkit.recipes.leakage`; ``teacher.allow_overlap=true`` runs anyway and :meth:`TeacherSource.report`
records it). Trajectory manifests are validated (:mod:`teachkit.recipes.manifest`). A teacher whose
checkpoint records other normalisation statistics than the student's data gets inputs re-normalised to its
own (:meth:`~teachkit.models.FrozenTeacher.renormalise`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from teachkit.config import RunConfig, with_changes
from teachkit.data.raw import is_regression
from teachkit.engine import Trainer, Trajectory
from teachkit.engine.checkpoint import load_checkpoint, strip
from teachkit.engine.trainer import channels_last
from teachkit.errors import CheckpointError, ConfigError
from teachkit.losses import LOSSES
from teachkit.models import FrozenTeacher
from teachkit.models.inference import inference_teacher
from teachkit.models.taps import spec_of
from teachkit.recipes.common import check_compatible, load_model
from teachkit.recipes.context import RunContext
from teachkit.recipes.leakage import OVERLAP_KEY, check_overlap
from teachkit.recipes.manifest import read_trajectory
from teachkit.recipes.standalone import label_step, train_model

TEACHER_DIR = "teacher"
T = TypeVar("T")


def teacher_run_config(cfg: RunConfig, save_every: int = 1) -> RunConfig:
    """The config of a teacher trained in-command: full train split, its own model/optim/epochs/loss, and on text
    with ``data.options.teacher_tokenizer`` its own tokenisation."""
    t = cfg.teacher
    data: dict[str, Any] = {"train_subset": None, "omit_classes": [], "few_shot": 0}
    options = cfg.data.options or {}
    if options.get("teacher_tokenizer"):  # text: the teacher trains on its own tokenisation
        data["options"] = {**options, "tokenizer": options["teacher_tokenizer"], "teacher_tokenizer": None}
    seed = cfg.train.seed if t.seed is None else t.seed
    return with_changes(cfg, name=f"{cfg.name}/teacher", model=t.model, optim=t.optim,
                        train={"epochs": t.epochs, "loss": t.loss, "save_every": save_every, "seed": seed}, data=data)


#: recipe name -> how it reads its teacher: ``frozen`` (the final checkpoint) or ``recorded`` (a trajectory
#: saved every epoch); filled by :func:`declare_teacher_use` next to each recipe. A sweep trains such a teacher
#: once, as its own run, and hands it to every student naming it as ``teacher.checkpoint``
TEACHER_USES: dict[str, tuple[str, Callable[[RunConfig], bool]]] = {}
#: recipe name -> checks of its teacher settings that need no data (a sweep runs them before anything runs)
TEACHER_CHECKS: dict[str, Callable[[RunConfig], Any]] = {}


def declare_teacher_use(recipe: str, use: str, when: Callable[[RunConfig], bool] = lambda cfg: True,
                        check: Callable[[RunConfig], Any] | None = None) -> None:
    """Say that ``recipe`` reads a :class:`TeacherSource` teacher as ``frozen`` or ``recorded`` (whenever
    ``when(cfg)``), so a sweep may train that teacher first and pass it as ``teacher.checkpoint``: the same
    weights as a teacher trained in-command. ``check(cfg)`` raises the ConfigError the recipe would raise for
    teacher settings that cannot work (run by a sweep's plan, before anything runs)."""
    if use not in ("frozen", "recorded"):
        raise ValueError(f"teacher use {use!r}: frozen or recorded")
    TEACHER_USES[recipe] = (use, when)
    if check is not None:
        TEACHER_CHECKS[recipe] = check


#: recipe name -> the sub-runs it would train itself that a sweep may train once and share (TAKD's assistant):
#: (what, ``make(cfg) -> (recipe, config)``, the dotted option naming the finished run folder, ``when(cfg)``)
SHARED_RUNS: dict[str, list[tuple[str, Callable, str, Callable[[RunConfig], bool]]]] = {}


def declare_shared_run(recipe: str, what: str, make: Callable[[RunConfig], tuple[str, RunConfig]], option_key: str,
                       when: Callable[[RunConfig], bool] = lambda cfg: True) -> None:
    """Say that ``recipe`` trains a sub-run ``what`` (recipe and config from ``make(cfg)``) unless the option
    ``option_key`` names a finished run folder of it: a sweep trains that sub-run once for every run whose
    ``make`` gives the same config, and sets the option."""
    SHARED_RUNS.setdefault(recipe, []).append((what, make, option_key, when))


def teacher_use(recipe: str, cfg: RunConfig) -> str | None:
    """How run ``cfg`` of ``recipe`` reads a teacher a sweep may train first: ``frozen``, ``recorded`` or None
    (no such teacher, one already given as ``teacher.checkpoint``, or one the recipe must train itself)."""
    use, when = TEACHER_USES.get(recipe, (None, None))
    if use is None or cfg.teacher.checkpoint or not when(cfg):
        return None
    return use


#: the checkpoint state key holding the training split's per-channel statistics ``{"mean": [...], "std": [...]}``
STATS_KEY = "normalisation"


def recorded_stats(state: Mapping[str, Any]) -> tuple[list[float] | None, list[float] | None]:
    """The (mean, std) a checkpoint's inputs were normalised with; (None, None) when it does not record them."""
    stats = state.get(STATS_KEY)
    if not isinstance(stats, Mapping):
        return None, None
    mean, std = stats.get("mean"), stats.get("std")
    ok = all(isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
             for v in (mean, std))
    return (mean, std) if ok else (None, None)


def result_line(who: str, folder: Path, summary: Mapping[str, Any]) -> str:
    """``teacher finished: RUN  val 98.10%  test 97.90%  (best val ... at epoch k, test there ...)  12.3s``."""
    m = summary.get("select_metric", "acc")
    percent = summary.get("select_metric_percent", m == "acc")

    def fmt(key: str) -> str:
        value = summary.get(key, float("nan"))
        text = f"{value:.2f}%" if percent else f"{value:.4g}"
        return text if m == "acc" else f"{m} {text}"

    return (f"{who} finished: {folder}  val {fmt(f'val_{m}')}  test {fmt(f'test_{m}')}  (best val "
            f"{fmt(f'best_val_{m}')} at epoch {summary.get('best_epoch')}, test there {fmt(f'test_{m}_at_best')})"
            f"  {summary.get('wall_time_s', 0.0):.1f}s")


def resolve_teacher_inference(setting: str, methods: Sequence[str], device: torch.device, precision: str) -> str:
    """``teacher.inference`` for a run: ``fold`` or ``plain`` as given; ``auto`` is ``fold`` (measured with
    ``benchmarks/throughput.py --levers``: the folded teacher's KD step 1.09x the plain one's on a 2-core CPU in fp32,
    where the teacher's BatchNorms were ~5% of the step; in bf16 it also saves the per-step weight casts; the
    students' accuracy is unchanged, ``benchmarks/levers_study.py``). ``methods``, ``device`` and ``precision``
    (fp32 / bf16 / fp16) are what a finer rule may read; methods that read the teacher's BatchNorms keep them
    (:meth:`TeacherSource.as_inference_model`) and recipes that call its submodules run it plain."""
    del methods, device, precision  # read by no rule yet
    if setting not in ("auto", "fold", "plain"):
        raise ConfigError(f"teacher.inference={setting!r} is not allowed; choose auto, fold or plain")
    return "fold" if setting == "auto" else setting


def trajectory_file_sha(path: Path) -> str | None:
    """The manifest sha256 of ``path`` when it is a checkpoint listed in its folder's trajectory manifest."""
    if not path.is_file() or not (path.parent / Trajectory.MANIFEST).is_file():
        return None
    trajectory, _ = read_trajectory(path.parent)
    for entry in trajectory.entries:
        if (path.parent / entry["file"]).resolve() == path.resolve():
            return entry["sha256"]
    return None


def trajectory_mode(mode: str, given: bool) -> str:
    """The trajectory mode for ``prokd.mode`` (one rule for Pro-KD, Annealing-KD and RCO): ``auto`` replays
    ``teacher.checkpoint`` when given (``given``) and trains the teacher online otherwise; an explicit ``online``
    with a teacher checkpoint, or ``replay`` without one, is refused."""
    if mode == "auto":
        return "replay" if given else "online"
    if mode == "online" and given:
        raise ConfigError("prokd.mode=online: online mode trains the teacher itself, but teacher.checkpoint is "
                          "set; to follow that recorded teacher set prokd.mode=replay (or auto)")
    if mode == "replay" and not given:
        raise ConfigError("prokd.mode=replay: replay mode needs teacher.checkpoint, the run folder of a teacher "
                          "trained with train.save_every=1; or use prokd.mode=auto")
    if mode not in ("online", "replay"):
        raise ConfigError(f"prokd.mode={mode!r} is not allowed; choose auto, online or replay")
    return mode


class TeacherSource:
    """The teacher of the run ``ctx`` (see the module docstring)."""

    def __init__(self, ctx: RunContext, regression_ok: bool = False) -> None:
        if is_regression(ctx.splits.task) and not regression_ok:
            raise ConfigError(f"this distillation needs class scores, but dataset {ctx.splits.name!r} has real-valued "
                              f"targets (task {ctx.splits.task}); distil them with kd.method=logit_l2 or teachkit "
                              "run prokd / annealing (output regression), or train with train.loss=l2")
        self.ctx = ctx
        self.cfg = ctx.cfg.teacher
        self.folder = ctx.run_dir / TEACHER_DIR
        #: why the teacher may overlap the student's val/test data, when ``teacher.allow_overlap`` let it run
        self.overlap: str | None = None
        #: how :meth:`frozen` runs the teacher (``teacher.inference`` resolved), for the run summary
        self.inference: dict[str, Any] = {"mode": "plain"}

    @property
    def given(self) -> bool:
        """True when ``teacher.checkpoint`` names the teacher; False when this command trains it."""
        return bool(self.cfg.checkpoint)

    @property
    def epochs_trained(self) -> int:
        """Teacher epochs this run trains (0 for a given teacher), for the cost report."""
        return 0 if self.given else self.cfg.epochs

    def _train_here(self, save_every: int) -> Path:
        if not (self.folder / "summary.json").is_file():
            t, say = self.cfg, self.ctx.cfg.train.progress  # --quiet: only the command's own summary line
            if say:
                tqdm.write(f"{self.ctx.cfg.name}: no teacher.checkpoint given: training the teacher first "
                           f"({t.model.name}, {t.epochs} epochs, loss {t.loss}, full training split) -> {self.folder}")
            own_tokens = bool((self.ctx.cfg.data.options or {}).get("teacher_tokenizer"))  # loads its own splits
            result = train_model(teacher_run_config(self.ctx.cfg, save_every), resume=self.ctx.resume,
                                 splits=None if own_tokens else self.ctx.full_splits(), run_dir=self.folder)
            if say:
                tqdm.write(result_line("teacher", self.folder, result.summary))
        return self.folder

    def _check(self, state: Mapping[str, Any], where: Path) -> None:
        """Class count, input shape and data overlap of a loaded teacher against the student's data."""
        check_compatible(dict(state), self.ctx.splits)
        reason = check_overlap(state, self.ctx.cfg.data, self.cfg.allow_overlap, repr(str(where)))
        if reason is not None:
            self.overlap = reason

    def _renormalise(self, frozen: FrozenTeacher, state: Mapping[str, Any]) -> FrozenTeacher:
        splits = self.ctx.splits
        frozen.renormalise(splits.mean, splits.std, *recorded_stats(state))
        return frozen

    def report(self, trainer: Trainer) -> None:
        """Record a teacher let through by ``teacher.allow_overlap`` in ``trainer``'s checkpoints and summary
        (``teacher_overlap_allowed``) and warn once; nothing when there is no overlap."""
        if self.overlap is not None:
            trainer.meta[OVERLAP_KEY] = self.overlap
            trainer.warn(f"teacher.allow_overlap=true: {self.overlap}; its val/test figures are not clean")

    def with_taps(self, model: nn.Module) -> nn.Module:
        """``model`` with ``teacher.taps`` over the taps it was built with (those its checkpoint recorded): new
        taps for a teacher trained without them, no retraining (the weights are untouched)."""
        if self.cfg.taps:
            model.tap_spec = spec_of(model).updated(self.cfg.taps, "teacher.taps")
        return model

    def checkpoint(self) -> Path:
        """Where the final teacher is: ``teacher.checkpoint`` (a file or a run folder), or the run folder of
        the teacher trained in this command (trained now unless it finished before)."""
        return Path(self.cfg.checkpoint) if self.given else self._train_here(save_every=0)

    def frozen(self, inference: bool = True) -> tuple[FrozenTeacher, dict[str, Any]]:
        """The final teacher (``teacher.select``), frozen, on the run's device; checked against the student's
        data. Returns the module and its checkpoint's state (epoch, val/test metrics, model, ...). With
        ``inference`` it runs as ``teacher.inference`` resolves (:meth:`inference_mode`); without, plain (a
        recipe that calls the teacher's submodules itself: seqkd's beam search)."""
        path = self.checkpoint()
        sha = trajectory_file_sha(path) if self.given else None
        if sha is not None:  # a trajectory checkpoint (eskd): read through its manifest's sha256
            sidecar = path.with_suffix(".json")
            try:
                recorded = json.loads(sidecar.read_text()).get("sha256") if sidecar.is_file() else None
            except (OSError, ValueError, AttributeError):
                recorded = None
            if recorded != sha:  # otherwise load_model's sidecar check is the manifest's
                load_checkpoint(path, expect_sha256=sha)
        model, state = load_model(path, self.cfg.select, self.ctx.device)
        self._check(state, path)
        model = self.with_taps(model)  # before folding: a tapped layer's output is not folded into
        mode = self.inference_mode() if inference else "plain"
        if mode == "fold":
            model = self.as_inference_model(model)
        frozen = FrozenTeacher(channels_last(model, self.ctx.channels_last), inference=mode == "fold")
        #: the resolved ``teacher.inference`` and the BatchNorms folded, for the run summary
        self.inference = {"mode": mode, **({"bn_folded": getattr(model, "bn_folded", 0),
                                            "dtype": str(frozen.compute_dtype or "torch.float32")[6:]}
                                           if mode == "fold" else {})}
        return self._renormalise(frozen, state), state

    def inference_mode(self) -> str:
        """``teacher.inference`` resolved for this run (:func:`resolve_teacher_inference`)."""
        ctx = self.ctx
        return resolve_teacher_inference(self.cfg.inference, ctx.cfg.kd.methods, ctx.device, ctx.precision.name)

    def as_inference_model(self, model: nn.Module) -> nn.Module:
        """``model`` folded and cast for ``teacher.inference=fold``: BatchNorms folded on two training inputs
        (none for non-tensor inputs), except those a method reads (OFD's ``stages_bn``); weights in the run's
        compute dtype and layout."""
        x = self.ctx.splits.train.x
        example = x[:2].to(self.ctx.device) if isinstance(x, Tensor) else None
        reads_bn = any(LOSSES.get(m).reads_teacher_model for m in self.ctx.cfg.kd.methods)
        return inference_teacher(model, example, dtype=self.ctx.precision.dtype,
                                 channels_last=self.ctx.channels_last,
                                 keep=spec_of(model).stages_bn if reads_bn else ())

    def recorded(self) -> Trajectory:
        """The teacher's recorded trajectory: from ``teacher.checkpoint``'s run folder, or trained now
        (``train.save_every=1``) into ``run_dir/teacher``."""
        folder = Path(self.cfg.checkpoint) if self.given else self._train_here(save_every=1)
        trajectory, state = read_trajectory(folder / "trajectory")  # validated; the last checkpoint's state
        self._check(state, folder)
        return trajectory

    def learned(self, file: str, load: Callable[[Path], T | None], train: Callable[[], T]) -> T:
        """A teacher that is not a classifier (L2T-DLF's loss teacher), stored as ``file``: loaded from
        ``teacher.checkpoint`` (that file, or a run folder holding it); otherwise, on resume, reused from this
        run's folder when ``load`` accepts it (returns None for an unfinished one); otherwise trained now."""
        if self.given:
            path = Path(self.cfg.checkpoint)
            path = path / file if path.is_dir() else path
            if not path.is_file():
                raise CheckpointError(f"teacher checkpoint {str(path)!r} does not exist")
            teacher = load(path)
            if teacher is None:
                raise CheckpointError(f"teacher checkpoint {str(path)!r} holds an unfinished teacher")
            return teacher
        own = self.ctx.run_dir / file
        if self.ctx.resume and own.is_file():
            teacher = load(own)
            if teacher is not None:
                return teacher
        return train()

    def mode(self, mode: str) -> str:
        """The trajectory mode for ``prokd.mode`` (:func:`trajectory_mode`)."""
        return trajectory_mode(mode, self.given)

    def trajectory(self, mode: str) -> TeacherTrajectory:
        """The teacher after any epoch: ``online`` (trained in this run, interleaved with the student) or
        ``replay`` (the recorded run folder ``teacher.checkpoint``); ``auto`` picks by ``teacher.checkpoint``."""
        ctx = self.ctx
        mode = self.mode(mode)
        if mode == "online":
            tcfg = teacher_run_config(ctx.cfg)
            child = ctx.child(TEACHER_DIR, tcfg, ctx.full_splits())
            child.seed()
            model = child.model()
            trainer = child.trainer(model, label_step(model, tcfg.train), meta=child.meta(tcfg.train.loss),
                                    desc=f"{ctx.cfg.name} teacher")
            assert trainer.trajectory is not None
            if 0 not in trainer.trajectory.epochs:
                trainer.trajectory.add(0, {}, trainer.weights(), {**trainer.meta, "epoch": 0})
            frozen = FrozenTeacher(channels_last(self.with_taps(copy.deepcopy(model)), ctx.channels_last))
            return TeacherTrajectory(frozen, trainer.trajectory, tcfg.train.epochs, trainer)
        trajectory = self.recorded()  # validated and checked against the student's data
        model, state = load_model(trajectory.path(trajectory.epochs[-1]), device=ctx.device)
        frozen = self._renormalise(FrozenTeacher(channels_last(self.with_taps(model), ctx.channels_last)), state)
        return TeacherTrajectory(frozen, trajectory, max(trajectory.epochs))


class TeacherTrajectory:
    """Teacher weights after any epoch k (0 = initialisation), as one frozen module whose weights change.

    With a ``trainer`` (online) the teacher is trained on demand up to the epoch asked for; without one
    (replay) the recorded checkpoints are loaded (sha256-verified).
    """

    def __init__(self, frozen: FrozenTeacher, trajectory: Trajectory, total_epochs: int,
                 trainer: Trainer | None = None) -> None:
        self.frozen, self.trajectory, self.total_epochs, self.trainer = frozen, trajectory, total_epochs, trainer
        self.mode = "online" if trainer is not None else "replay"
        self.loaded_epoch: int | None = None

    @property
    def epochs(self) -> list[int]:
        """The teacher epochs with a checkpoint (online: all of 0..E)."""
        if self.trainer is not None:
            return list(range(self.total_epochs + 1))
        return self.trajectory.epochs

    @property
    def epochs_trained(self) -> int:
        """Teacher epochs this run has trained, over every session (online: the teacher trainer's epoch, which a
        resume restores from its checkpoint; replay: 0), for the cost report."""
        return self.trainer.epoch if self.trainer is not None else 0

    def advance_to(self, epoch: int) -> None:
        """Online: train the teacher until it has completed ``epoch`` epochs."""
        if self.trainer is None:
            return
        while self.trainer.epoch < epoch:
            self.trainer.run_epoch()

    def at(self, epoch: int) -> FrozenTeacher:
        """The frozen teacher with its weights after ``epoch`` epochs."""
        if epoch == self.loaded_epoch:
            return self.frozen
        if self.trainer is not None:
            self.advance_to(epoch)
            if self.trainer.epoch == epoch:
                self.frozen.module.load_state_dict(self.trainer.model.state_dict())
                self.loaded_epoch = epoch
                return self.frozen
        if epoch not in self.epochs:
            raise CheckpointError(f"teacher trajectory has no checkpoint after epoch {epoch} (it has "
                                  f"{self.epochs[:3]}...{self.epochs[-3:]}); record every epoch with "
                                  f"train.save_every=1")
        tensors, _ = self.trajectory.load(epoch)
        try:
            self.frozen.module.load_state_dict(strip("model/", tensors))
        except RuntimeError as e:
            raise CheckpointError(f"teacher checkpoint {str(self.trajectory.path(epoch))!r} does not fit the "
                                  f"trajectory's model: {str(e).splitlines()[0][:200]}") from None
        self.loaded_epoch = epoch
        return self.frozen

    def finish(self) -> None:
        """Online: train the teacher's remaining epochs (if any) and write its summary."""
        if self.trainer is not None:
            self.advance_to(self.total_epochs)
            self.trainer.finish()
