"""SQuAD: flattening the official JSON, windows and answer targets, the official scoring, post-processing,
the evaluator on fake models, the tokenisation cache, and one-line errors for bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from teachkit.data import TensorSplit
from teachkit.data.base import Splits
from teachkit.data.raw import load_raw
from teachkit.engine import EVALUATORS
from teachkit.errors import ConfigError, DataError
from teachkit.tasks import squad as sq
from teachkit.tasks.squad import (
    SquadEvaluator,
    SquadExample,
    exact_match,
    f1_score,
    load_examples,
    normalize_answer,
    postprocess,
    squad_scores,
)
from teachkit.types import Batch

SHORT = "The Eiffel Tower was completed in 1889 in Paris. It was designed by the company of Gustave Eiffel."
TREES = ["Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Ginkgo", "Hazel", "Juniper", "Larch", "Maple",
         "Oak", "Poplar", "Rowan", "Spruce", "Willow"]
LONG = " ".join(f"The {t} station lies {9 + 3 * i} kilometres north of the old river crossing." for i, t in
                enumerate(TREES))
SMALL = dict(max_length=48, doc_stride=16, tokenizer="minilm-l6")


def qa(qid: str, question: str, context: str, answers: list[str], impossible: bool = False) -> dict:
    return {"id": qid, "question": question, "is_impossible": impossible,
            "answers": [{"text": a, "answer_start": context.index(a)} for a in answers]}


def write_squad(folder: Path, version: str = "1.1") -> Path:
    """train and dev files: a short paragraph and a long one (several windows at max_length 48); v2.0 adds one
    unanswerable question to each file."""
    folder.mkdir(parents=True, exist_ok=True)
    v2 = version == "2.0"
    train = [
        {"context": SHORT, "qas": [qa("t1", "When was the Eiffel Tower completed?", SHORT, ["1889"]),
                                   qa("t2", "   Who designed the tower?", SHORT, ["the company of Gustave Eiffel"])]},
        {"context": LONG, "qas": [qa("t3", "Which station lies 12 kilometres north?", LONG, ["Birch"]),
                                  qa("t4", "How far north is the Willow station?", LONG, ["54 kilometres"]),
                                  qa("t5", "Which station lies 33 kilometres north?", LONG, ["Juniper station"])]},
    ]
    dev = [
        {"context": SHORT, "qas": [qa("d1", "In which year was the tower completed?", SHORT, ["1889", "in 1889"])]},
        {"context": LONG, "qas": [qa("d2", "Which station lies 42 kilometres north?", LONG, ["Poplar", "The Poplar"]),
                                  qa("d3", "How far north is the Cedar station?", LONG, ["15 kilometres", "15"])]},
    ]
    if v2:
        train[0]["qas"].append({"id": "t6", "question": "Who painted the tower?", "is_impossible": True,
                                "answers": [], "plausible_answers": [{"text": "Gustave Eiffel", "answer_start": 83}]})
        dev[1]["qas"].append({"id": "d4", "question": "Which station lies south of the river?", "is_impossible": True,
                              "answers": []})
    names = sq.FILES["2.0" if v2 else "1.1"]
    for name, data in zip(names, (train, dev), strict=True):
        (folder / name).write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": data}]}))
    return folder


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "text"


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    folder = write_squad(tmp_path_factory.mktemp("squad1"))
    return folder, sq.squad(str(folder), cache_dir=str(folder / "cache"), **SMALL)


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    folder = write_squad(tmp_path_factory.mktemp("squad2"), "2.0")
    return folder, sq.squad(str(folder), version="2.0", cache_dir=str(folder / "cache"), **SMALL)


# -- flattening ---------------------------------------------------------------------------------------------
def test_flattening_v1_and_v2(tmp_path) -> None:
    write_squad(tmp_path / "a")
    train = load_examples(tmp_path / "a" / "train-v1.1.json")
    assert [e.id for e in train] == ["t1", "t2", "t3", "t4", "t5"] and train.version == "1.1"
    assert train[1].question == "   Who designed the tower?" and train[1].answers == ("the company of Gustave Eiffel",)
    assert train[2].context == LONG and LONG[train[2].answer_starts[0]:].startswith("Birch")
    dev = load_examples(tmp_path / "a" / "dev-v1.1.json")
    assert dev[0].answers == ("1889", "in 1889") and not any(e.is_impossible for e in dev)
    assert [e.id for e in load_examples(tmp_path / "a" / "train-v1.1.json", limit=3)] == ["t1", "t2", "t3"]
    write_squad(tmp_path / "b", "2.0")
    dev2 = load_examples(tmp_path / "b" / "dev-v2.0.json", "2.0")
    assert [e.is_impossible for e in dev2] == [False, False, False, True] and dev2[3].answers == ()
    # v1.1 refuses a question without answers
    with pytest.raises(DataError, match=r"question id 'd4'.*version 2.0"):
        load_examples(tmp_path / "b" / "dev-v2.0.json", "1.1")


# -- windows and targets ------------------------------------------------------------------------------------
def check_windows(x, y) -> tuple[int, int]:
    """Every window's target against the answer located independently from the offsets; returns (windows
    holding their answer, windows targeting CLS)."""
    offsets, ids = x.side["offset_mapping"], x.side["example_id"]
    assert offsets.dtype == torch.int32 and ids.dtype == torch.int64 and y.dtype == torch.int64
    inside = cls = 0
    for w in range(len(y)):
        ex = x.examples[int(ids[w])]
        off = offsets[w]
        ctx = (off[:, 0] >= 0).nonzero().flatten()
        # question, special and padding tokens have no context offsets
        assert bool((off[x["attention_mask"][w] == 0] == -1).all()) and bool((off[0] == -1).all())
        s, e = int(y[w, 0]), int(y[w, 1])
        if ex.answers:
            a0 = ex.answer_starts[0]
            a1 = a0 + len(ex.answers[0])
            if int(off[ctx[0], 0]) <= a0 and int(off[ctx[-1], 1]) >= a1:
                assert 0 < s <= e and ex.context[int(off[s, 0]):int(off[e, 1])] == ex.answers[0]
                inside += 1
                continue
        assert (s, e) == (0, 0)
        cls += 1
    return inside, cls


def test_windows_and_targets_map_back_to_the_answer_text(v1, v2) -> None:
    for _, raw in (v1, v2):
        raw.validate()
        assert raw.task == "squad" and raw.num_classes == 2 and raw.val_x is None
        for x, y in ((raw.train_x, raw.train_y), (raw.test_x, raw.test_y)):
            assert x.shape[1] == 48 and set(x) == {"input_ids", "attention_mask", "token_type_ids"}
            inside, cls = check_windows(x, y)
            assert inside >= len(x.examples) - 1 and cls >= 4  # the long context's windows mostly miss the answer
    raw = v1[1]
    ids = raw.train_x.side["example_id"]
    assert torch.equal(torch.unique(ids), torch.arange(5)) and int((ids == 2).sum()) >= 4  # the long context
    # the answer of t3 (early) and of t4 (late) sit in different windows
    hit = (raw.train_y[:, 0] > 0)
    first = lambda k: int((hit & (ids == k)).nonzero()[0])  # noqa: E731
    assert first(2) < first(3) and int(raw.train_x.side["offset_mapping"][first(3)][:, 0].max()) > 400
    # the unanswerable v2 questions target CLS in every window
    raw2 = v2[1]
    for x, y, qid in ((raw2.train_x, raw2.train_y, "t6"), (raw2.test_x, raw2.test_y, "d4")):
        k = [e.id for e in x.examples].index(qid)
        assert bool((y[x.side["example_id"] == k] == 0).all())


def test_question_is_cut_to_max_query_length() -> None:
    tok = sq.load_tokenizer("minilm-l6")
    ex = SquadExample("q", SHORT, "  " + "very " * 30 + "long question: when was it completed?", ("1889",),
                      (SHORT.index("1889"),))
    cols = sq.tokenize_squad(tok, [ex], max_length=48, doc_stride=8, max_query_length=10)
    assert cols["token_type_ids"].shape[1] == 48
    assert int((cols["token_type_ids"][0] == 0).sum() - (cols["attention_mask"][0] == 0).sum()) == 10 + 2
    s, e = int(cols["start_position"][0]), int(cols["end_position"][0])
    assert SHORT[cols["offset_start"][0, s]:cols["offset_end"][0, e]] == "1889"


# -- scoring ------------------------------------------------------------------------------------------------
def test_normalisation_and_scores_follow_the_official_scripts() -> None:
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theory of the anthem") == "theory of anthem"  # whole words only
    assert normalize_answer("U.S.A. (1889)") == "usa 1889"
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0 and exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert f1_score("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)  # P 1/2, R 1
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)  # counts clipped per token
    assert f1_score("Paris", "London") == 0.0 and f1_score("", "Paris") == 0.0 and f1_score("the", "") == 1.0
    golds = [SquadExample("a", "", "", ("1889", "in 1889 "), (0, 0)),
             SquadExample("b", "", "", ("Gustave Eiffel",), (0,)),
             SquadExample("c", "", "", (), (), True)]
    # max over golds; a partial answer
    v1 = squad_scores({0: "In 1889.", 1: "Eiffel"}, golds[:2])
    assert v1 == pytest.approx({"exact": 50.0, "f1": 100 * (1 + 2 / 3) / 2})
    v2 = squad_scores({0: "1889", 1: "", 2: ""}, golds, version_2=True)
    assert v2 == pytest.approx({"exact": 200 / 3, "f1": 200 / 3, "has_ans_exact": 50.0, "has_ans_f1": 50.0,
                                "no_ans_exact": 100.0, "no_ans_f1": 100.0})
    wrong = squad_scores({2: "Paris"}, golds, version_2=True)
    assert wrong["no_ans_exact"] == 0.0 and wrong["no_ans_f1"] == 0.0 and math.isnan(wrong["has_ans_exact"])
    assert squad_scores({2: "The"}, golds, version_2=True)["exact"] == 100.0  # normalises to "" (official)
    # v1.1: a gold normalising to "" matches exactly but has F1 0; v2.0 drops it and scores "" as no-answer
    degenerate = [SquadExample("d", "", "", ("the",), (0,))]
    assert squad_scores({0: "a"}, degenerate) == {"exact": 100.0, "f1": 0.0}
    assert squad_scores({0: "a"}, degenerate, version_2=True)["f1"] == 100.0


# -- post-processing ----------------------------------------------------------------------------------------
def test_postprocess_picks_the_best_valid_span_across_windows() -> None:
    context = "alpha beta gamma delta epsilon zeta"
    words = [(m, m + len(w)) for w, m in zip(context.split(), [context.index(w) for w in context.split()],
                                             strict=True)]
    # two windows of one question: tokens 0-1 are CLS/question, then 3 context words each, then padding
    offsets = torch.full((2, 7, 2), -1, dtype=torch.int32)
    offsets[0, 2:5] = torch.tensor(words[0:3])
    offsets[1, 2:5] = torch.tensor(words[2:5])
    ex = [SquadExample("q", context, "?", ("delta",), (context.index("delta"),))]
    ids = torch.zeros(2, dtype=torch.long)
    start, end = torch.zeros(2, 7), torch.zeros(2, 7)
    start[1, 3] = end[1, 3] = 5.0  # oracle: "delta" in the second window
    start[0, 1] = end[0, 1] = 50.0  # a question token: never a candidate
    assert postprocess(start, end, offsets, ids, ex) == {0: "delta"}
    assert squad_scores(postprocess(start, end, offsets, ids, ex), ex)["exact"] == 100.0
    # end before start is no span: (4, 2) would score 18; the best valid one is (2, 2) at 1 + 9 over (4, 4) at 9
    s2, e2 = torch.zeros(1, 7), torch.zeros(1, 7)
    s2[0, 4], e2[0, 2], s2[0, 2], e2[0, 3] = 9.0, 9.0, 1.0, 1.0
    assert postprocess(s2, e2, offsets[:1], ids[:1], ex) == {0: "alpha"}
    # a span longer than max_answer_length is dropped
    s3, e3 = torch.zeros(1, 7), torch.zeros(1, 7)
    s3[0, 2], e3[0, 4], s3[0, 3], e3[0, 3] = 9.0, 9.0, 2.0, 3.0
    assert postprocess(s3, e3, offsets[:1], ids[:1], ex) == {0: "alpha beta gamma"}  # (2, 4): 18
    # 3 tokens is too long: (2, 3) scores 12, (3, 4) 11, (2, 2) 9
    assert postprocess(s3, e3, offsets[:1], ids[:1], ex, max_answer_length=2) == {0: "alpha beta"}
    # v2.0: CLS mass wins unless the threshold favours the span; the null score is the minimum over windows
    s4, e4 = start.clone(), end.clone()
    s4[:, 0] = e4[:, 0] = 6.0  # null 12 in both windows > best span 10
    assert postprocess(s4, e4, offsets, ids, ex, version_2=True) == {0: ""}
    assert postprocess(s4, e4, offsets, ids, ex, version_2=True, null_threshold=2.5) == {0: "delta"}
    assert postprocess(s4, e4, offsets, ids, ex) == {0: "delta"}  # v1.1 has no null answer
    s4[0, 0] = 4.0  # null 10 in the first window: min(10, 12) - 10 = 0, not > 0
    assert postprocess(s4, e4, offsets, ids, ex, version_2=True) == {0: "delta"}


# -- evaluator ------------------------------------------------------------------------------------------------
class FixedSpans(nn.Module):
    """Logits from input_ids: +10 at the (start, end) a lookup table gives for the window's tokens."""

    def __init__(self, table: dict[tuple[int, ...], tuple[int, int]] | None, cls: bool = False) -> None:
        super().__init__()
        self.table, self.cls = table, cls

    def forward(self, x):
        ids, mask = x["input_ids"], x["attention_mask"]
        out = torch.zeros(*ids.shape, 2)
        for b in range(ids.shape[0]):
            if self.table is None and not self.cls:
                continue
            s, e = (0, 0) if self.cls else self.table[tuple(ids[b][mask[b].bool()].tolist())]
            out[b, s, 0] = out[b, e, 1] = 10.0
        return out


