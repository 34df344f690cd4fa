"""Datasets as in-memory tensors: sources, seeded stratified splits, batched augmentation, batch loader.

``load_splits(name, ...)`` gives normalised :class:`Splits`; ``BatchLoader`` yields reproducible
:class:`Batch` es per (seed, epoch); ``make_augment`` picks the batched :class:`Augment` for a dataset.
"""

from teachkit.data.augment import AUGMENT_KINDS, Augment, make_augment
from teachkit.data.base import Batch, Splits, TensorSplit
from teachkit.data.config import DataConfig
from teachkit.data.loader import BatchLoader
from teachkit.data.raw import DATASETS, RawDataset, load_raw
from teachkit.data.splits import load_splits, splits_for
from teachkit.registry import import_all

import_all(__name__, __path__)  # every data source registers itself

__all__ = ["AUGMENT_KINDS", "DATASETS", "Augment", "Batch", "BatchLoader", "DataConfig", "RawDataset", "Splits",
           "TensorSplit", "load_raw", "load_splits", "make_augment", "splits_for"]
