"""Neutral types every layer shares: batches, taps, training progress, step outputs, evaluators.

Nothing here knows about datasets, models, losses or the engine: this module imports only torch, so
every layer may import it (the layer order is in docs/design.md).

- :class:`Batch`: ``x`` is a tensor or a mapping of tensors (token ids, masks, decoder inputs), ``y``
  any target (class ids, floats, start/end positions, token sequences), ``index`` each sample's
  position in its split (CRD's memory bank reads it).
- :class:`Taps`: what a model exposes to a distillation loss (logits, embedding, stage maps, named extras).
- :class:`Progress`: where training is (epoch, step), for warm-ups and schedules inside losses.
- :class:`StepOutput`: what a step function returns to the engine.
- :class:`Evaluator`: how a task measures a model (accuracy, F1, BLEU, ...) and which metric selects.
- :class:`BatchSource`: any reproducible source of batches per (seed, epoch).
- :class:`TrainingStage`: a training run a distillation method needs before the student trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import torch
from torch import Tensor, nn

#: A model's input: one tensor, or a mapping of named tensors passed as keyword arguments.
Inputs = Tensor | Mapping[str, Tensor]


def map_inputs(x: Inputs, fn: Callable[[Tensor], Tensor]) -> Inputs:
    """``fn`` applied to the input tensor, or to every tensor of a mapping."""
    if isinstance(x, Tensor):
        return fn(x)
    return {k: fn(v) if isinstance(v, Tensor) else v for k, v in x.items()}


def call_model(model: nn.Module, x: Inputs) -> Any:
    """``model(x)`` for a tensor input, ``model(**x)`` for a mapping of named inputs."""
    if isinstance(x, Mapping):
        return model(**x)
    return model(x)


def num_rows(x: Inputs) -> int:
    """The batch dimension of an input tensor, or of the first tensor of a mapping."""
    if isinstance(x, Tensor):
        return int(x.shape[0])
    return int(next(v for v in x.values() if isinstance(v, Tensor)).shape[0])


def upcast(t: Tensor) -> Tensor:
    """``t`` in float32, or unchanged when it already is float32 or float64: losses compute in at least
    float32 (bf16/fp16 activations under autocast) and keep float64 when they are given float64."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