def oracle(*splits: TensorSplit) -> FixedSpans:
    table = {}
    for split in splits:
        for w in range(len(split)):
            row = split.x["input_ids"][w][split.x["attention_mask"][w].bool()]
            table[tuple(row.tolist())] = tuple(split.y[w].tolist())
    return FixedSpans(table)


def make_splits(raw) -> Splits:
    train, test = TensorSplit(raw.train_x, raw.train_y), TensorSplit(raw.test_x, raw.test_y)
    # val carved by question from the training windows (all windows of questions 2 and 3)
    val = train.subset((train.x.side["example_id"] >= 2).nonzero().flatten())
    return Splits("squad", train, val, test, 2, task="squad")


def test_evaluator_end_to_end_v1(v1) -> None:
    splits = make_splits(v1[1])
    ev = EVALUATORS.get("squad")(splits, 3)  # small batches: logits of different widths are padded
    assert isinstance(ev, SquadEvaluator) and ev.metric_names() == ("exact", "f1", "loss") and ev.primary == "f1"
    assert ev.direction("f1") == "max" and ev.direction("loss") == "min"
    assert ev.is_percent("exact") and not ev.is_percent("loss") and ev.format("f1", 50) == "50.00%"
    model = oracle(splits.train, splits.test)
    model.train()
    res = ev.evaluate(model)
    assert model.training and set(res) == {"val", "test"}
    for m in res.values():
        assert m["exact"] == 100.0 and m["f1"] == 100.0 and 0 < m["loss"] < 0.01
    # a model with no preference: the loss is log(L) of the one batch (everything here is 48 tokens wide)
    flat = SquadEvaluator({"test": splits.test}, batch_size=1000).evaluate(FixedSpans(None))
    assert flat["test"]["loss"] == pytest.approx(math.log(splits.test.x[0:len(splits.test)].shape[1]))
    assert flat["test"]["exact"] < 100.0
    # train_acc: 100 per window with both positions right
    y = splits.test.y[:4]
    logits = torch.zeros(4, 48, 2)
    logits[torch.arange(4), y[:, 0], 0] = 1.0
    logits[torch.arange(4), y[:, 1], 1] = 1.0
    logits[0, :, 1] = 0.0
    logits[0, (int(y[0, 1]) + 1) % 48, 1] = 1.0
    acc = ev.train_metrics(logits, Batch(None, y, torch.arange(4)))["train_acc"]
    assert float(acc) == 300.0


