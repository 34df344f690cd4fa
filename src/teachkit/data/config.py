"""The ``data`` section of a run: which dataset, how it is split, batched and augmented."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from teachkit.data.augment import AugmentOptions
from teachkit.data.raw import DATASETS
from teachkit.errors import ConfigError
from teachkit.options import Options, option


@dataclass
class DataConfig(Options):
    """Which dataset (``name``, files under ``root``, source ``options``), how it is split (``val_fraction``
    of the training data, seeded by ``split_seed``; the student's transfer set: ``train_subset``,
    ``omit_classes``, ``few_shot``, drawn with ``subset_seed`` when set, else with the split generator after
    carving), batched and augmented."""

    name: str = "digits"
    #: the dataset's file or folder (a path: relative to the config file that writes it, see ``option(path=True)``)
    root: str | None = option(None, path=True)
    val_fraction: float = option(0.1, gt=0.0, lt=1.0)
    split_seed: int = 0
    train_subset: int | None = None
    #: seeds the student's transfer-set draws (``train_subset``, ``few_shot``); None: the split generator
    subset_seed: int | None = None
    omit_classes: list[int] = option(factory=list)
    few_shot: int = option(0, ge=0)
    augment: Literal["auto", "none", "crop", "flip", "crop_flip"] = "auto"
    #: how ``augment``'s crop pads: ``pad_mode`` zeros (torchvision's RandomCrop) or reflect (L2T-DLF)
    augment_options: AugmentOptions = option(factory=AugmentOptions)
    #: text: batches of similar lengths (sorted within seeded groups of 50 batches), so less padding
    group_by_length: bool = False
    batch_size: int = option(128, ge=1)
    eval_batch_size: int = option(1000, ge=1)
    options: dict[str, Any] = option(factory=dict)

    def validate(self) -> None:
        DATASETS.entry(self.name)  # unknown names: one line with did-you-mean
        if self.few_shot and not self.omit_classes:
            raise ConfigError(f"{self.key('few_shot')}={self.few_shot} needs {self.key('omit_classes')} (the classes "
                              f"to keep {self.few_shot} of)")

    def full(self) -> DataConfig:
        """The same data without the student's transfer-set options: what a teacher trains on."""
        return dataclasses.replace(self, train_subset=None, subset_seed=None, omit_classes=[], few_shot=0)

    @property
    def reduced(self) -> bool:
        """True when the student's transfer set is smaller than the training split (subset or omitted classes)."""
        return self.train_subset is not None or bool(self.omit_classes)
