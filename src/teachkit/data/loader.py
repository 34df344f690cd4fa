"""Mini-batches sliced from tensors held in memory (on any device), reproducible per (seed, epoch).

No ``DataLoader`` and no per-sample work: each batch is one index into the stored tensors. The order
and the augmentation of epoch ``e`` depend on ``(seed, e)`` only, so a run resumed at an epoch boundary
sees exactly the batches it would have seen, without saving RNG state, and two methods run with the same
seed see the same batch order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import torch

from teachkit.data.augment import Augment
from teachkit.data.base import Batch, TensorSplit
from teachkit.errors import ConfigError
from teachkit.types import BatchSource


def epoch_generator(seed: int, epoch: int, stream: str) -> torch.Generator:
    """A CPU generator seeded from a hash of (seed, epoch, stream): distinct streams never share state."""
    digest = hashlib.blake2b(f"teachkit:{stream}:{seed}:{epoch}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


class BatchLoader:
    """Batches of ``split``: ``Batch(x, y, index)`` with ``index`` the samples' positions in the split.

    The permutation comes from a generator seeded by (seed, epoch); the augmentation from a second one
    seeded by (seed, epoch), so batch order does not depend on whether augmentation is on.
    """

    def __init__(self, split: TensorSplit, batch_size: int, shuffle: bool, seed: int,
                 augment: Augment | None = None, drop_last: bool = False,
                 lengths: torch.Tensor | None = None) -> None:
        if drop_last and len(split) < batch_size:
            raise ConfigError(f"batch_size={batch_size} with drop_last leaves no batch: the split holds "
                              f"{len(split)} samples")
        self.split = split
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.augment = augment
        self.drop_last = drop_last
        #: per-sample sequence lengths: length-grouped batching (see :meth:`order`)
        self.lengths = None if lengths is None else lengths.detach().cpu()

    def __len__(self) -> int:
        n = len(self.split)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """The sample positions of ``epoch`` in visiting order (CPU int64)."""
        n = len(self.split)
        if not self.shuffle:
            return torch.arange(n)
        perm = torch.randperm(n, generator=epoch_generator(self.seed, epoch, "order"))
        if self.lengths is None:
            return perm
        return self._grouped(perm, epoch)

    #: samples per length group, in batches (Hugging Face's LengthGroupedSampler uses 50)
    GROUP_BATCHES = 50

    def _grouped(self, perm: torch.Tensor, epoch: int) -> torch.Tensor:
        """Length-grouped order: the shuffled samples in groups of ``GROUP_BATCHES`` batches, each group sorted
        by length (longest first, ties in shuffled order), then the batches in a seeded random order: batches
        hold similar lengths (less padding) and stay random from epoch to epoch."""
        size = self.GROUP_BATCHES * self.batch_size
        groups = [perm[i:i + size] for i in range(0, len(perm), size)]
        ordered = torch.cat([g[torch.sort(-self.lengths[g], stable=True).indices] for g in groups])
        batches = list(torch.split(ordered, self.batch_size))
        shuffle = torch.randperm(len(batches), generator=epoch_generator(self.seed, epoch, "length-groups"))
        return torch.cat([batches[i] for i in shuffle.tolist()])

    def batches(self, epoch: int) -> Iterator[Batch]:
        """The ``len(self)`` batches of ``epoch``, on the split's device."""
        device = self.split.x.device
        order = self.order(epoch).to(device)
        aug_gen = epoch_generator(self.seed, epoch, "augment") if self.augment is not None else None
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            x = self.split.x[index]
            if self.augment is not None and aug_gen is not None:
                x = self.augment(x, aug_gen)
            yield Batch(x, self.split.y[index], index)


def make_batches(split: TensorSplit, batch_size: int, shuffle: bool, seed: int, augment: Augment | None = None,
                 lengths: torch.Tensor | None = None) -> BatchSource:
    """The batches of ``split``: its inputs' own batch source when they define one (parallel text: batches by
    token count, :class:`~teachkit.data.parallel.TokenBatchLoader`), else a :class:`BatchLoader`."""
    own = getattr(split.x, "batch_source", None)
    if own is not None:
        return own(batch_size, shuffle, seed)
    return BatchLoader(split, batch_size, shuffle=shuffle, seed=seed, augment=augment, lengths=lengths)