def test_evaluator_end_to_end_v2(v2) -> None:
    splits = make_splits(v2[1])
    ev = EVALUATORS.get("squad")(splits, 2)
    assert ev.metric_names() == sq.METRICS_V2 and all(ev.direction(m) == "max" for m in sq.METRICS_V2[:-1])
    res = ev.evaluate(oracle(splits.train, splits.test))["test"]
    assert res["exact"] == res["f1"] == res["has_ans_f1"] == res["no_ans_exact"] == 100.0
    always_null = ev.evaluate(FixedSpans(None, cls=True))
    test = always_null["test"]
    assert test["no_ans_exact"] == 100.0 and test["has_ans_exact"] == 0.0 and test["has_ans_f1"] == 0.0
    assert test["exact"] == pytest.approx(25.0)  # 1 of the 4 dev questions is unanswerable
    # val: the training windows of t6 (unanswerable), t3, t4, t5
    assert [splits.val.x.examples[int(i)].id for i in splits.val.x.side["example_id"].unique()] == \
        ["t6", "t3", "t4", "t5"]
    assert always_null["val"]["exact"] == pytest.approx(25.0) and always_null["val"]["no_ans_f1"] == 100.0


def test_evaluator_refuses_splits_without_squad_examples() -> None:
    split = TensorSplit(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ConfigError, match="'squad' dataset"):
        EVALUATORS.get("squad")(Splits("toy", split, split, split, 2, task="squad"), 8)


