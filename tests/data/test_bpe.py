"""Joint BPE (teachkit.data.bpe): learning with the tokenizers trainer, deterministic merges, the ``@@`` notation
and its round trip through merge_units, the JSON format, and detection of files that are already BPE'd."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from teachkit.data.bpe import END, JointBPE, is_bpe_marked, learn_bpe
from teachkit.data.parallel import BPE_MARK, merge_units
from teachkit.errors import ConfigError, DataError

pytest.importorskip("tokenizers")

DE = ["der kleine hund schläft unter dem tisch", "die kleinen hunde schlafen", "über die straße laufen die hunde",
      "ein hund und eine katze", "die katze schläft", "naïve größe"] * 5
EN = ["the small dog sleeps under the table", "the small dogs sleep", "the dogs run across the street",
      "a dog and a cat", "the cat sleeps", "naive size"] * 5


@pytest.fixture(scope="module")
def bpe() -> JointBPE:
    return learn_bpe(DE + EN, 40)


def test_learned_merges_segment_words_into_marked_pieces(bpe):
    assert 0 < len(bpe) <= 40
    units = bpe.apply("the small dogs")
    assert all(u for u in units)
    assert merge_units(units) == "the small dogs"
    # frequent words end up whole, rarer ones in pieces with @@ on every piece but the last of a word
    assert "the" in units
    pieces = bpe.segment("unterschätzt")
    assert len(pieces) > 1 and all(p.endswith(BPE_MARK) for p in pieces[:-1]) and not pieces[-1].endswith(BPE_MARK)
    assert END not in "".join(u for line in DE + EN for u in bpe.apply(line))


@pytest.mark.parametrize("line", [
    "the small dog sleeps", "die straße", "naïve größe", "ünïcödé wörds ñ 東京 emoji🙂", "x", "a b c d",
    "zzzz qqqq never seen", "hund-katze 1,000 @-@ &apos;s", "  spaced   out\ttext  ", "",
])
def test_round_trip_through_merge_units(bpe, line):
    assert merge_units(bpe.apply(line)) == " ".join(line.split())


def test_round_trip_on_random_unicode_words(bpe):
    r = random.Random(1)
    alphabet = "abcdefghijkäöüßéñ東京😀-'"
    for _ in range(200):
        line = " ".join("".join(r.choice(alphabet) for _ in range(r.randint(1, 9))) for _ in range(r.randint(1, 6)))
        assert merge_units(bpe.apply(line)) == line


def test_more_merges_give_fewer_units():
    small, large = learn_bpe(DE + EN, 5), learn_bpe(DE + EN, 80)
    assert len(small) == 5
    line = "die kleinen hunde schlafen unter dem tisch"
    assert len(large.apply(line)) < len(small.apply(line)) <= len(line.replace(" ", ""))


def test_learning_is_deterministic_within_and_across_processes(bpe):
    assert learn_bpe(DE + EN, 40).merges == bpe.merges
    code = ("import json, sys; from teachkit.data.bpe import learn_bpe; "
            "print(learn_bpe(json.load(sys.stdin), 40).digest)")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(DE + EN), capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "123", "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip() == bpe.digest


def test_json_round_trip_and_bad_files(bpe):
    again = JointBPE.from_json(bpe.to_json())
    assert again.merges == bpe.merges and again.end == bpe.end and again.digest == bpe.digest
    line = "die kleinen katzen laufen"
    assert again.apply(line) == bpe.apply(line)
    for text in ("{}", "[1, 2]", "nope", '{"format": "teachkit-bpe", "end_of_word": "", "marker": "@@", "merges": []}',
                 '{"format": "teachkit-bpe", "end_of_word": "x", "marker": "@@", "merges": [["a"]]}'):
        with pytest.raises(DataError, match="bpe.json is not a teachkit BPE file") as e:
            JointBPE.from_json(text, "bpe.json")
        assert "\n" not in str(e.value)


def test_training_text_holding_the_end_symbol_gets_another_one():
    learned = learn_bpe([f"a{END}b a{END}b c"] * 3, 10)
    assert learned.end != END
    assert merge_units(learned.apply(f"a{END}b c")) == f"a{END}b c"


def test_bad_size_is_a_config_error():
    for size in (0, -3, True, 2.5):
        with pytest.raises(ConfigError, match="BPE size"):
            learn_bpe(DE, size)


def test_is_bpe_marked():
    assert is_bpe_marked(["the lo@@ w@@ er case", "plain"])
    assert not is_bpe_marked(["the lower case", "e-mail @-@ address", "ends with@@"])
    assert not is_bpe_marked([])
