"""From a raw dataset to fixed, seeded, class-stratified train / val / test splits, normalised.

Order of operations (each step draws from one CPU generator seeded with ``split_seed``):

1. sources without an official test split get a stratified 20% test split;
2. sources without an official val split: a stratified ``val_fraction`` of the remaining training data
   becomes ``val``;
3. ``train_subset`` (optional) keeps a stratified subset of what is left -- carved last, so ``val`` and
   ``test`` hold the same samples whatever the subset; with ``subset_seed`` set, the subset (and the
   ``few_shot`` draw) comes from its own generator seeded by it, so that it varies while val, test and the
   training pool stay fixed;
4. per-channel mean/std (channel = dim 1 of ``x``) are computed on the training split of step 2, i.e.
   before the subset, and applied to all splits: a student trained on a subset sees inputs normalised
   exactly as its teacher (trained on the full split) did, and val/test tensors do not depend on it.

Regression targets (task ``regression``, float ``y``), answer spans and target sequences (translation) have no
classes: steps 1-3 draw uniformly at random
instead (same generator, same sizes), and ``omit_classes`` is refused.

Per-class counts use largest-remainder (Hamilton) apportionment with exact rational arithmetic, so each
class gets floor or ceil of its share and the total is exact.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from teachkit.data.base import Splits, TensorSplit
from teachkit.data.config import DataConfig
from teachkit.data.raw import SEQUENCE_TASKS, SPAN_TASKS, is_regression, is_tokens, load_raw
from teachkit.errors import ConfigError, DataError
from teachkit.options import from_mapping

TEST_FRACTION = Fraction(1, 5)


def apportion(quotas: list[Fraction], total: int) -> list[int]:
    """Integers k_c in {floor(q_c), ceil(q_c)} summing to ``total`` (largest fractional parts round up;
    ties go to the lower class index). Needs sum(floor(q)) <= total <= sum(ceil(q))."""
    ks = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda c: (-(quotas[c] - ks[c]), c))
    for c in order[: total - sum(ks)]:
        ks[c] += 1
    return ks


def take_per_class(y: Tensor, ks: list[int], generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(rest, taken): sorted positions of ``y``; ``ks[c]`` random samples of class c are taken. One stable sort
    groups the positions by class (O(N log N), not O(N x classes)); the draws are those of a per-class loop."""
    taken, rest = [], []
    order = torch.argsort(y, stable=True)
    counts = torch.bincount(y, minlength=len(ks)).tolist()
    starts = [0, *itertools.accumulate(counts)]
    for c, k in enumerate(ks):
        if counts[c] == 0:
            continue
        idx = order[starts[c]:starts[c + 1]]
        perm = idx[torch.randperm(len(idx), generator=generator)]
        taken.append(perm[:k])
        rest.append(perm[k:])
    return _sorted_cat(rest), _sorted_cat(taken)


def _sorted_cat(parts: list[Tensor]) -> Tensor:
    return torch.sort(torch.cat(parts)).values if parts else torch.zeros(0, dtype=torch.long)