def test_load_splits_and_evaluate(tmp_path, v1) -> None:
    from teachkit.data import load_splits

    raw = v1[1]
    splits = load_splits("squad", str(v1[0]), options=dict(SMALL, cache_dir=str(v1[0] / "cache")))
    assert splits.task == "squad" and splits.mean is None
    assert len(splits.train) + len(splits.val) == len(raw.train_y) and len(splits.test) == len(raw.test_y)
    assert [e.id for e in splits.val.x.examples] == [e.id for e in raw.train_x.examples]  # shared, indexed by id
    res = EVALUATORS.get("squad")(splits, 8).evaluate(oracle(TensorSplit(raw.train_x, raw.train_y),
                                                             TensorSplit(raw.test_x, raw.test_y)))
    # val is carved from the training windows (100 once all windows of a question stay in one split)
    assert res["test"]["f1"] == 100.0 and 0.0 <= res["val"]["f1"] <= 100.0 and res["val"]["loss"] < 0.01


# -- cache ----------------------------------------------------------------------------------------------------
def test_second_load_reads_the_cache(tmp_path, cache, monkeypatch) -> None:
    folder = write_squad(tmp_path / "data")
    first = load_raw("squad", str(folder), dict(SMALL, limit=4))
    assert len(first.train_x.examples) == 4 and len(list(cache.iterdir())) == 2  # train and dev entries

    def refuse(name):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(sq, "load_tokenizer", refuse)
    again = load_raw("squad", str(folder), dict(SMALL, limit=4))
    for a, b in ((first.train_x, again.train_x), (first.test_x, again.test_x)):
        assert all(torch.equal(a[k], b[k]) for k in a) and all(torch.equal(a.side[k], b.side[k]) for k in a.side)
    assert torch.equal(first.train_y, again.train_y)
    with pytest.raises(AssertionError, match="tokenised again"):  # another option is another cache entry
        load_raw("squad", str(folder), dict(SMALL, limit=4, doc_stride=8))
    # a changed file changes the key
    path = folder / "dev-v1.1.json"
    path.write_text(path.read_text().replace("1889", "1890"))
    with pytest.raises(AssertionError, match="tokenised again"):
        load_raw("squad", str(folder), dict(SMALL, limit=4))


