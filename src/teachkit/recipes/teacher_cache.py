"""Teacher outputs computed once: a frozen teacher's taps for the transfer set, cached in memory and on disk.

When the student's inputs for a sample do not change across epochs (no augmentation, no batch transform such
as HSAKD's rotations: text classification and QA, tabular data, images without augmentation), a frozen
teacher's outputs are a pure function of the sample. They are computed once, in eval mode and in batches of
``data.eval_batch_size``, under the run's autocast and memory layout (``train.precision``,
``train.channels_last``), and every later epoch -- and every student run with the same teacher weights and
the same transfer set (another KD method, seed, TAKD's student, ESKD's search, a Pro-KD replay stage) --
reads them instead of running the teacher.

The cache key is the sha256 of the teacher's weights (every tensor of its state dict and buffers, in order),
of the transfer set's inputs, of the taps stored, of the storage dtype and of the resolved precision and
layout. Files live in ``out_dir/_cache/teacher_outputs/<key>.safetensors`` (written atomically; safetensors,
nothing unpickled); each records its key and the digest of its contents, verified when read, and is never used
when either differs (it is then recomputed and rewritten). Cached taps: ``logits`` and ``embedding`` (fixed
size per sample); methods that read other teacher taps (feature maps, attention) run the teacher on each batch.

Augmented views (``data.augment`` on; FKD-style, :class:`ViewTeacherOutputs`): the view of a sample in epoch
``e`` is a pure function of (``train.seed``, ``e``, ``data.batch_size``) (:meth:`~teachkit.data.BatchLoader.
batches`), so the teacher's outputs for epoch ``e``'s views are too. The ``kd`` recipe keeps one table per
epoch, rows indexed by sample position, filled lazily: a batch whose rows are all in epoch ``e``'s table reads
them, any other batch runs the teacher exactly as an uncached step does (same tensor, same autocast) and its
outputs are stored. An epoch whose table is complete is written to ``out_dir/_cache/teacher_views/<key>/
epoch-<e>.safetensors`` (``e`` counts from 0, as the batch loader does) and read back when any run with the same
key enters epoch ``e``: the first student run of a seed pays the teacher forwards, every later one (another KD
method, a resumed run, a sweep over loss weights) reads them. The key covers everything that decides the views
and the teacher's outputs: teacher weights, transfer-set inputs, ``train.seed``, ``data.batch_size``, the
augmentation, ``train.micro_batch``, the resolved precision and layout, ``train.compile``, the device type, the
taps, the storage dtype / top-k, the number of samples and, under data parallelism, the process's rank and the
world size (each process's teacher sees its own share of every batch). Only the current epoch's table is in memory; a
resumed run re-entering an epoch starts its table afresh. Per epoch on disk: samples x (classes [+ embedding
width]) x bytes per value (CIFAR-100, 50k images, bf16 logits: 10 MB). Pro-KD's changing teacher does not use
views (augmented inputs: per-batch forwards, as before).

Sequences (inputs that carry token-level targets: translation's :class:`~teachkit.data.parallel.ParallelText`,
a causal LM's :class:`~teachkit.data.lm.LMText`): the teacher's logits are one row per target token, so the cache
is ragged -- every token of the transfer set in row order, with each row's offset -- and a batch reads its rows'
tokens in its packed order. With ``teacher.cache_topk=k`` only the k largest logits per token are kept (ids and
values) with the log of the probability of all other tokens (the "rest" bucket: k x (value + id) + 4 bytes per
token, e.g. 196 MB per million tokens at k = 32 with float16 values; the summary states
``bytes_per_million_tokens``). A batch gets them back as :class:`TopKTaps`: Hinton KD's divergences compare the
teacher's (k + 1)-outcome distribution with the student's (exact at T = 1; at other temperatures the rest is
assumed flat), and a method reading dense logits gets the top-k renormalised (every other entry at -1e9): biased
estimates of the full distribution (the summary's ``teacher_cache.approximation`` says so). Without top-k the
whole distribution is kept only while it fits :data:`FULL_LIMIT_BYTES`. The view cache takes
``teacher.cache_topk`` for image logits as the renormalised top-k (an approximation, reported as such).

Exactness: the cache stores the teacher's outputs in their own dtype (bf16 logits under bf16 autocast) and
hands them back in it. The view cache runs the teacher on the very batch an uncached step would, so a student
with it is bit-identical to one without (``teacher.cache=off``). The static cache runs the teacher on batches
of ``data.eval_batch_size``; a teacher in eval mode gives each sample the same output whatever batch it is in
when its kernels are batch-invariant (measured for the MLP/CNN zoo on CPU, fp32 and bf16 autocast: bit-identical,
so cached and uncached students are bit-identical). Transformer encoders with dynamic padding differ at float rounding
(~3e-8 on MiniLM logits) between padded lengths, so their students agree to float tolerance, not bit for bit.
``teacher.cache_dtype=float16`` halves the memory and disk cost and rounds the outputs (not exact; reported).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from teachkit import distributed
from teachkit.data import Augment, make_augment
from teachkit.data.base import TensorSplit
from teachkit.engine import Callback
from teachkit.engine.checkpoint import (
    DIGEST_KEY,
    CheckpointError,
    content_digest,
    load_checkpoint,
    save_checkpoint,
)
from teachkit.errors import WriteError
from teachkit.losses.divergences import TopKLogits
from teachkit.models import FrozenTeacher, Tapped
from teachkit.recipes.context import RunContext
from teachkit.types import Batch, Taps, num_rows

if TYPE_CHECKING:
    from teachkit.engine.precision import Precision

#: taps a cache can hold: one fixed-size tensor per sample
CACHEABLE = ("logits", "embedding")
#: taps a token-level (translation) cache can hold
TOKEN_CACHEABLE = ("logits",)
FOLDER = Path("_cache") / "teacher_outputs"
#: augmented views: one folder per key, one file per epoch
VIEWS_FOLDER = Path("_cache") / "teacher_views"
#: the largest whole-distribution token cache (bytes); above it ``teacher.cache_topk`` is needed
FULL_LIMIT_BYTES = 2 * 1024**3
#: the logit of tokens outside a cached top-k (its probability underflows to exactly 0 at temperatures up to 1e6)
OUTSIDE_TOP_K = -1e9


def inputs_digest(x: Any) -> str:
    """sha256 of a split's inputs: a tensor, or the input columns of tokenised text."""
    return content_digest("", {"x": x} if isinstance(x, Tensor) else dict(getattr(x, "inputs", x)))


