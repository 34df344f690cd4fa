"""Data held in memory: splits of tensors (``Batch`` itself is a neutral type in ``teachkit.types``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from teachkit.types import Batch

__all__ = ["Batch", "Splits", "TensorSplit"]


@dataclass
class TensorSplit:
    """One split held as tensors: ``x`` float32 (N, *input_shape) or tokenised text
    (:class:`~teachkit.data.text.TokenFeatures`, indexed by rows like a tensor), ``y`` int64 (N,) class ids,
    float32 (N,) / (N, d) regression targets, or int64 (N, 2) answer start/end positions (question answering)."""

    x: Any
    y: Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx: Tensor) -> TensorSplit:
        return TensorSplit(self.x[idx], self.y[idx])


@dataclass
class Splits:
    """Train / val / test splits of one dataset, normalised with train statistics.

    ``val`` is the source's own val split or a fixed, seeded, class-stratified slice carved from the
    training data; model selection and early stopping read it, never ``test``. ``task`` names the
    evaluator that measures models on it (``classification``, ``binary``, ``regression``: float targets,
    ``num_classes`` = output width); ``default_augment`` is the augmentation ``data.augment=auto``
    picks. ``mean`` / ``std`` (shape (C,), channel = dim 1 of ``x``) are the statistics every split was
    normalised with; ``None`` when not normalised.
    ``omitted`` lists classes removed from ``train`` only (zero-/few-shot KD).
    """

    name: str
    train: TensorSplit
    val: TensorSplit
    test: TensorSplit
    num_classes: int
    default_augment: str = "none"
    task: str = "classification"
    mean: Tensor | None = None
    std: Tensor | None = None
    #: classes left out of ``train`` (zero-/few-shot KD); val and test keep them
    omitted: tuple[int, ...] = ()
    #: the ``data`` section (:class:`~teachkit.data.DataConfig`) these splits were made from, so a run given
    #: them records the real dataset; ``None`` for splits built by hand
    config: Any = None
    #: further evaluation splits beside ``test`` (MNLI's mismatched dev set: ``{"test_mm": ...}``)
    extra_test: dict[str, TensorSplit] = field(default_factory=dict)
    #: one-line warnings about the data (:attr:`~teachkit.data.raw.RawDataset.warnings`, one class): a run
    #: prints each (not under ``--quiet``) and keeps it in its summary's ``warnings`` and ``data_notes``
    warnings: tuple[str, ...] = ()
    #: the label name of each class id when the source knows them (:attr:`RawDataset.class_names`)
    class_names: tuple[str, ...] | None = None
    #: the input feature names in column order when the source knows them (a table's feature columns)
    feature_names: tuple[str, ...] | None = None

    def eval_splits(self) -> dict[str, TensorSplit]:
        """The splits evaluators measure: ``val``, ``test`` and the ``extra_test`` ones."""
        return {"val": self.val, "test": self.test, **self.extra_test}

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    def to(self, device: torch.device | str) -> Splits:
        def mv(s: TensorSplit) -> TensorSplit:
            return TensorSplit(s.x.to(device), s.y.to(device))

        return replace(self, train=mv(self.train), val=mv(self.val), test=mv(self.test),
                       extra_test={k: mv(v) for k, v in self.extra_test.items()},
                       mean=None if self.mean is None else self.mean.to(device),
                       std=None if self.std is None else self.std.to(device))
