"""Teacher outputs computed once: a frozen teacher's taps for the transfer set, cached in memory and on disk.

When the student's inputs for a sample do not change across epochs (no augmentation, no batch transform such
as HSAKD's rotations: text classification and QA, tabular data, images without augmentation), a frozen
teacher's outputs are a pure function of the sample. They are computed once, in eval mode and in batches of
``data.eval_batch_size``, and every later epoch -- and every student run with the same teacher weights and
the same transfer set (another KD method, seed, TAKD's student, ESKD's search, a Pro-KD replay stage) --
reads them instead of running the teacher.

The cache key is the sha256 of the teacher's weights (every tensor of its state dict, in order), of the
transfer set's inputs, of the taps stored and of the storage dtype. Files live in ``out_dir/_cache/
teacher_outputs/<key>.safetensors`` (written atomically; safetensors, nothing unpickled); each records its
key and the digest of its contents, verified when read, and is never used when either differs (it is then
recomputed and rewritten). Cached taps: ``logits`` and ``embedding`` (fixed size per sample); methods that
read other teacher taps (feature maps, attention) run the teacher on each batch.

Translation (inputs that carry token-level targets, :class:`~teachkit.data.parallel.ParallelText`): the
teacher's logits are one row per target token, so the cache is ragged -- every token of the transfer set in
row order, with each row's offset -- and a batch reads its rows' tokens in its packed order. With
``teacher.cache_topk=k`` only the k largest logits per token are kept (ids and values); a batch gets them back
as dense logits with every other entry at -1e9, so the student distils from the teacher's top-k distribution
renormalised: a biased estimate of the full distribution (the summary's ``teacher_cache.approximation`` says
so). Without top-k the whole distribution is kept only while it fits :data:`FULL_LIMIT_BYTES`.

Exactness: a teacher in eval mode gives each sample the same output whatever batch it is in when its
kernels are batch-invariant (measured for the MLP/CNN zoo on CPU: bit-identical, so cached and uncached
students are bit-identical). Transformer encoders with dynamic padding differ at float rounding (~3e-8 on
MiniLM logits) between padded lengths, so their students agree to float tolerance, not bit for bit.
``teacher.cache_dtype=float16`` halves the memory and disk cost and rounds the logits (not exact; reported).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.data import make_augment
from teachkit.data.base import TensorSplit
from teachkit.engine.checkpoint import CheckpointError, content_digest, load_checkpoint, save_checkpoint
from teachkit.errors import WriteError
from teachkit.models import Tapped
from teachkit.recipes.context import RunContext
from teachkit.types import Batch, Taps, num_rows

#: taps a cache can hold: one fixed-size tensor per sample
CACHEABLE = ("logits", "embedding")
#: taps a token-level (translation) cache can hold
TOKEN_CACHEABLE = ("logits",)
FOLDER = Path("_cache") / "teacher_outputs"
#: the largest whole-distribution token cache (bytes); above it ``teacher.cache_topk`` is needed
FULL_LIMIT_BYTES = 2 * 1024**3
#: the logit of tokens outside a cached top-k (its probability underflows to exactly 0 at temperatures up to 1e6)
OUTSIDE_TOP_K = -1e9


def inputs_digest(x: Any) -> str:
    """sha256 of a split's inputs: a tensor, or the input columns of tokenised text."""
    return content_digest("", {"x": x} if isinstance(x, Tensor) else dict(getattr(x, "inputs", x)))


def weights_digest(model: nn.Module) -> str:
    """sha256 of a model's state dict (parameters and buffers)."""
    return content_digest("", model.state_dict())