def weights_digest(model: nn.Module) -> str:
    """sha256 of a model's state dict (parameters and buffers) and of its non-persistent buffers (a frozen
    teacher's input re-normalisation)."""
    tensors = dict(model.state_dict())
    tensors.update({f"(buffer) {n}": b for n, b in model.named_buffers() if n not in tensors})
    return content_digest("", tensors)


def _padded(t: Tensor, length: int) -> Tensor:
    """``t`` (B, L_b, ...) zero-padded along dim 1 to ``length`` (token-level outputs of trimmed batches)."""
    if t.dim() < 2 or t.shape[1] == length:
        return t
    pad = [0, 0] * (t.dim() - 2) + [0, length - int(t.shape[1])]
    return torch.nn.functional.pad(t, pad)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _precision_name(precision: Precision | None) -> str:
    return precision.name if precision is not None else "fp32"


def _teacher_input(x: Any, channels_last: bool) -> Any:
    """A batch as the engine hands it to a step: 4-D images in channels_last layout when the run uses it."""
    if channels_last and isinstance(x, Tensor) and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


class CacheWarning(Callback):
    """Gives the trainer a cache's one-line warning when its first epoch starts (``Trainer.warn`` keeps it once)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        trainer.warn(self.message)


@dataclass
class TeacherOutputs:
    """The frozen, tapped teacher's outputs for training batches: from ``cache`` rows (``batch.index``) when
    there is one, else from a forward on the batch. ``forwards`` counts samples the teacher ran on;
    ``status`` says which (``computed``: filled this run; ``loaded``: read from disk; ``off`` and why)."""

    teacher: Tapped
    cache: dict[str, Tensor] = field(default_factory=dict)
    status: str = "off"
    why: str = ""
    forwards: int = 0
    path: Path | None = None
    dtype: torch.dtype = torch.float32
    #: a one-line warning for the run (a stale cache file that was rebuilt); given by :meth:`callbacks`
    warning: str = ""

    def __call__(self, batch: Batch) -> Taps:
        if not self.cache:
            self.forwards += num_rows(batch.x)
            return self.teacher(batch.x)
        index = batch.index.to(next(iter(self.cache.values())).device)
        out: dict[str, Tensor] = {}
        width = _token_length(batch.x)
        for name, table in self.cache.items():
            rows = table[index]
            if rows.dim() >= 3 and width is not None:  # token-level: trim to the batch's padded length
                rows = rows[:, :width]
            out[name] = rows.float() if rows.dtype == torch.float16 else rows
        return Taps(out["logits"], out.get("embedding"))

    @property
    def cached(self) -> bool:
        return bool(self.cache)

    def forwards_saved(self, samples_seen: int) -> int:
        """The per-sample teacher forwards the cache replaced, given the samples the student has seen."""
        return samples_seen if self.cached else 0

    def callbacks(self) -> list[Callback]:
        """Engine callbacks the cache needs (the view cache's epoch hooks); for this one, the one that gives the
        trainer :attr:`warning` (printed once, kept in the summary) when there is one."""
        return [CacheWarning(self.warning)] if self.warning else []

    def report(self) -> dict[str, Any]:
        """What the run summary records about the cache."""
        info: dict[str, Any] = {"status": self.status}
        if self.why:
            info["why"] = self.why
        if self.cache:
            info["taps"] = sorted(self.cache)
            info["dtype"] = _dtype_name(self.dtype)
            info["bytes"] = int(sum(t.numel() * t.element_size() for t in self.cache.values()))
            if self.path is not None:
                info["file"] = str(self.path)
        return info


def token_positions(offsets: Tensor, index: Tensor) -> Tensor:
    """The flat token positions of rows ``index`` (in that order) in a ragged table whose row r holds positions
    ``offsets[r] .. offsets[r + 1] - 1``."""
    starts, ends = offsets[index], offsets[index + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    first = torch.repeat_interleave(starts - (torch.cumsum(lengths, 0) - lengths), lengths)
    return first + torch.arange(total, device=offsets.device)


class TopKTaps(Taps):
    """The taps of a top-k cached teacher (module docstring): ``extra["topk"]`` holds the k largest logits and the
    leftover probability mass (:class:`~teachkit.losses.divergences.TopKLogits`), which Hinton KD's divergences
    read as k tokens plus one "rest" bucket; ``logits`` is built only when a method reads it: dense, the top-k
    renormalised (every other entry at -1e9)."""

    def __init__(self, topk: TopKLogits) -> None:
        self._dense: Tensor | None = None
        super().__init__(None, extra={"topk": topk})  # type: ignore[arg-type]

    @property  # type: ignore[override]
    def logits(self) -> Tensor:
        if self._dense is None:
            self._dense = self.extra["topk"].dense()
        return self._dense

    @logits.setter
    def logits(self, value: Tensor | None) -> None:
        self._dense = value


#: the tables of a top-k token cache: the k largest logits, their token ids, the log of the rest's probability
TOPK_TABLES = ("values", "ids", "log_rest")


@dataclass
class TokenTeacherOutputs(TeacherOutputs):
    """A sequence teacher's per-token logits for training batches, from a ragged cache (module docstring):
    ``cache["logits"]`` (all tokens, V) or, with top-k, ``cache["values"]`` / ``cache["ids"]`` (all tokens, k) and
    ``cache["log_rest"]`` (all tokens,); ``offsets`` (rows + 1,) locate each row's tokens."""

    offsets: Tensor | None = None
    vocab_size: int = 0
    topk: int = 0

    def __call__(self, batch: Batch) -> Taps:
        if not self.cache or self.offsets is None:
            self.forwards += num_rows(batch.x)
            return self.teacher(batch.x)
        flat = token_positions(self.offsets, batch.index.to(self.offsets.device))
        if not self.topk:
            logits = self.cache["logits"][flat]
            return Taps(logits.float() if logits.dtype == torch.float16 else logits)
        return TopKTaps(TopKLogits(self.cache["ids"][flat].long(), self.cache["values"][flat].float(),
                                   self.cache["log_rest"][flat].float(), self.vocab_size))

    def report(self) -> dict[str, Any]:
        info = super().report()
        if self.cache:
            tokens = int(self.offsets[-1]) if self.offsets is not None else 0
            info["tokens"] = tokens
            if tokens:
                info["bytes_per_million_tokens"] = int(info["bytes"] * 1_000_000 / tokens)
            if self.topk:
                info["topk"] = self.topk
                info["approximation"] = (
                    f"top-{self.topk}: the teacher's {self.topk} largest logits per target token and the probability "
                    "of all other tokens as one bucket; Hinton KD's divergences compare the (k + 1)-outcome "
                    "distributions (exact at T = 1, the rest assumed flat at other T), methods reading dense logits "
                    "get the top-k renormalised: a biased estimate of the full per-token distribution")
        return info


@torch.no_grad()
def compute_token_outputs(teacher: Tapped, x: Any, batch_size: int, topk: int,
                          dtype: torch.dtype | None, precision: Precision | None = None) -> dict[str, Any]:
    """The teacher's per-token logits for every row of ``x`` (parallel text, causal-LM text), rows in order, each
    row's tokens in order: ``logits`` (tokens, V), or its ``topk`` largest as ``values`` (tokens, k) and ``ids``
    int32 with ``log_rest`` (tokens,) float32, the log of the probability of every other token (at T = 1); under
    ``precision``'s autocast, stored in ``dtype`` (None: the teacher's own output dtype); ``vocab_size``: the
    width of the teacher's logits (an int, not a table)."""
    parts: dict[str, list[Tensor]] = {}
    device = _device_of(teacher)
    width = 0
    for start in range(0, x.shape[0], batch_size):
        with precision.autocast(device) if precision is not None else contextlib.nullcontext():
            logits = teacher(x[start:start + batch_size]).logits.detach()
        width = int(logits.shape[1])
        if topk:
            top = TopKLogits.from_logits(logits, min(topk, logits.shape[1]))
            parts.setdefault("values", []).append(top.values.to(dtype or logits.dtype))
            parts.setdefault("ids", []).append(top.ids.to(torch.int32))
            parts.setdefault("log_rest", []).append(top.log_rest.float())
        else:
            parts.setdefault("logits", []).append(logits.to(dtype or logits.dtype))
    out: dict[str, Any] = {n: torch.cat(v) for n, v in parts.items()}
    out["vocab_size"] = width
    return out


def teacher_target_lengths(x: Any) -> Tensor:
    """Target tokens per row of the teacher's logits: its own tokenisation's when the data carries one (a causal
    LM distilled across tokenizers), else the rows' targets."""
    return x.teacher_tgt_lengths() if getattr(x, "has_teacher", False) else x.tgt_lengths()


def _device_of(teacher: nn.Module) -> torch.device:
    for t in teacher.parameters():
        return t.device
    for t in teacher.buffers():
        return t.device
    return torch.device("cpu")


def _token_length(x: Any) -> int | None:
    if isinstance(x, Tensor):
        return None
    ids = x.get("input_ids") if isinstance(x, Mapping) else None
    return int(ids.shape[1]) if isinstance(ids, Tensor) and ids.dim() == 2 else None


def reason_not_cacheable(mode: str, needs: Iterable[str], augmented: bool, transforms: bool,
                         cacheable: tuple[str, ...] = CACHEABLE) -> str:
    """Why the teacher's outputs cannot be cached for this run ("" when they can)."""
    if mode == "off":
        return "teacher.cache=off"
    if augmented:
        return "the inputs are augmented (they change every epoch)"
    if transforms:
        return "the method transforms each batch (e.g. HSAKD's rotations)"
    other = sorted(set(needs) - set(cacheable))
    if other:
        return f"the method reads teacher taps that are not cached ({', '.join(other)})"
    return ""


@torch.no_grad()
def compute_outputs(teacher: Tapped, split: TensorSplit, names: tuple[str, ...], batch_size: int,
                    dtype: torch.dtype | None, precision: Precision | None = None,
                    channels_last: bool = False) -> dict[str, Tensor]:
    """The teacher's ``names`` taps for every sample of ``split``, in order (eval mode, batches of ``batch_size``
    under ``precision``'s autocast, 4-D inputs in channels_last layout when ``channels_last``, as the engine runs a
    step; token-level outputs zero-padded to the split's padded length), stored in ``dtype`` (None: the teacher's
    own output dtype)."""
    full = None if isinstance(split.x, Tensor) else int(split.x.shape[1])
    parts: dict[str, list[Tensor]] = {n: [] for n in names}
    device = _device_of(teacher)
    for start in range(0, len(split), batch_size):
        with precision.autocast(device) if precision is not None else contextlib.nullcontext():
            taps = teacher(_teacher_input(split.x[start:start + batch_size], channels_last))
        for n in names:
            value = taps.get(n)
            if not isinstance(value, Tensor):
                raise CheckpointError(f"teacher tap {n!r} is not a tensor; run with teacher.cache=off")
            value = value.detach()
            if full is not None and value.dim() >= 3:
                value = _padded(value, full)
            parts[n].append(value.to(dtype or value.dtype).contiguous())
    return {n: torch.cat(v) for n, v in parts.items()}


def teacher_outputs(teacher: Tapped, split: TensorSplit, *, needs: Iterable[str], mode: str, augmented: bool,
                    transforms: bool, out_dir: Path, batch_size: int, dtype: str = "float32",
                    topk: int = 0, vocab_size: int = 0, precision: Precision | None = None,
                    channels_last: bool = False) -> TeacherOutputs:
    """The teacher's outputs for the transfer set ``split``: cached (read from ``out_dir/_cache`` when a file
    with the same key verifies, else computed once and written) when the run allows it, else per batch.
    Translation inputs get the ragged token-level cache (``topk``, ``vocab_size``: module docstring). The
    teacher runs under ``precision``'s autocast (None: as called) and, with ``channels_last``, on 4-D inputs in
    that layout; ``dtype`` ``float32`` keeps its outputs' own dtype exactly, ``float16`` rounds them."""
    store = torch.float16 if dtype == "float16" else None  # None: the teacher's own dtype (exact)
    tokens = hasattr(split.x, "token_targets")
    why = reason_not_cacheable(mode, needs, augmented, transforms, TOKEN_CACHEABLE if tokens else CACHEABLE)
    lengths = teacher_target_lengths(split.x) if tokens else None
    if not why and lengths is not None and not topk:
        size = int(lengths.sum()) * vocab_size * (2 if dtype == "float16" else 4)
        if size > FULL_LIMIT_BYTES:
            why = (f"the whole per-token distribution would take {size / 1024**3:.1f} GiB; set teacher.cache_topk "
                   "(e.g. 8) to cache the top-k")
    made = TokenTeacherOutputs if tokens else TeacherOutputs
    if why:
        return made(teacher, status="off", why=why)
    names = TOPK_TABLES if tokens and topk else tuple(n for n in CACHEABLE if n in set(needs))
    layout = channels_last and isinstance(split.x, Tensor) and split.x.dim() == 4
    key = hashlib.sha256("|".join([weights_digest(teacher.model), inputs_digest(split.x), _taps_text(teacher, names),
                                   "float16" if store is not None else "exact", str(len(split)),
                                   f"topk={topk}" if tokens else "", f"precision={_precision_name(precision)}",
                                   f"channels_last={layout}", *_inference_part(teacher)]).encode()).hexdigest()
    path = Path(out_dir) / FOLDER / f"{key}.safetensors"
    device = split.y.device
    extra: dict[str, Any] = {}
    if lengths is not None:
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).long()
        extra = {"offsets": offsets.to(device), "vocab_size": vocab_size, "topk": topk}
    stale = ""
    if path.is_file():
        try:
            tensors, state = load_checkpoint(path)
            if state.get("key") == key and sorted(tensors) == sorted(names):  # content digest verified on load
                rows = int(extra["offsets"][-1]) if tokens else len(split)
                stale = stale_rows(path, tensors, rows, "target tokens" if tokens else "samples")
                if not stale:
                    if tokens and isinstance(state.get("vocab_size"), int):  # the teacher's own vocabulary
                        extra["vocab_size"] = state["vocab_size"]
                    return made(teacher, {n: t.to(device) for n, t in tensors.items()}, "loaded", path=path,
                                dtype=tensors[names[0]].dtype, **extra)
        except CheckpointError:
            pass  # unreadable or tampered: recomputed and rewritten below
    cache = compute_token_outputs(teacher, split.x, batch_size, topk, store, precision) if tokens else \
        compute_outputs(teacher, split, names, batch_size, store, precision, layout)
    width = cache.pop("vocab_size", None)
    if tokens and width is not None:
        extra["vocab_size"] = int(width)
    result = made(teacher, {n: t.to(device) for n, t in cache.items()}, "computed", path=path,
                  forwards=len(split), dtype=cache[names[0]].dtype, warning=stale, **extra)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cpu = {n: t.cpu().contiguous() for n, t in cache.items()}
        save_checkpoint(path, cpu, {"key": key, "samples": len(split),
                                    **({"vocab_size": extra["vocab_size"]} if tokens else {})})
    except (OSError, WriteError) as e:  # the cache is an optimisation: a run never fails because it cannot be written
        result.why = f"not written to disk ({e})"
        result.path = None
    return result