# -- bad inputs -----------------------------------------------------------------------------------------------
def _malformed(folder: Path) -> None:
    (folder / "dev-v1.1.json").write_text('{"data": [ {"paragraphs": [}')


def _no_context(folder: Path) -> None:
    doc = json.loads((folder / "train-v1.1.json").read_text())
    del doc["data"][0]["paragraphs"][1]["context"]
    (folder / "train-v1.1.json").write_text(json.dumps(doc))


BAD = [
    ("missing files", lambda f: (f / "dev-v1.1.json").unlink(), {}, DataError,
     ["dev-v1.1.json", "rajpurkar.github.io/SQuAD-explorer"]),
    ("v2 files absent", None, {"version": "2.0"}, DataError, ["train-v2.0.json and dev-v2.0.json"]),
    ("bad version", None, {"version": "3.0"}, ConfigError, ["'3.0'", "1.1, 2.0"]),
    ("max_length too short", None, {"max_length": 12}, ConfigError, ["max_length=12", "has 9 tokens"]),
    ("stride too long", None, {"doc_stride": 40}, ConfigError, ["doc_stride=40", "max_length=48"]),
    ("max_length not an int", None, {"max_length": "big"}, ConfigError, ["'max_length'", "'big'"]),
    ("malformed JSON", _malformed, {}, DataError, ["dev-v1.1.json", "not valid JSON"]),
    ("missing field", _no_context, {}, DataError, ["train-v1.1.json", "data[0].paragraphs[1]", "'context'"]),
    ("unknown option", None, {"window": 3}, ConfigError, ["'window'"]),
]