def stratified_fraction(y: Tensor, num_classes: int, fraction: Fraction,
                        generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(rest, taken) with round(fraction * len(y)) samples taken, split across classes in proportion.

    Every class with >= 2 samples keeps at least one on each side; a class with one sample stays in
    ``rest``. Where these bounds push the total off, classes that were rounded the other way give or take
    one, so each class stays within 1 of its share; the total is exact unless tiny classes forbid it.
    """
    counts = torch.bincount(y.cpu(), minlength=num_classes).tolist()
    quotas = [fraction * n for n in counts]
    total = math.floor(fraction * len(y) + Fraction(1, 2))
    ks = apportion(quotas, total)
    lo = [1 if n >= 2 else 0 for n in counts]
    hi = [n - 1 if n >= 2 else 0 for n in counts]
    ks = [min(max(k, a), b) for k, a, b in zip(ks, lo, hi, strict=True)]
    while sum(ks) != total:
        step = 1 if sum(ks) < total else -1
        movable = [c for c in range(num_classes) if lo[c] <= ks[c] + step <= hi[c]
                   and (ks[c] < quotas[c] if step > 0 else ks[c] > quotas[c])]
        if not movable:
            break
        c = max(movable, key=lambda c: (step * (quotas[c] - ks[c]), -c))
        ks[c] += step
    return take_per_class(y.cpu(), ks, generator)


def stratified_subset(y: Tensor, num_classes: int, size: int, generator: torch.Generator) -> Tensor:
    """Sorted positions of exactly ``size`` samples of ``y``, stratified by class; when ``size`` allows,
    every class present keeps at least one sample."""
    counts = torch.bincount(y.cpu(), minlength=num_classes).tolist()
    ks = apportion([Fraction(size * n, len(y)) for n in counts], size)
    present = [c for c, n in enumerate(counts) if n > 0]
    if size >= len(present):
        for c in present:
            if ks[c] == 0:
                donor = max(present, key=lambda d: (ks[d], -d))
                ks[donor] -= 1
                ks[c] += 1
    return take_per_class(y.cpu(), ks, generator)[1]


#: values per chunk when statistics are accumulated in float64 (32 MiB of float64 at a time)
STATS_CHUNK = 1 << 22


def _row_chunks(x: Tensor) -> list[Tensor]:
    """``x`` in slices of whole rows, each about :data:`STATS_CHUNK` values (views, no copy)."""
    step = max(1, STATS_CHUNK // max(1, x[0].numel()))
    return [x[i:i + step] for i in range(0, x.shape[0], step)]


def _squared_deviations(chunk: Tensor, mean: Tensor, dims: list[int]) -> Tensor:
    """Per-channel sum of (chunk - mean)^2 in float64, computed in place on one float64 copy of ``chunk``."""
    d = chunk.double().sub_(mean)
    return d.mul_(d).sum(dim=dims)


def channel_stats(x: Tensor, who: str = "dataset") -> tuple[Tensor, Tensor]:
    """Per-channel (dim 1) mean and population std of ``x`` over all other dims, accumulated in float64 in two
    passes over row chunks (values near float32's limit do not overflow), returned as float32. A constant
    channel gets std 1. DataError (``who`` names the dataset) for NaN / infinite inputs, or a std that float32
    cannot hold."""
    if x.shape[0] == 0:
        raise DataError("cannot compute normalisation statistics of an empty training split")
    dims = [0, *range(2, x.dim())]
    count = x.numel() // max(1, x.shape[1])
    total = sum(chunk.double().sum(dim=dims) for chunk in _row_chunks(x))
    mean = total / count
    shape = (1, -1) + (1,) * (x.dim() - 2)
    var = sum(_squared_deviations(chunk, mean.view(shape), dims) for chunk in _row_chunks(x)) / count
    bad = ~torch.isfinite(var) | ~torch.isfinite(mean)
    if bool(bad.any()):
        c = int(bad.nonzero()[0])
        raise DataError(f"{who}: the train inputs hold NaN or infinite values in channel {c} (dim 1 of x, "
                        "a feature column of a table); features must be finite numbers")
    std = var.sqrt()
    if bool((std > torch.finfo(torch.float32).max).any()):
        c = int((std > torch.finfo(torch.float32).max).nonzero()[0])
        raise DataError(f"{who}: channel {c} of the train inputs (dim 1 of x, a feature column of a table) has "
                        f"standard deviation {float(std[c]):.3g}, beyond float32's range (about 3.4e38); rescale "
                        "the inputs")
    std = std.float()
    return mean.float(), torch.where(std > 1e-12, std, torch.ones_like(std))


def check_finite(x: Tensor, who: str, part: str) -> None:
    """DataError naming ``part`` and the channel when normalised inputs ``x`` overflowed float32 (one
    ``aminmax`` pass; the place is looked for only then)."""
    if x.numel() == 0 or all(math.isfinite(float(v)) for v in torch.aminmax(x)):
        return
    for i, chunk in enumerate(_row_chunks(x)):
        bad = ~torch.isfinite(chunk)
        if bool(bad.any()):
            at = bad.nonzero()[0].tolist()
            step = max(1, STATS_CHUNK // max(1, x[0].numel()))
            raise DataError(f"{who}: normalising the {part} inputs overflows float32 (row {i * step + at[0] + 1}, "
                            f"channel {at[1] if len(at) > 1 else 0}): they lie too far from the train mean; "
                            "rescale the inputs")


def normalise(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """(x - mean) / std per channel (dim 1), as a new float32 tensor."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return x.float().sub(mean.to(x.device).view(shape)).div_(std.to(x.device).view(shape))


def omit_from_transfer_set(train: TensorSplit, omit_classes: list[int], few_shot: int, num_classes: int,
                           generator: torch.Generator, name: str) -> TensorSplit:
    """Drop ``omit_classes`` from the training split, keeping ``few_shot`` random examples of each.

    Zero-shot (``few_shot=0``) and few-shot KD (ECCV 2024 Sec. 5, after Hinton et al. 2015's omitted
    digit): the student's transfer set lacks these classes; evaluation still covers all of them.
    """
    for c in omit_classes:
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < num_classes:
            raise ConfigError(f"data.omit_classes contains {c!r} but dataset {name!r} has classes "
                              f"0..{num_classes - 1}")
    omitted = torch.zeros(num_classes, dtype=torch.bool)
    omitted[list(omit_classes)] = True
    keep = ~omitted[train.y.cpu()]
    for c in omit_classes:
        idx = (train.y.cpu() == c).nonzero().flatten()
        if few_shot > len(idx):
            raise ConfigError(f"data.few_shot={few_shot} but class {c} has only {len(idx)} training examples")
        keep[idx[torch.randperm(len(idx), generator=generator)[:few_shot]]] = True
    if not keep.any():
        raise ConfigError("data.omit_classes leaves no training examples")
    return train.subset(keep.nonzero().flatten())


def load_splits(name: str | DataConfig, root: str | None = None, val_fraction: float = 0.1, split_seed: int = 0,
                train_subset: int | None = None, options: dict[str, Any] | None = None,
                omit_classes: list[int] | tuple[int, ...] = (), few_shot: int = 0,
                subset_seed: int | None = None) -> Splits:
    """Dataset ``name`` as normalised train / val / test splits (see the module docstring).

    ``name`` may be a whole :class:`DataConfig`; otherwise the arguments are validated as the ``data``
    section of a config. ``omit_classes`` / ``few_shot`` remove classes from the training split only
    (keeping ``few_shot`` examples of each), after ``train_subset``; val and test keep every class.
    """
    if isinstance(name, DataConfig):
        return splits_for(name)
    cfg = from_mapping(DataConfig, {"name": name, "root": root, "val_fraction": val_fraction, "split_seed": split_seed,
                                    "train_subset": train_subset, "options": options or {},
                                    "omit_classes": list(omit_classes), "few_shot": few_shot,
                                    "subset_seed": subset_seed}, "data")
    return splits_for(cfg)


def random_fraction(n: int, fraction: Fraction, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(rest, taken): sorted positions of ``n`` samples, round(fraction * n) of them taken at random (at least
    one on each side when n >= 2). The carving of regression targets, which have no classes to stratify by."""
    total = math.floor(fraction * n + Fraction(1, 2))
    if n >= 2:
        total = min(max(total, 1), n - 1)
    perm = torch.randperm(n, generator=generator)
    return torch.sort(perm[total:]).values, torch.sort(perm[:total]).values


def random_subset(n: int, size: int, generator: torch.Generator) -> Tensor:
    """Sorted positions of ``size`` of ``n`` samples drawn at random (regression's ``train_subset``)."""
    return torch.sort(torch.randperm(n, generator=generator)[:size]).values


def example_groups(x: Any) -> Tensor | None:
    """Each row's example id when rows are windows of examples (SQuAD: a long context gives several rows per
    question), so that a carve keeps every window of an example on one side; None otherwise."""
    if is_tokens(x) and "example_id" in x.side:
        return x.side["example_id"].cpu()
    return None


def grouped_fraction(groups: Tensor, fraction: Fraction, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(rest, taken): sorted row positions, round(fraction * examples) whole examples taken at random."""
    ids = torch.unique(groups)
    _, held = random_fraction(len(ids), fraction, generator)
    taken = torch.isin(groups, ids[held])
    return taken.logical_not().nonzero().flatten(), taken.nonzero().flatten()


def splits_for(cfg: DataConfig) -> Splits:
    """The splits a validated ``data`` section describes (a teacher uses ``cfg.full()``).

    A source's own val and test splits are kept; missing ones are carved (stratified by class, or at random
    for regression targets). ``val_fraction`` is unused when the source gives a val split.
    """
    name, val_fraction, train_subset = cfg.name, cfg.val_fraction, cfg.train_subset
    raw = load_raw(name, cfg.root, cfg.options)
    k, default_augment, task = raw.num_classes, raw.default_augment, raw.task
    class_names, feature_names = raw.class_names, raw.feature_names
    regression = is_regression(task) or task in SPAN_TASKS or task in SEQUENCE_TASKS  # no classes to stratify by
    g = torch.Generator().manual_seed(cfg.split_seed)

    def carve(x: Any, y: Tensor, fraction: Fraction) -> tuple[Tensor, Tensor]:
        groups = example_groups(x)
        if groups is not None:
            return grouped_fraction(groups, fraction, g)
        if regression:
            return random_fraction(len(y), fraction, g)
        return stratified_fraction(y, k, fraction, g)

    x, y = raw.train_x, raw.train_y
    extra_test = dict(raw.extra_test)
    notes = [*raw.warnings, *([] if regression else one_class_warning(name, y))]
    given_val = None if raw.val_x is None or raw.val_y is None else TensorSplit(raw.val_x, raw.val_y)
    if raw.test_x is None or raw.test_y is None:
        if len(y) < (2 if given_val else 3):
            carved = "a test split" if given_val else "test and val splits"
            raise DataError(f"dataset {name!r} has {len(y)} samples, too few to carve {carved}")
        rest, held = carve(x, y, TEST_FRACTION)
        if len(held) == 0:
            raise DataError(f"dataset {name!r}: carving 20% of {len(y)} training samples as test leaves an "
                            "empty test split (too few samples per class); give a test split")
        test = TensorSplit(x[held], y[held])
        x, y = x[rest], y[rest]
    else:
        test = TensorSplit(raw.test_x, raw.test_y)
    if given_val is not None:
        val, train = given_val, TensorSplit(x, y)
    else:
        if len(y) < 2:
            raise DataError(f"dataset {name!r} has {len(y)} training samples, too few to carve a val split")
        rest, held = carve(x, y, Fraction(val_fraction))
        if len(held) == 0:
            raise DataError(f"dataset {name!r}: val_fraction={val_fraction} of {len(y)} training samples "
                            "leaves an empty val split")
        val = TensorSplit(x[held], y[held])
        train = TensorSplit(x[rest], y[rest])
    del x, y, raw

    text = is_tokens(train.x)
    who = f"dataset {name!r}"
    mean, std = (None, None) if text else channel_stats(train.x, who)
    # the student's transfer set: its own generator when subset_seed is set, else the split generator
    sg = g if cfg.subset_seed is None else torch.Generator().manual_seed(cfg.subset_seed)
    if train_subset is not None:
        if not 1 <= train_subset <= len(train):
            raise ConfigError(f"train_subset={train_subset} is out of range: the {name!r} train split holds "
                              f"{len(train)} samples, so choose 1..{len(train)}")
        idx = random_subset(len(train), train_subset, sg) if regression else \
            stratified_subset(train.y, k, train_subset, sg)
        train = train.subset(idx)
    if cfg.omit_classes:
        if regression:
            raise ConfigError(f"data.omit_classes needs class labels, but dataset {name!r} has task "
                              f"{task!r} (no class labels)")
        train = omit_from_transfer_set(train, list(cfg.omit_classes), cfg.few_shot, k, sg, name)

    def finish(s: TensorSplit, part: str) -> TensorSplit:
        if mean is None or std is None:
            return s
        x = normalise(s.x, mean, std)
        check_finite(x, who, part)
        return TensorSplit(x, s.y)

    extra = {part: finish(TensorSplit(x, y), part) for part, (x, y) in extra_test.items()}
    return Splits(name, finish(train, "train"), finish(val, "val"), finish(test, "test"), num_classes=k,
                  default_augment=default_augment, task=task, mean=mean, std=std,
                  omitted=tuple(sorted(set(cfg.omit_classes))), config=cfg, extra_test=extra,
                  warnings=tuple(dict.fromkeys(notes)), class_names=class_names, feature_names=feature_names)


def one_class_warning(name: str, y: Tensor) -> list[str]:
    """The warning for class labels that hold one class only (legitimate, but nothing to learn or distil)."""
    if y.dim() != 1 or y.is_floating_point() or y.numel() == 0:
        return []
    classes = torch.unique(y)
    if len(classes) != 1:
        return []
    return [f"dataset {name!r} has one class: every training label is class {int(classes[0])}, so a model "
            "learns nothing from it (accuracy is trivially 100%); check the label column or add other classes"]