def stale_rows(path: Path, tensors: Mapping[str, Tensor], rows: int, what: str) -> str:
    """Why the cache file ``path`` does not fit a transfer set of ``rows`` rows ("" when it does): a table
    with another number of rows (or none) would index out of range; the file is then rebuilt."""
    found = sorted({int(t.shape[0]) if t.dim() >= 1 else 0 for t in tensors.values()})
    if found == [rows] and all(t.dim() >= 2 or name == "log_rest" for name, t in tensors.items()):
        return ""
    held = ", ".join(f"{n:,}" for n in found)
    return (f"teacher cache {str(path)!r} holds {held} rows but the transfer set has {rows:,} {what}; "
            "treated as stale and rebuilt")


def _has_digest(path: Path) -> bool:
    """Whether the safetensors file ``path`` records a content digest (that :func:`load_checkpoint` verifies)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return DIGEST_KEY in (f.metadata() or {})
    except (SafetensorError, OSError, ValueError):
        return False


class ViewEpochs(Callback):
    """The engine's epoch hooks of a :class:`ViewTeacherOutputs`: load (or start) an epoch's table, write it."""

    def __init__(self, outputs: ViewTeacherOutputs) -> None:
        self.outputs = outputs

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self.outputs.start_epoch(epoch)

    def on_epoch_end(self, trainer: Any, record: dict[str, Any]) -> None:
        self.outputs.end_epoch(int(record.get("epoch", trainer.epoch)) - 1)


@dataclass
class ViewTeacherOutputs(TeacherOutputs):
    """The teacher's outputs for augmented views, one table per epoch (module docstring): rows by sample position
    (``batch.index``), filled lazily, written to ``folder/epoch-<e>.safetensors`` when the epoch ends complete
    and read back by any run with the same ``key``. ``names``: the taps stored; ``topk``: image logits kept as
    their k largest (ids and values); ``half``: float16 storage. Needs :meth:`callbacks` in the trainer."""

    key: str = ""
    folder: Path | None = None
    names: tuple[str, ...] = ("logits",)
    samples: int = 0
    topk: int = 0
    half: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: samples read from a table instead of running the teacher (this session)
    reads: int = 0
    epoch: int | None = None
    table: dict[str, Tensor] = field(default_factory=dict)
    filled: Tensor | None = None
    visited: Tensor | None = None
    #: the table holds every sample (read from a complete file): batches read it without a check
    complete: bool = False
    #: the table holds some samples (a file written by a loader that skipped some): each batch is checked
    partial: bool = False
    #: the teacher ran in this epoch: its table is written at the epoch's end
    ran: bool = False
    classes: int = 0
    epochs_loaded: int = 0
    epochs_computed: int = 0
    files_written: int = 0
    rejected: int = 0
    memory_bytes: int = 0

    @property
    def cached(self) -> bool:
        return True

    @property
    def exact(self) -> bool:
        """Whether a batch gets the teacher's outputs unchanged (no float16 rounding, no top-k)."""
        return not (self.half or self.topk)

    @property
    def stored(self) -> tuple[str, ...]:
        """The tables of an epoch file (besides ``filled``)."""
        return tuple(x for n in self.names for x in (("values", "ids") if n == "logits" and self.topk else (n,)))

    def forwards_saved(self, samples_seen: int) -> int:
        return self.reads

    def callbacks(self) -> list[Callback]:
        return [ViewEpochs(self)]

    def epoch_path(self, epoch: int) -> Path | None:
        return None if self.folder is None else self.folder / f"epoch-{epoch}.safetensors"

    # -- epochs ------------------------------------------------------------------------------------------------

    def start_epoch(self, epoch: int) -> None:
        """Enter ``epoch``: its table from a verified file when there is one, else an empty one (a partially
        filled table of an interrupted attempt is discarded)."""
        self.epoch, self.table, self.ran = epoch, {}, False
        self.complete = self.partial = False
        self.filled = torch.zeros(self.samples, dtype=torch.bool, device=self.device)
        self.visited = torch.zeros(self.samples, dtype=torch.bool, device=self.device)
        loaded = self._load(epoch)
        if loaded is None:
            return
        filled = loaded.pop("filled")
        self.table = {n: t.to(self.device) for n, t in loaded.items()}
        self.filled = filled.to(self.device)
        self.complete = bool(filled.all())
        self.partial = not self.complete and bool(filled.any())
        self.epochs_loaded += 1
        self._note_memory()

    def _load(self, epoch: int) -> dict[str, Tensor] | None:
        """Epoch ``epoch``'s tables when its file exists and verifies (content digest, key, epoch, shapes)."""
        path = self.epoch_path(epoch)
        if path is None or not path.is_file():
            return None
        try:
            if not _has_digest(path):
                raise CheckpointError("no content digest")
            tensors, state = load_checkpoint(path)  # content digest verified
        except CheckpointError:
            self.rejected += 1
            return None
        expected = {*self.stored, "filled"}
        filled = tensors.get("filled")
        ok = (state.get("key") == self.key and state.get("epoch") == epoch and set(tensors) == expected
              and isinstance(filled, Tensor) and filled.dtype == torch.bool and tuple(filled.shape) == (self.samples,)
              and all(tensors[n].dim() >= 1 and tensors[n].shape[0] == self.samples for n in self.stored))
        if ok and self.topk:
            ok = isinstance(state.get("classes"), int) and state["classes"] > 0
            self.classes = int(state["classes"]) if ok else self.classes
        if not ok:
            self.rejected += 1
            return None
        self.dtype = tensors[self.stored[0]].dtype
        return tensors

    def end_epoch(self, epoch: int) -> None:
        """Leave ``epoch``: write its table when the teacher ran in it and every sample it visited is filled;
        only the current epoch's table is ever held."""
        if self.epoch != epoch:
            return
        assert self.filled is not None and self.visited is not None
        complete = bool(self.visited.any()) and bool(self.filled[self.visited].all())
        path = self.epoch_path(epoch)
        if self.ran:
            self.epochs_computed += 1
            if complete and path is not None:
                state = {"key": self.key, "epoch": epoch, "samples": self.samples, "taps": list(self.names),
                         **({"classes": self.classes, "topk": self.topk} if self.topk else {})}
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    save_checkpoint(path, {**self.table, "filled": self.filled}, state)
                    self.files_written += 1
                except (OSError, WriteError) as e:  # an optimisation: a run never fails because it cannot write
                    self.why = f"epoch {epoch}'s views not written to disk ({e})"
        self.epoch, self.table, self.filled, self.visited = None, {}, None, None

    # -- batches -----------------------------------------------------------------------------------------------

    def __call__(self, batch: Batch) -> Taps:
        n = num_rows(batch.x)
        if self.epoch is None or self.filled is None or self.visited is None:  # outside the engine's epochs
            self.forwards += n
            return self.teacher(batch.x)
        index = batch.index.to(self.device)
        if self.complete or (self.partial and bool(self.filled[index].all())):
            self.reads += n
            self.visited[index] = True
            return self._rows(index)
        taps = self.teacher(batch.x)  # exactly the uncached step's forward (same tensor, same autocast)
        self.forwards += n
        self._store(index, taps)
        self.visited[index] = True
        self.filled[index] = True
        self.ran = True
        return Taps(taps.logits, taps.embedding) if self.exact else self._rows(index)

    def _store(self, index: Tensor, taps: Taps) -> None:
        values: dict[str, Tensor] = {}
        for name in self.names:
            value = taps.get(name)
            if not isinstance(value, Tensor):
                raise CheckpointError(f"teacher tap {name!r} is not a tensor; run with teacher.cache=off")
            value = value.detach()
            if name == "logits" and self.topk:
                self.classes = int(value.shape[1])
                top, ids = value.topk(min(self.topk, self.classes), dim=1)
                values["values"] = top
                values["ids"] = ids.to(torch.int16 if self.classes <= torch.iinfo(torch.int16).max else torch.int32)
            else:
                values[name] = value
        for name, value in values.items():
            if self.half and value.is_floating_point():
                value = value.to(torch.float16)
            table = self.table.get(name)
            if table is None or table.shape[1:] != value.shape[1:] or table.dtype != value.dtype:
                table = self.table[name] = torch.zeros((self.samples, *value.shape[1:]), dtype=value.dtype,
                                                       device=self.device)
                if name in ("logits", "values", "embedding"):
                    self.dtype = value.dtype
                self._note_memory()
            table[index] = value.to(self.device)

    def _rows(self, index: Tensor) -> Taps:
        out: dict[str, Tensor] = {}
        for name in self.names:
            if name == "logits" and self.topk:
                values, ids = self.table["values"][index].float(), self.table["ids"][index].long()
                out[name] = values.new_full((values.shape[0], self.classes), OUTSIDE_TOP_K).scatter_(1, ids, values)
            else:
                rows = self.table[name][index]
                out[name] = rows.float() if self.half else rows
        return Taps(out["logits"], out.get("embedding"))

    def _note_memory(self) -> None:
        size = sum(t.numel() * t.element_size() for t in self.table.values()) + self.samples * 2  # + two masks
        self.memory_bytes = max(self.memory_bytes, int(size))

    # -- summary -----------------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        files = sorted(self.folder.glob("epoch-*.safetensors")) if self.folder is not None and \
            self.folder.is_dir() else []
        info: dict[str, Any] = {"status": "views"}
        if self.why:
            info["why"] = self.why
        info.update({"taps": list(self.names), "dtype": _dtype_name(self.dtype), "exact": self.exact,
                     "key": self.key, "folder": str(self.folder) if self.folder is not None else None,
                     "epochs_loaded": self.epochs_loaded, "epochs_computed": self.epochs_computed,
                     "files_written": self.files_written, "files": len(files),
                     "bytes_on_disk": int(sum(f.stat().st_size for f in files if f.is_file())),
                     "bytes_in_memory": self.memory_bytes})
        if self.rejected:
            info["rejected"] = self.rejected  # files that did not verify: recomputed and rewritten
        approximations = []
        if self.topk:
            info["topk"] = self.topk
            approximations.append(f"top-{self.topk}: the teacher's {self.topk} largest logits per view, renormalised "
                                  "over them; a biased estimate of the full distribution")
        if self.half:
            approximations.append("float16 storage: the teacher's outputs rounded to float16")
        if approximations:
            info["approximation"] = "; ".join(approximations)
        return info


