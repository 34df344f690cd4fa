"""GLUE: every task read from tiny official-TSV and Hub-Parquet files, the tokenisation cache, the metrics
against scikit-learn / scipy / hand values, the evaluators, the GLUE average, bad inputs, and load_splits."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from torch import nn

from teachkit.data import DataConfig, TensorSplit, load_raw, load_splits
from teachkit.data.raw import REGRESSION_TASKS, is_regression
from teachkit.data.text import TokenFeatures, tokenisation
from teachkit.engine import EVALUATORS
from teachkit.errors import ConfigError, DataError
from teachkit.tasks import glue as glue_module
from teachkit.tasks.glue import (
    TASKS,
    GlueEvaluator,
    average_ranks,
    glue,
    glue_average,
    glue_metrics,
    pearson,
    read_tsv,
    spearman,
    task_score,
)
from teachkit.types import Batch

ALL_TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
FOLDER = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
          "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
#: label names as the official TSV files write them (the Hub's id order: index = id)
TSV_NAMES = {"mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
             "rte": ["entailment", "not_entailment"]}
NUM_CLASSES = {"cola": 2, "sst2": 2, "mrpc": 2, "stsb": 1, "qqp": 2, "mnli": 3, "qnli": 2, "rte": 2, "wnli": 2}
PAIR = {t: t not in ("cola", "sst2") for t in ALL_TASKS}
WORDS = "apple river quiet stone orange music winter garden silver bright cloud forest yellow paper".split()


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))


def sentence(i: int, salt: str) -> str:
    return f"{salt} {WORDS[i % len(WORDS)]} {WORDS[(3 * i + 1) % len(WORDS)]} number {i}."


def examples(task: str, n: int, salt: str) -> tuple[list[str], list[str], list]:
    """n examples: texts (the first holds a stray quote) and targets (ids; STS-B: scores 0..5)."""
    first = [sentence(i, salt) for i in range(n)]
    first[0] = '"Hello there, said the cat.'  # an unbalanced opening quote: a quoting reader merges rows
    second = [sentence(i + 50, salt + "b") for i in range(n)]
    second[0] = 'a 12" record'
    if task == "stsb":
        y = [round(5 * ((7 * i) % n) / max(n - 1, 1), 2) for i in range(n)]
    else:
        y = [i % NUM_CLASSES[task] for i in range(n)]
    return first, second, y


def tsv_lines(task: str, first: list[str], second: list[str], y: list, dev: bool) -> list[str]:
    """The rows of an official GLUE TSV file of ``task``, header first (CoLA has none)."""
    lab = [TSV_NAMES[task][v] if task in TSV_NAMES else str(v) for v in y]
    rows = list(zip(first, second, lab, strict=True))
    if task == "cola":
        return [f"gj04\t{c}\t{'' if c == '1' else '*'}\t{a}" for a, _, c in rows]
    if task == "sst2":
        return ["sentence\tlabel"] + [f"{a} \t{c}" for a, _, c in rows]
    if task == "mrpc":
        return ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [f"{c}\t{i}\t{i + 1}\t{a}\t{b}"
                                                                   for i, (a, b, c) in enumerate(rows)]
    if task == "stsb":
        head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
        return [head] + [f"{i}\tmain-news\tMSRvid\t2012test\t{i}\tnone\tnone\t{a}\t{b}\t{c}"
                         for i, (a, b, c) in enumerate(rows)]
    if task == "qqp":
        return ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"] + [f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{c}"
                                                                         for i, (a, b, c) in enumerate(rows)]
    if task == "mnli":
        labels = "\t".join(f"label{k}" for k in range(1, 6 if dev else 2))
        head = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
                f"sentence2_parse\tsentence1\tsentence2\t{labels}\tgold_label")
        votes = 5 if dev else 1
        return [head] + [f"{i}\t{i}\t{i}e\tfiction\t( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})\t{a}\t{b}\t"
                         + "\t".join([c] * votes) + f"\t{c}" for i, (a, b, c) in enumerate(rows)]
    if task == "qnli":
        return ["index\tquestion\tsentence\tlabel"] + [f"{i}\t{a}\t{b}\t{c}" for i, (a, b, c) in enumerate(rows)]
    return ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\t{a}\t{b}\t{c}" for i, (a, b, c) in enumerate(rows)]


def write_tsv(folder, task: str, name: str, first, second, y, dev: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(tsv_lines(task, first, second, y, dev)) + "\n", encoding="utf-8")


def write_parquet(path, task: str, first, second, y) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, b = TASKS[task].parquet
    cols = {a: first} if b is None else {a: first, b: second}
    label = pa.array(y, pa.float32()) if task == "stsb" else pa.array(y, pa.int64())
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({**cols, "label": label, "idx": list(range(len(y)))}), path)


SIZES = {"train": 12, "dev": 6, "dev_mm": 5}


def make_glue(root, task: str, layout: str, inside: bool = True) -> dict[str, list]:
    """Tiny files of ``task`` in ``layout`` under ``root`` (in its task folder when ``inside``); returns the
    targets written per split."""
    written = {}
    splits = ["train", "dev", "dev_mm"] if task == "mnli" else ["train", "dev"]
    for split in splits:
        first, second, y = examples(task, SIZES[split], split)
        written[split] = y
        if layout == "tsv":
            name = {"train": "train.tsv", "dev": "dev_matched.tsv" if task == "mnli" else "dev.tsv",
                    "dev_mm": "dev_mismatched.tsv"}[split]
            write_tsv(root / FOLDER[task] if inside else root, task, name, first, second, y, split != "train")
        else:
            stem = {"train": "train", "dev": "validation_matched" if task == "mnli" else "validation",
                    "dev_mm": "validation_mismatched"}[split]
            write_parquet((root / task if inside else root) / f"{stem}-00000-of-00001.parquet", task, first, second, y)
    return written


def check_targets(y: torch.Tensor, expected: list, task: str) -> None:
    if task == "stsb":
        assert y.dtype == torch.float32 and y.shape == (len(expected),)
        assert torch.allclose(y, torch.tensor(expected, dtype=torch.float32))
    else:
        assert y.dtype == torch.int64 and y.tolist() == expected


# ---------------------------------------------------------------- the source


@pytest.mark.parametrize("layout", ["tsv", "parquet"])
@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_task_loads_in_both_layouts(tmp_path, task, layout):
    written = make_glue(tmp_path / "glue", task, layout)
    raw = load_raw("glue", str(tmp_path / "glue"), {"task": task, "max_length": 32})
    assert raw.task == f"glue-{task}" and raw.name == "glue" and raw.num_classes == NUM_CLASSES[task]
    assert raw.val_x is None and raw.val_y is None
    assert isinstance(raw.train_x, TokenFeatures) and isinstance(raw.test_x, TokenFeatures)
    assert raw.train_x.shape[0] == SIZES["train"] and raw.test_x.shape[0] == SIZES["dev"]
    check_targets(raw.train_y, written["train"], task)
    check_targets(raw.test_y, written["dev"], task)
    # sentence pairs: the second segment has token type 1; single sentences have none
    assert bool((raw.train_x["token_type_ids"] == 1).any()) == PAIR[task]
    if task == "mnli":
        assert list(raw.extra_test) == ["test_mm"]
        x_mm, y_mm = raw.extra_test["test_mm"]
        assert x_mm.shape[0] == SIZES["dev_mm"]
        check_targets(y_mm, written["dev_mm"], task)
    else:
        assert raw.extra_test == {}
    assert is_regression(raw.task) == (task == "stsb")


def test_label_ids_follow_the_hub_order(tmp_path):
    """MNLI names map to 0 entailment, 1 neutral, 2 contradiction; RTE 0 entailment, 1 not_entailment."""
    folder = tmp_path / "MNLI"
    rows = ["neutral", "contradiction", "entailment", "neutral"]
    first = [f"premise {i}" for i in range(4)]
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        write_tsv(folder, "mnli", name, first, first, [TSV_NAMES["mnli"].index(r) for r in rows], dev=False)
    assert (folder / "train.tsv").read_text().splitlines()[1].endswith("\tneutral\tneutral")
    assert glue(str(tmp_path), task="mnli", max_length=16).train_y.tolist() == [1, 2, 0, 1]
    folder = tmp_path / "RTE"
    folder.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (folder / name).write_text("index\tsentence1\tsentence2\tlabel\n"
                                   "0\ta b\tc\tnot_entailment\n1\td\te\tentailment\n")
    assert glue(str(tmp_path), task="rte", max_length=16).train_y.tolist() == [1, 0]


@pytest.mark.parametrize("layout", ["tsv", "parquet"])
def test_root_may_be_the_task_folder(tmp_path, layout):
    written = make_glue(tmp_path / "only", "rte", layout, inside=False)
    raw = glue(str(tmp_path / "only"), task="rte", max_length=16)
    assert raw.train_y.tolist() == written["train"] and raw.test_y.tolist() == written["dev"]


def test_stray_quotes_are_text_and_do_not_merge_rows(tmp_path):
    make_glue(tmp_path, "sst2", "tsv")
    rows = read_tsv(tmp_path / "SST-2" / "train.tsv", TASKS["sst2"])
    assert len(rows.first) == SIZES["train"] and rows.skipped == 0
    assert rows.first[0] == '"Hello there, said the cat. '  # quote and trailing space kept as in the file
    assert rows.first[1] == sentence(1, "train") + " "
    # a reader that honours quotes would glue the lines after the stray quote together
    with open(tmp_path / "SST-2" / "train.tsv", newline="") as f:
        assert len(list(csv.reader(f, delimiter="\t"))) < 1 + SIZES["train"]


def test_qqp_malformed_rows_are_skipped_and_counted(tmp_path):
    make_glue(tmp_path, "qqp", "tsv")
    path = tmp_path / "QQP" / "train.tsv"
    lines = path.read_text().splitlines()
    lines.insert(3, "999\t1\t2\ta question cut short")  # 4 fields of 6
    lines.insert(6, "1000\t3")
    path.write_text("\n".join(lines) + "\n")
    assert read_tsv(path, TASKS["qqp"]).skipped == 2
    raw = glue(str(tmp_path), task="qqp", max_length=16)  # a dataset warning (one line in the run), no UserWarning
    assert len(raw.warnings) == 1 and "skipped 2 malformed rows (too few fields)" in raw.warnings[0]
    assert "train.tsv" in raw.warnings[0] and "\n" not in raw.warnings[0]
    assert raw.train_x.shape[0] == SIZES["train"]


def test_a_short_row_elsewhere_is_an_error_naming_the_line(tmp_path):
    make_glue(tmp_path, "rte", "tsv")
    path = tmp_path / "RTE" / "train.tsv"
    path.write_text(path.read_text() + "77\tonly one sentence\n")
    with pytest.raises(DataError, match=r"train\.tsv' line 14 has 2 tab-separated fields") as e:
        glue(str(tmp_path), task="rte", max_length=16)
    assert "\n" not in str(e.value)


def test_second_load_reads_the_cache(tmp_path, monkeypatch):
    make_glue(tmp_path, "mnli", "parquet")
    first = glue(str(tmp_path), task="mnli", max_length=24)
    assert any((tmp_path / "cache" / "text").iterdir())

    def no_tokenizer(name):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr("teachkit.data.text.load_tokenizer", no_tokenizer)
    again = glue(str(tmp_path), task="mnli", max_length=24)
    for a, b in ((first.train_x, again.train_x), (first.test_x, again.test_x),
                 (first.extra_test["test_mm"][0], again.extra_test["test_mm"][0])):
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(first.train_y, again.train_y)
    # other options or changed files are other cache entries: they tokenise (and here fail)
    with pytest.raises(AssertionError, match="tokenised again"):
        glue(str(tmp_path), task="mnli", max_length=25)
    write_parquet(tmp_path / "mnli" / "train-00000-of-00001.parquet", "mnli", ["new premise"] * 3, ["h"] * 3,
                  [0, 1, 2])
    with pytest.raises(AssertionError, match="tokenised again"):
        glue(str(tmp_path), task="mnli", max_length=24)


def test_teacher_tokenizer_adds_prefixed_inputs(tmp_path):
    make_glue(tmp_path, "sst2", "tsv")
    raw = glue(str(tmp_path), task="sst2", max_length=16, teacher_tokenizer="minilm-l6",
               cache_dir=str(tmp_path / "own"))
    assert torch.equal(raw.train_x["teacher.input_ids"], raw.train_x["input_ids"])
    assert set(tokenisation(raw.train_x, "teacher")) == {"input_ids", "attention_mask", "token_type_ids"}
    assert any((tmp_path / "own").iterdir())


# ---------------------------------------------------------------- bad inputs


def bad_label(root):
    make_glue(root, "rte", "tsv")
    path = root / "RTE" / "dev.tsv"
    path.write_text(path.read_text().replace("\tnot_entailment\n", "\tmaybe\n", 1))
    return "rte", "'maybe'", "dev.tsv"


def bad_score(root):
    make_glue(root, "stsb", "tsv")
    path = root / "STS-B" / "train.tsv"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\thigh"
    path.write_text("\n".join(lines) + "\n")
    return "stsb", "'high'", "train.tsv"


def bad_parquet_label(root):
    make_glue(root, "qnli", "parquet")
    write_parquet(root / "qnli" / "validation-00000-of-00001.parquet", "qnli", ["q"] * 2, ["s"] * 2, [0, -1])
    return "qnli", "-1", "validation-00000-of-00001.parquet"


def no_files(root):
    (root / "SST-2").mkdir(parents=True)
    return "sst2", "SST-2/train.tsv", "gluebenchmark.com"


def no_dev(root):
    make_glue(root, "mnli", "tsv")
    (root / "MNLI" / "dev_mismatched.tsv").unlink()
    return "mnli", "dev_mismatched.tsv", "nyu-mll/glue"


def no_parquet_dev(root):
    make_glue(root, "cola", "parquet")
    (root / "cola" / "validation-00000-of-00001.parquet").unlink()
    return "cola", "validation-*.parquet", "gluebenchmark.com"


def wrong_file(root):
    (root / "MRPC").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (root / "MRPC" / name).write_text("sentence\tlabel\na\t0\n")
    return "mrpc", "'#1 String'", "header: sentence, label"


@pytest.mark.parametrize("make", [bad_label, bad_score, bad_parquet_label, no_files, no_dev, no_parquet_dev,
                                  wrong_file])
def test_bad_files_are_one_line_data_errors(tmp_path, make):
    root = tmp_path / "glue"
    task, *needles = make(root)
    with pytest.raises(DataError) as e:
        load_raw("glue", str(root), {"task": task, "max_length": 16})
    msg = str(e.value)
    assert "\n" not in msg and repr(task) in msg, msg
    for needle in needles:
        assert needle in msg, msg


def test_missing_files_message_names_task_folder_files_and_where_published(tmp_path):
    with pytest.raises(DataError) as e:
        glue(str(tmp_path), task="qqp")
    msg = str(e.value)
    assert "\n" not in msg
    for needle in ("'qqp'", str(tmp_path), "QQP/train.tsv", "QQP/dev.tsv", "qqp/train-*.parquet",
                   "qqp/validation-*.parquet", "https://gluebenchmark.com/tasks", "nyu-mll/glue"):
        assert needle in msg, needle
    with pytest.raises(DataError, match="is not a folder"):
        glue(str(tmp_path / "nowhere"), task="qqp")


@pytest.mark.parametrize("root, options, needles", [
    ("ROOT", {"task": "sst3"}, ["'sst3'", "did you mean 'sst2'", "cola, sst2, mrpc"]),
    ("ROOT", {"task": 2}, ["2", "choose one of"]),
    (None, {"task": "rte"}, ["data.root", "RTE/"]),
    ("ROOT", {"task": "rte", "max_length": 4}, ["'max_length'", "4"]),
    ("ROOT", {"task": "rte", "tokenizer": ""}, ["'tokenizer'", "''"]),
    ("ROOT", {"task": "rte", "tokenizer": "no-such-model-xyz"}, ["'no-such-model-xyz'", "not found offline"]),
    ("ROOT", {"task": "rte", "cache_dir": 3}, ["'cache_dir'", "3"]),
    ("ROOT", {"task": "rte", "split": "train"}, ["'split'", "allowed options"]),
])
def test_bad_options_are_one_line_config_errors(tmp_path, root, options, needles):
    make_glue(tmp_path, "rte", "tsv")
    with pytest.raises(ConfigError) as e:
        load_raw("glue", str(tmp_path) if root else None, options)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


# ---------------------------------------------------------------- metrics


def logits_for(pred, num_classes=2) -> torch.Tensor:
    out = torch.zeros(len(pred), num_classes)
    out[torch.arange(len(pred)), torch.tensor(pred)] = 2.0
    return out


def test_cola_mcc_hand_computed_and_against_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    y = [1, 1, 1, 0, 0, 0, 0, 1]
    pred = [1, 1, 0, 0, 0, 1, 0, 1]  # TP 3, FN 1, FP 1, TN 3: MCC = (9 - 1) / 16 = 0.5
    m = glue_metrics("cola", logits_for(pred), torch.tensor(y))
    assert set(m) == {"mcc", "acc", "loss"}
    assert m["mcc"] == pytest.approx(50.0) and m["acc"] == pytest.approx(75.0)
    rng = np.random.default_rng(1)
    y, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    m = glue_metrics("cola", logits_for(pred.tolist()), torch.tensor(y))
    assert m["mcc"] == pytest.approx(100 * sk.matthews_corrcoef(y, pred), abs=1e-9)
    assert m["mcc"] != pytest.approx(0.0, abs=1e-6)
    assert m["loss"] == pytest.approx(float(nn.functional.cross_entropy(logits_for(pred.tolist()),
                                                                        torch.tensor(y))), rel=1e-6)


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_acc_f1_and_their_mean(task):
    sk = pytest.importorskip("sklearn.metrics")
    y = [1, 0, 0, 0, 0, 1]
    pred = [1, 1, 1, 0, 0, 0]  # TP 1, FP 2, FN 1: F1 = 2/5; acc 3/6
    m = glue_metrics(task, logits_for(pred), torch.tensor(y))
    assert m["f1"] == pytest.approx(40.0) and m["acc"] == pytest.approx(50.0) and m["score"] == pytest.approx(45.0)
    rng = np.random.default_rng(2)
    y, pred = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    m = glue_metrics(task, logits_for(pred.tolist()), torch.tensor(y))
    assert m["f1"] == pytest.approx(100 * sk.f1_score(y, pred), abs=1e-9)
    assert m["acc"] == pytest.approx(100 * sk.accuracy_score(y, pred), abs=1e-9)
    assert m["score"] == pytest.approx((m["f1"] + m["acc"]) / 2)


def test_stsb_correlations_against_scipy_and_by_hand():
    stats = pytest.importorskip("scipy.stats")
    # by hand: perfectly monotone but not linear -> spearman 1, pearson < 1
    pred = torch.tensor([[1.0], [2.0], [3.0], [10.0]])
    gold = torch.tensor([0.0, 1.0, 2.0, 3.0])
    m = glue_metrics("stsb", pred, gold)
    assert m["spearman"] == pytest.approx(100.0)
    r = np.corrcoef([1, 2, 3, 10], [0, 1, 2, 3])[0, 1]
    assert m["pearson"] == pytest.approx(100 * r) and r < 0.95
    assert m["score"] == pytest.approx((m["pearson"] + m["spearman"]) / 2)
    assert m["loss"] == pytest.approx((1 + 1 + 1 + 49) / 4)
    # with ties (STS-B scores repeat): scipy's average-rank Spearman
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 6, 120).astype(np.float32)
    pred = (gold + rng.normal(0, 2, 120)).round(0).astype(np.float32)
    m = glue_metrics("stsb", torch.tensor(pred), torch.tensor(gold))
    p64, g64 = pred.astype(np.float64), gold.astype(np.float64)
    assert m["pearson"] == pytest.approx(100 * stats.pearsonr(p64, g64)[0], rel=1e-9)
    assert m["spearman"] == pytest.approx(100 * stats.spearmanr(p64, g64)[0], rel=1e-9)
    assert average_ranks(pred).tolist() == stats.rankdata(pred).tolist()
    # constant predictions: no defined correlation, scored 0 (not NaN)
    assert pearson(np.ones(5), np.arange(5)) == 0.0 and spearman(np.arange(5), np.full(5, 2.0)) == 0.0
    assert average_ranks(np.array([])).tolist() == []


def test_accuracy_tasks_and_shape_errors():
    y = torch.tensor([0, 1, 2, 2])
    logits = logits_for([0, 2, 2, 1], 3)
    m = glue_metrics("mnli", logits, y)
    assert m == pytest.approx({"acc": 50.0, "loss": float(nn.functional.cross_entropy(logits, y))})
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        glue_metrics("mnli", logits_for([0, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="STS-B outputs"):
        glue_metrics("stsb", torch.zeros(4, 2), torch.zeros(4))


# ---------------------------------------------------------------- evaluators


class MeanPool(nn.Module):
    """Token-embedding mean under the attention mask, then a linear head: invariant to the padding width."""

    def __init__(self, out: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(31000, 8)
        self.head = nn.Linear(8, out)

    def forward(self, x: TokenFeatures) -> torch.Tensor:
        mask = x["attention_mask"].unsqueeze(-1).float()
        return self.head((self.emb(x["input_ids"]) * mask).sum(1) / mask.sum(1))


def test_mnli_evaluator_scores_every_split_in_batches(tmp_path):
    make_glue(tmp_path, "mnli", "tsv")
    splits = load_splits(DataConfig(name="glue", root=str(tmp_path), options={"task": "mnli", "max_length": 32}))
    assert set(splits.eval_splits()) == {"val", "test", "test_mm"}
    model = MeanPool(3)
    ev = EVALUATORS.get("glue-mnli")(splits, 2)  # batches of 2: each trimmed to its own longest row
    assert isinstance(ev, GlueEvaluator) and ev.primary == "acc" and ev.metric_names() == ("acc", "loss")
    got = ev.evaluate(model)
    assert set(got) == {"val", "test", "test_mm"}
    for name, split in splits.eval_splits().items():
        with torch.no_grad():
            want = glue_metrics("mnli", model.eval()(split.x), split.y)
        assert got[name] == pytest.approx(want, rel=1e-5)
    batch = Batch(splits.train.x[:4], splits.train.y[:4], torch.arange(4))
    out = model(batch.x)
    assert float(ev.train_metrics(out, batch)["train_acc"]) == 100.0 * int((out.argmax(1) == batch.y).sum())


def test_evaluator_metadata_per_task():
    split = TensorSplit(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
    cola, mrpc = GlueEvaluator("cola", {"val": split}), GlueEvaluator("mrpc", {"val": split})
    stsb = GlueEvaluator("stsb", {"val": TensorSplit(torch.zeros(2, 1), torch.zeros(2))})
    assert (cola.primary, mrpc.primary, stsb.primary) == ("mcc", "score", "score")
    assert stsb.metric_names() == ("score", "pearson", "spearman", "loss")
    assert mrpc.is_percent("score") and mrpc.is_percent("f1") and mrpc.is_percent("train_acc")
    assert not stsb.is_percent("score") and not stsb.is_percent("pearson") and not cola.is_percent("mcc")
    assert mrpc.format("score", 84.567) == "84.57%" and cola.format("mcc", 52.1234) == "52.12"
    assert [cola.direction(m) for m in ("mcc", "acc", "loss")] == ["max", "max", "min"]
    assert stsb.direction("spearman") == "max" and stsb.direction("loss") == "min"
    assert stsb.train_metrics(torch.zeros(2, 1), Batch(torch.zeros(2, 1), torch.zeros(2), torch.arange(2))) == {}
    assert sorted(n for n in EVALUATORS.names() if n.startswith("glue-")) == sorted(f"glue-{t}" for t in ALL_TASKS)
    assert "glue-stsb" in REGRESSION_TASKS and not is_regression("glue-sst2")


def test_evaluator_refuses_the_wrong_output_width(tmp_path):
    make_glue(tmp_path, "sst2", "tsv")
    splits = load_splits(DataConfig(name="glue", root=str(tmp_path), options={"task": "sst2", "max_length": 16}))
    splits.num_classes = 3
    with pytest.raises(ConfigError, match="'glue-sst2' but 3 outputs"):
        EVALUATORS.get("glue-sst2")(splits, 8)


# ---------------------------------------------------------------- the GLUE average


# BERT-large on the GLUE leaderboard: score 80.5
BERT_LARGE = {"cola": {"mcc": 60.5}, "sst2": {"acc": 94.9}, "mrpc": {"f1": 89.3, "acc": 85.4},
              "stsb": {"pearson": 87.6, "spearman": 86.5}, "qqp": {"f1": 72.1, "acc": 89.3},
              "mnli": {"acc": 86.7}, "mnli-mm": {"acc": 85.9}, "qnli": {"acc": 92.7}, "rte": {"acc": 70.1},
              "wnli": {"acc": 65.1}}


def test_glue_average_reproduces_the_leaderboard():
    avg = glue_average(BERT_LARGE)
    assert round(avg, 1) == 80.5
    by_hand = (60.5 + 94.9 + (89.3 + 85.4) / 2 + (87.6 + 86.5) / 2 + (72.1 + 89.3) / 2 + (86.7 + 85.9) / 2
               + 92.7 + 70.1 + 65.1) / 9
    assert avg == pytest.approx(by_hand)
    prefixed = {f"glue-{k}": v for k, v in BERT_LARGE.items()}
    assert glue_average(prefixed) == pytest.approx(by_hand)
    # a task's score metric stands in for its components; a subset averages the tasks given
    assert glue_average({"mrpc": {"score": 80.0}, "stsb": {"score": 70.0}, "cola": {"mcc": 30.0}}) == pytest.approx(60)
    assert task_score("qqp", {"acc": 90.0, "f1": 70.0, "score": 1.0}) == 80.0


@pytest.mark.parametrize("scores, match", [
    ({}, "at least one task"),
    ({"mnli": {"acc": 80.0}}, "mnli-mm"),
    ({"sst3": {"acc": 80.0}}, "did you mean 'sst2'"),
    ({"cola": {"acc": 80.0}}, "cola scores need mcc"),
    ({"mrpc": {"f1": 80.0}}, "acc and f1, or score"),
])
def test_glue_average_refuses_incomplete_scores(scores, match):
    with pytest.raises(ValueError, match=match):
        glue_average(scores)


# ---------------------------------------------------------------- end to end


def test_load_splits_carves_a_stratified_val_from_train(tmp_path):
    make_glue(tmp_path, "sst2", "parquet")
    cfg = DataConfig(name="glue", root=str(tmp_path), val_fraction=0.25, options={"task": "sst2", "max_length": 32})
    splits = load_splits(cfg)
    for part in (splits.train, splits.val, splits.test):
        assert isinstance(part.x, TokenFeatures) and part.x.shape[0] == len(part.y)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (9, 3, SIZES["dev"])
    assert splits.task == "glue-sst2" and splits.mean is None and splits.extra_test == {}
    assert sorted(torch.cat([splits.train.y, splits.val.y]).tolist()) == sorted(examples("sst2", 12, "train")[2])
    assert 1 <= int(splits.val.y.sum()) <= 2  # both classes in val (3 of 6 + 6)
    # val rows are train rows: their token ids are among the full train features'
    raw = load_raw("glue", str(tmp_path), {"task": "sst2", "max_length": 32})
    full = {tuple(r[r != 0].tolist()) for r in raw.train_x["input_ids"]}
    assert all(tuple(r[r != 0].tolist()) in full for r in splits.val.x["input_ids"])
    again = load_splits(cfg)
    assert torch.equal(again.val.x["input_ids"], splits.val.x["input_ids"])


def test_stsb_through_load_splits_is_regression(tmp_path):
    make_glue(tmp_path, "stsb", "tsv")
    splits = load_splits(DataConfig(name="glue", root=str(tmp_path), options={"task": "stsb", "max_length": 32}))
    assert splits.num_classes == 1 and splits.train.y.dtype == torch.float32
    assert len(splits.train) + len(splits.val) == SIZES["train"] and len(splits.test) == SIZES["dev"]
    ev = EVALUATORS.get("glue-stsb")(splits, 4)
    got = ev.evaluate(MeanPool(1))
    assert set(got["test"]) == {"score", "pearson", "spearman", "loss"}
    assert all(math.isfinite(v) for v in got["test"].values())


def test_heavy_libraries_are_not_imported_at_module_level():
    import inspect
    head = inspect.getsource(glue_module).split("\ndef ", 1)[0]
    for lib in ("pandas", "pyarrow", "datasets", "transformers", "scipy"):
        assert f"import {lib}" not in head and f"from {lib}" not in head