def _padded(t: Tensor, length: int) -> Tensor:
    """``t`` (B, L_b, ...) zero-padded along dim 1 to ``length`` (token-level outputs of trimmed batches)."""
    if t.dim() < 2 or t.shape[1] == length:
        return t
    pad = [0, 0] * (t.dim() - 2) + [0, length - int(t.shape[1])]
    return torch.nn.functional.pad(t, pad)


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

    def report(self) -> dict[str, Any]:
        """What the run summary records about the cache."""
        info: dict[str, Any] = {"status": self.status}
        if self.why:
            info["why"] = self.why
        if self.cache:
            info["taps"] = sorted(self.cache)
            info["dtype"] = str(self.dtype).replace("torch.", "")
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


@dataclass
class TokenTeacherOutputs(TeacherOutputs):
    """A translation teacher's per-token logits for training batches, from a ragged cache (module docstring):
    ``cache["logits"]`` (all tokens, V) or, with top-k, ``cache["values"]`` / ``cache["ids"]`` (all tokens, k);
    ``offsets`` (rows + 1,) locate each row's tokens."""

    offsets: Tensor | None = None
    vocab_size: int = 0
    topk: int = 0

    def __call__(self, batch: Batch) -> Taps:
        if not self.cache or self.offsets is None:
            self.forwards += num_rows(batch.x)
            return self.teacher(batch.x)
        flat = token_positions(self.offsets, batch.index.to(self.offsets.device))
        if not self.topk:
            return Taps(self.cache["logits"][flat].float())
        values, ids = self.cache["values"][flat].float(), self.cache["ids"][flat].long()
        dense = values.new_full((values.shape[0], self.vocab_size), OUTSIDE_TOP_K)
        return Taps(dense.scatter_(1, ids, values))

    def report(self) -> dict[str, Any]:
        info = super().report()
        if self.cache:
            info["tokens"] = int(self.offsets[-1]) if self.offsets is not None else 0
            if self.topk:
                info["topk"] = self.topk
                info["approximation"] = (f"top-{self.topk}: the teacher's {self.topk} largest logits per target token, "
                                         "renormalised over them; a biased estimate of the full per-token "
                                         "distribution")
        return info


@torch.no_grad()
def compute_token_outputs(teacher: Tapped, x: Any, batch_size: int, topk: int,
                          dtype: torch.dtype) -> dict[str, Tensor]:
    """The teacher's per-token logits for every row of ``x`` (parallel text), rows in order, each row's tokens in
    order: ``logits`` (tokens, V), or its ``topk`` largest as ``values`` (tokens, k) and ``ids`` int32."""
    parts: dict[str, list[Tensor]] = {}
    for start in range(0, x.shape[0], batch_size):
        logits = teacher(x[start:start + batch_size]).logits.detach()
        if topk:
            values, ids = logits.float().topk(min(topk, logits.shape[1]), dim=1)
            parts.setdefault("values", []).append(values.to(dtype))
            parts.setdefault("ids", []).append(ids.to(torch.int32))
        else:
            parts.setdefault("logits", []).append(logits.to(dtype))
    return {n: torch.cat(v) for n, v in parts.items()}


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
                    dtype: torch.dtype) -> dict[str, Tensor]:
    """The teacher's ``names`` taps for every sample of ``split``, in order (eval mode, batches of ``batch_size``;
    token-level outputs zero-padded to the split's padded length)."""
    full = None if isinstance(split.x, Tensor) else int(split.x.shape[1])
    parts: dict[str, list[Tensor]] = {n: [] for n in names}
    for start in range(0, len(split), batch_size):
        taps = teacher(split.x[start:start + batch_size])
        for n in names:
            value = taps.get(n)
            if not isinstance(value, Tensor):
                raise CheckpointError(f"teacher tap {n!r} is not a tensor; run with teacher.cache=off")
            value = value.detach()
            if full is not None and value.dim() >= 3:
                value = _padded(value, full)
            parts[n].append(value.to(dtype))
    return {n: torch.cat(v) for n, v in parts.items()}