@pytest.mark.parametrize("what,edit,options,error,words", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_are_one_line_errors(tmp_path, what, edit, options, error, words) -> None:
    folder = write_squad(tmp_path / "data")
    if edit is not None:
        edit(folder)
    with pytest.raises(error) as info:
        load_raw("squad", str(folder), {**SMALL, **options})
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message



def test_post_processing_options_reach_the_evaluator(tmp_path, monkeypatch):
    """n_best / max_answer_length / null_threshold are squad options that travel to the evaluator."""
    from teachkit.data import DataConfig, load_splits
    from teachkit.engine import EVALUATORS
    from teachkit.options import from_mapping

    monkeypatch.setenv("TEACHKIT_CACHE", str(tmp_path / "cache"))
    root = write_squad(tmp_path / "sq", "2.0")
    cfg = from_mapping(DataConfig, {"name": "squad", "root": str(root), "options": {
        "version": "2.0", "max_length": 48, "doc_stride": 16, "n_best": 5, "max_answer_length": 7,
        "null_threshold": 1.5}}, "data")
    evaluator = EVALUATORS.get("squad")(load_splits(cfg), 64)
    assert (evaluator.n_best, evaluator.max_answer_length, evaluator.null_threshold) == (5, 7, 1.5)
    with pytest.raises(ConfigError, match="'null_threshold' must be a finite number, got 'x'"):
        load_splits(from_mapping(DataConfig, {"name": "squad", "root": str(root), "options": {
            "version": "2.0", "null_threshold": "x"}}, "data"))