class Batch(NamedTuple):
    """One mini-batch: inputs ``x`` (tensor or mapping of tensors), targets ``y``, and ``index``, each
    sample's position in its split."""

    x: Inputs
    y: Any
    index: Tensor

    @property
    def size(self) -> int:
        """The number of samples (rows of ``index``; a method may show the model more rows, e.g. rotations)."""
        return int(self.index.shape[0])

    def rows(self, start: int, stop: int) -> Batch:
        """Samples ``start:stop`` of this batch (tokenised inputs are trimmed to their longest sequence)."""
        x = self.x
        part = x[start:stop] if isinstance(x, Tensor) or not isinstance(x, Mapping) or hasattr(x, "rows") else \
            {k: v[start:stop] if isinstance(v, Tensor) else v for k, v in x.items()}
        if hasattr(part, "token_targets"):  # inputs that carry token-level targets (parallel text): theirs, packed
            y = part.token_targets()
        else:
            y = self.y[start:stop] if isinstance(self.y, Tensor) else self.y
        return Batch(part, y, self.index[start:stop])

    @property
    def items(self) -> int:
        """What a loss averages over: the samples, or the target tokens when the inputs carry token-level targets
        (parallel text, whose ``y`` is packed: one entry per target token). Gradient accumulation weighs each
        chunk by its share of these."""
        return int(self.y.shape[0]) if hasattr(self.x, "token_targets") and isinstance(self.y, Tensor) else self.size

    def chunks(self, size: int) -> list[Batch]:
        """This batch as consecutive pieces of at most ``size`` samples (gradient accumulation)."""
        if self.size <= size:
            return [self]
        return [self.rows(i, i + size) for i in range(0, self.size, size)]

    def map_x(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        """The same batch with ``fn`` applied to its input tensor(s)."""
        return Batch(map_inputs(self.x, fn), self.y, self.index)


@dataclass
class Taps:
    """What a model exposes to distillation losses, read by :class:`teachkit.models.Tapped`.

    ``logits``: the model's output; ``embedding``: the classifier's input (the pooled penultimate feature,
    flattened); ``stages`` / ``stages_pre``: each stage's post- / pre-activation map; ``extra``: named
    module inputs/outputs (``model.taps.extra``) and fields of a structured model output (a Hugging Face
    ``ModelOutput``'s ``hidden_states``, ``attentions``, ...).
    """

    logits: Tensor
    embedding: Tensor | None = None
    stages: list[Tensor] = field(default_factory=list)
    stages_pre: list[Tensor] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        """The tap ``name``: one of the four fields above or an ``extra`` entry (None when absent)."""
        if name in ("logits", "embedding", "stages", "stages_pre"):
            return getattr(self, name)
        return self.extra.get(name)


@dataclass(frozen=True)
class Progress:
    """Where training is: ``epoch`` counts from 0; ``fraction`` of all steps done, in [0, 1)."""

    epoch: int
    step: int
    epochs: int
    steps_per_epoch: int

    @property
    def fraction(self) -> float:
        return (self.epoch * self.steps_per_epoch + self.step) / max(1, self.epochs * self.steps_per_epoch)

    @property
    def epoch_float(self) -> float:
        """Epochs done, fractional (epoch 2, half way -> 2.5): for per-step warm-ups."""
        return self.epoch + self.step / max(1, self.steps_per_epoch)


@dataclass
class StepOutput:
    """What a step function returns: named loss ``terms`` (the engine backpropagates their sum),
    ``outputs`` for the evaluator's training metrics (classification: the logits of the batch's samples),
    and optional ``metrics``: per-batch sums (device tensors) that the engine adds up over the epoch and
    divides by the number of samples."""

    terms: dict[str, Tensor]
    outputs: Any = None
    metrics: dict[str, Tensor] = field(default_factory=dict)


class Evaluator:
    """How a task measures a model. Subclasses set ``primary`` and implement :meth:`evaluate`.

    ``evaluate(model)`` returns metrics per split, ``{"val": {...}, "test": {...}}``; the engine selects
    the best checkpoint on ``val`` by ``train.select_metric`` (default: ``primary``), maximised or
    minimised as :meth:`direction` says. ``train_metrics(outputs, batch)`` gives per-batch *sums* (device
    tensors, no host sync) that the engine accumulates over an epoch and divides by the samples seen.
    """

    primary: str = "acc"
    #: what a training sample is, for throughput on the progress line (translation: ``sent/s``; GLUE: ``seq/s``);
    #: None: by the inputs (``img`` for image batches, ``seq`` for token or 1-D sequences, ``row`` for table rows)
    sample_unit: str | None = None

    def metric_names(self) -> tuple[str, ...]:
        """The metrics :meth:`evaluate` reports for every split."""
        return (self.primary,)

    def direction(self, metric: str) -> Literal["max", "min"]:
        """Whether a larger (``max``) or smaller (``min``) value of ``metric`` is better."""
        low = ("loss", "error", "rmse", "mae", "perplexity", "ppl")
        return "min" if any(metric == m or metric.endswith("_" + m) for m in low) else "max"

    def is_percent(self, metric: str) -> bool:
        """Whether ``metric`` is a percentage (printed with %): accuracies, top-5 and F1 by default."""
        return metric in ("acc", "top5", "f1") or metric.endswith("_acc") or metric.startswith("acc_")

    def format(self, metric: str, value: float) -> str:
        """``value`` of ``metric`` as a log line shows it: ``88.20%`` for percentages, else 4 significant digits."""
        return f"{value:.2f}%" if self.is_percent(metric) else f"{value:.4g}"

    def evaluate(self, model: nn.Module) -> dict[str, dict[str, float]]:
        raise NotImplementedError

    def train_metrics(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        return {}

    def report(self) -> dict[str, Any]:
        """Facts of the last evaluation for the run summary that are not metrics (a causal LM's generation
        speed: measured time, so not a per-epoch metric); default none."""
        return {}

    def check_model(self, model: nn.Module) -> None:
        """Raise a one-line error when this task cannot measure ``model`` (checked before a run starts, on a
        model built on the meta device); default: any model."""


class BatchSource(Protocol):
    """Any source of training batches that is reproducible per (seed, epoch): ``len()`` steps per epoch,
    ``batches(epoch)`` yields them (the same batches whenever it is asked for the same epoch)."""

    def __len__(self) -> int: ...

    def batches(self, epoch: int) -> Iterator[Batch]: ...


@dataclass
class TrainingStage:
    """A training run a distillation method needs before the student trains, run by the recipe through
    the engine (NaN guard, checkpoints, exact resume, progress) in the run folder's ``name`` sub-folder.

    HSAKD's teacher heads: ``modules`` = {"model": heads}, ``step`` = joint-label CE with the frozen teacher.
    ``optim`` holds optimiser fields (``teachkit.engine.OptimConfig``); ``batch_size`` None = the run's;
    ``data``: ``full`` = the teacher's full training split, ``student`` = the student's transfer set;
    ``evaluator(splits, eval_batch_size)`` builds the stage's evaluator; ``finish()`` runs once the stage's
    weights are in place (trained now or loaded from a finished stage).
    """

    name: str
    modules: dict[str, nn.Module]
    step: Callable[[Batch, Progress], StepOutput]
    evaluator: Callable[[Any, int], Evaluator]
    optim: dict[str, Any]
    epochs: int
    batch_size: int | None = None
    data: Literal["full", "student"] = "full"
    finish: Callable[[], None] = lambda: None