def teacher_outputs(teacher: Tapped, split: TensorSplit, *, needs: Iterable[str], mode: str, augmented: bool,
                    transforms: bool, out_dir: Path, batch_size: int, dtype: str = "float32",
                    topk: int = 0, vocab_size: int = 0) -> TeacherOutputs:
    """The teacher's outputs for the transfer set ``split``: cached (read from ``out_dir/_cache`` when a file
    with the same key verifies, else computed once and written) when the run allows it, else per batch.
    Translation inputs get the ragged token-level cache (``topk``, ``vocab_size``: module docstring)."""
    store = torch.float16 if dtype == "float16" else torch.float32
    tokens = hasattr(split.x, "token_targets")
    why = reason_not_cacheable(mode, needs, augmented, transforms, TOKEN_CACHEABLE if tokens else CACHEABLE)
    if not why and tokens and not topk:
        size = int(split.x.tgt_lengths().sum()) * vocab_size * (2 if dtype == "float16" else 4)
        if size > FULL_LIMIT_BYTES:
            why = (f"the whole per-token distribution would take {size / 1024**3:.1f} GiB; set teacher.cache_topk "
                   "(e.g. 8) to cache the top-k")
    made = TokenTeacherOutputs if tokens else TeacherOutputs
    if why:
        return made(teacher, status="off", why=why)
    names = ("values", "ids") if tokens and topk else tuple(n for n in CACHEABLE if n in set(needs))
    key = hashlib.sha256("|".join([weights_digest(teacher.model), inputs_digest(split.x), ",".join(names),
                                   str(store), str(len(split)), f"topk={topk}" if tokens else ""]).encode()).hexdigest()
    path = Path(out_dir) / FOLDER / f"{key}.safetensors"
    device = split.y.device
    extra: dict[str, Any] = {}
    if tokens:
        offsets = torch.cat([split.x.tgt_lengths().new_zeros(1), torch.cumsum(split.x.tgt_lengths(), 0)]).long()
        extra = {"offsets": offsets.to(device), "vocab_size": vocab_size, "topk": topk}
    if path.is_file():
        try:
            tensors, state = load_checkpoint(path)
            if state.get("key") == key and sorted(tensors) == sorted(names):  # content digest verified on load
                return made(teacher, {n: t.to(device) for n, t in tensors.items()}, "loaded", path=path,
                            dtype=store, **extra)
        except CheckpointError:
            pass  # unreadable or tampered: recomputed and rewritten below
    cache = compute_token_outputs(teacher, split.x, batch_size, topk, store) if tokens else \
        compute_outputs(teacher, split, names, batch_size, store)
    result = made(teacher, {n: t.to(device) for n, t in cache.items()}, "computed", path=path,
                  forwards=len(split), dtype=store, **extra)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cpu = {n: t.cpu().contiguous() for n, t in cache.items()}
        save_checkpoint(path, cpu, {"key": key, "samples": len(split)})
    except (OSError, WriteError) as e:  # the cache is an optimisation: a run never fails because it cannot be written
        result.why = f"not written to disk ({e})"
        result.path = None
    return result


def run_teacher_outputs(ctx: RunContext, teacher: Tapped, needs: Iterable[str],
                        transforms: bool = False) -> TeacherOutputs:
    """:func:`teacher_outputs` for the run ``ctx``: its transfer set, ``teacher.cache`` / ``cache_dtype``,
    ``out_dir``, ``data.eval_batch_size``, and whether ``data.augment`` changes the inputs every epoch."""
    cfg = ctx.cfg
    return teacher_outputs(teacher, ctx.splits.train, needs=needs, mode=cfg.teacher.cache,
                           augmented=make_augment(cfg.data.augment, ctx.splits) is not None, transforms=transforms,
                           out_dir=Path(cfg.out_dir), batch_size=cfg.data.eval_batch_size,
                           dtype=cfg.teacher.cache_dtype, topk=cfg.teacher.cache_topk,
                           vocab_size=ctx.splits.num_classes)