def _process() -> str:
    """This process's place in a data-parallel run (each process's teacher sees its own share of every batch)."""
    return f"{distributed.rank()}/{distributed.world_size()}"


def _inference_part(teacher: Tapped) -> list[str]:
    """The cache key's part for a teacher run as an inference model (``teacher.inference=fold``: folded weights,
    its own dtype, inference mode); none for a plain teacher, whose keys stay as they were."""
    return ["teacher_inference=fold"] if isinstance(teacher.model, FrozenTeacher) and teacher.model.inference else []


def _taps_text(teacher: Tapped, names: Iterable[str]) -> str:
    """The cached taps for a cache key; with the embedding tap, the module it is read from (``teacher.taps`` may
    name another one for the same weights)."""
    names = list(names)
    return ",".join(names) + (f"@{teacher.spec.embedding}" if "embedding" in names else "")


def view_outputs(teacher: Tapped, split: TensorSplit, *, names: tuple[str, ...], augment: Augment, seed: int,
                 batch_size: int, out_dir: Path | None, micro_batch: int | None = None,
                 precision: Precision | None = None, channels_last: bool = False, dtype: str = "float32",
                 topk: int = 0, compile: bool = False) -> ViewTeacherOutputs:
    """The view cache (:class:`ViewTeacherOutputs`) for training batches of ``split`` augmented by ``augment``
    with ``seed`` and ``batch_size`` (module docstring); files under ``out_dir`` (None: memory only)."""
    device = split.y.device
    half = dtype == "float16"
    layout = channels_last and isinstance(split.x, Tensor) and split.x.dim() == 4
    parts = ["teachkit-views-v1", f"teacher={weights_digest(teacher.model)}", f"inputs={inputs_digest(split.x)}",
             f"seed={seed}", f"batch_size={batch_size}", f"augment={augment!r}", f"micro_batch={micro_batch}",
             f"precision={_precision_name(precision)}", f"channels_last={layout}", f"taps={_taps_text(teacher, names)}",
             f"store={'float16' if half else 'exact'}", f"topk={topk}", f"samples={len(split)}",
             f"device={device.type}", f"compile={bool(compile)}", f"process={_process()}", *_inference_part(teacher)]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()
    folder = None if out_dir is None else Path(out_dir) / VIEWS_FOLDER / key
    return ViewTeacherOutputs(teacher, status="views", key=key, folder=folder, names=names, samples=len(split),
                              topk=topk, half=half, device=device, dtype=torch.float16 if half else torch.float32)


def run_teacher_outputs(ctx: RunContext, teacher: Tapped, needs: Iterable[str],
                        transforms: bool = False, views: bool = False) -> TeacherOutputs:
    """:func:`teacher_outputs` for the run ``ctx``: its transfer set, ``teacher.cache`` / ``cache_dtype``,
    ``out_dir``, ``data.eval_batch_size``, the run's precision and layout, and whether ``data.augment`` changes the
    inputs every epoch. With ``views`` (a frozen teacher whose trainer takes :meth:`TeacherOutputs.callbacks`),
    augmented inputs get the per-epoch view cache (:func:`view_outputs`) instead of none."""
    cfg = ctx.cfg
    augment = make_augment(cfg.data.augment, ctx.splits, cfg.data.augment_options)
    split = ctx.splits.train
    needs = set(needs)
    if views and augment is not None and isinstance(split.x, Tensor) and \
            not reason_not_cacheable(cfg.teacher.cache, needs, False, transforms):
        return view_outputs(teacher, split, names=("logits", *(["embedding"] if "embedding" in needs else [])),
                            augment=augment,
                            seed=cfg.train.seed, batch_size=cfg.data.batch_size, out_dir=Path(cfg.out_dir),
                            micro_batch=cfg.train.micro_batch, precision=ctx.precision,
                            channels_last=ctx.channels_last, dtype=cfg.teacher.cache_dtype,
                            topk=cfg.teacher.cache_topk, compile=ctx.compiles)
    return teacher_outputs(teacher, split, needs=needs, mode=cfg.teacher.cache,
                           augmented=augment is not None, transforms=transforms,
                           out_dir=Path(cfg.out_dir), batch_size=cfg.data.eval_batch_size,
                           dtype=cfg.teacher.cache_dtype, topk=cfg.teacher.cache_topk,
                           vocab_size=ctx.splits.num_classes, precision=ctx.precision,
                           channels_last=ctx.channels_last)
