"""The causal-LM file sources (teachkit.data.lm_sources): lm_text's blocks (by hand, never across documents,
carving by document), prompt_response's response-only targets (prompt/response records, chat messages with a
template and without), truncation and refusal, the teacher tokenisation, every bad input as one line naming the
file and line, and the tokenisation cache actually hit on a second load."""

from __future__ import annotations

import json
import random

import pytest
import torch

from teachkit.data import lm_sources as src
from teachkit.data import lm_tokenizers as lmt
from teachkit.data import load_raw, load_splits
from teachkit.errors import ConfigError, DataError

WORDS = "the cat sat on a mat dog ran far away big small red blue".split()


def write(path, lines, end="\n"):
    path.write_text("".join(f"{line}{end}" for line in lines), encoding="utf-8")
    return path


def jsonl(path, records):
    return write(path, [json.dumps(r, ensure_ascii=False) for r in records])


def docs(n, seed=0, longest=40):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(1, longest))) for _ in range(n)]


def load(name, root, tmp_path, **options):
    return load_raw(name, str(root), {"cache_dir": str(tmp_path / "cache"), **options})


def rows_of(x):
    return [x.ids[i, :x.lengths[i]].tolist() for i in range(x.num_rows)]


def three_files(tmp_path, train, valid, test, suffix=".jsonl"):
    """train/valid/test files with these records (prompt_response) or lines (lm_text, suffix .txt)."""
    out = {}
    for part, content in (("train", train), ("valid", valid), ("test", test)):
        path = tmp_path / f"{part}{suffix}"
        jsonl(path, content) if suffix == ".jsonl" else write(path, content)
        out[part] = path.name
    return out


# -- lm_text ----------------------------------------------------------------------------------------------------------
def test_blocks_by_hand(tmp_path):
    files = three_files(tmp_path, ["abcdefg", "xy"], ["ab"], ["cd"], suffix=".txt")
    raw = load("lm_text", tmp_path, tmp_path, tokenizer="char", max_length=4, **files)
    x = raw.train_x
    a, b, c, d, e, f, g, xx, y = range(4, 13)  # the characters of train in sorted order, after the specials
    # [BOS a b c d e f g EOS] in blocks of 4, each continuation starting with the block before's last token
    assert rows_of(x) == [[1, a, b, c], [c, d, e, f], [f, g, 2], [1, xx, y, 2]]
    assert x.starts.tolist() == [1, 1, 1, 1] and x.row_ids.tolist() == [0, 0, 0, 1]
    assert x.token_targets().tolist() == [a, b, c, d, e, f, g, 2, xx, y, 2]  # every token after BOS once
    assert rows_of(raw.val_x) == [[1, a, b, 2]] and raw.test_x.row_ids.tolist() == [3]
    assert x.info.references == ("abcdefg", "xy", "ab", "cd") and x.info.kind == "text"
    assert x.info.notes["documents"] == {"train": 2, "val": 1, "test": 1} and x.info.notes["rows"]["train"] == 4
    assert raw.num_classes == len(x.info.tokenizer) == 13 and raw.task == "causal_lm"


def test_blocks_never_span_documents(tmp_path):
    write(tmp_path / "all.txt", docs(40))
    raw = load("lm_text", tmp_path / "all.txt", tmp_path, vocab_size=300, max_length=8)
    tok = raw.train_x.info.tokenizer
    for x in (raw.train_x, raw.val_x, raw.test_x):
        assert int(x.lengths.max()) <= 8 and bool((x.starts == 1).all())
        for doc in x.row_ids.unique().tolist():
            text = x.info.references[doc]
            full = [1, *tok(text, add_special_tokens=False)["input_ids"], 2]
            blocks = x.rows((x.row_ids == doc).nonzero().flatten())
            assert int(blocks.ids[0, 0]) == 1 and blocks.token_targets().tolist() == full[1:]
            for row in rows_of(blocks):
                assert tok.decode(row, skip_special_tokens=True) in text


def test_documents_are_carved_whole_and_seeded(tmp_path):
    texts = docs(30)
    write(tmp_path / "all.txt", texts)

    def split_texts(raw):
        return [sorted(x.info.references[i] for i in x.row_ids.unique().tolist())
                for x in (raw.train_x, raw.val_x, raw.test_x)]

    raw = load("lm_text", tmp_path / "all.txt", tmp_path, tokenizer="char", max_length=10)
    notes = raw.train_x.info.notes
    assert notes["documents"] == {"train": 24, "val": 3, "test": 3} and "carved" in notes["val"]
    ids = [set(x.row_ids.tolist()) for x in (raw.train_x, raw.val_x, raw.test_x)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])  # a document in one split
    parts = split_texts(raw)
    assert sorted(parts[0] + parts[1] + parts[2]) == sorted(texts)
    again = load("lm_text", tmp_path / "all.txt", tmp_path, tokenizer="char", max_length=10)
    assert torch.equal(again.test_x.ids, raw.test_x.ids)
    other = load("lm_text", tmp_path / "all.txt", tmp_path, tokenizer="char", max_length=10, split_seed=1)
    assert split_texts(other)[2] != parts[2]
    limited = load("lm_text", tmp_path / "all.txt", tmp_path, tokenizer="char", max_length=10, limit=5)
    assert limited.train_x.info.notes["documents"]["train"] == 5
    assert split_texts(limited)[1:] == parts[1:]  # val and test do not depend on limit
    assert split_texts(limited)[0] == sorted([t for t in texts if t in parts[0]][:5])  # the first five, in order


def test_jsonl_documents_and_empty_lines(tmp_path):
    jsonl(tmp_path / "t.jsonl", [{"body": "ab"}, {"body": ""}, {"body": "ba", "x": 1}, {"body": "abab"}])
    files = {"train": "t.jsonl", "valid": "v.txt", "test": "s.txt"}
    write(tmp_path / "v.txt", ["ab", "", "  ", "b"])
    write(tmp_path / "s.txt", ["a"])
    raw = load("lm_text", tmp_path, tmp_path, tokenizer="char", text_field="body", **files)
    assert raw.train_x.info.references[:3] == ("ab", "ba", "abab")
    assert raw.train_x.info.notes["skipped_empty"] == {"train": 1, "val": 2, "test": 0}
    assert raw.warnings == ["dataset 'lm_text': 3 empty documents skipped (option empty='skip'): train 1, val 2"]
    with pytest.raises(DataError) as e:
        load("lm_text", tmp_path, tmp_path, tokenizer="char", text_field="body", empty="reject", **files)
    assert "t.jsonl' line 2 field 'body' is empty (option empty='reject'" in str(e.value)


def test_lm_text_with_a_teacher_tokenisation(tmp_path):
    files = three_files(tmp_path, ["héllo", "ab"], ["ab"], ["ba"], suffix=".txt")
    raw = load("lm_text", tmp_path, tmp_path, tokenizer="char", teacher_tokenizer="byte", max_length=8, **files)
    x = raw.train_x
    assert rows_of(x)[0] == [1, *x.info.tokenizer("héllo", add_special_tokens=False)["input_ids"], 2]
    assert x.t_ids[0, :x.t_lengths[0]].tolist() == [1, *(b + 4 for b in "héllo".encode()), 2]
    assert x.t_starts.tolist() == [1, 1] and x.info.tokenizers["teacher."]["name"] == "byte"
    with pytest.raises(DataError) as e:  # "héllo" is 8 tokens with the teacher's bytes: more than one block
        load("lm_text", tmp_path, tmp_path, tokenizer="char", teacher_tokenizer="byte", max_length=7, **files)
    assert "train.txt' line 1 is 8 tokens long with the teacher's tokenizer" in str(e.value)


# -- prompt_response --------------------------------------------------------------------------------------------------
def test_targets_are_the_response_and_eos(tmp_path):
    files = three_files(tmp_path, [{"prompt": "ab", "response": "cd"}, {"prompt": "", "response": "abcd"}],
                        [{"prompt": "a", "response": "b"}], [{"prompt": "b", "response": "a"}])
    raw = load("prompt_response", tmp_path, tmp_path, tokenizer="char", **files)
    x = raw.train_x
    a, b, c, d = 4, 5, 6, 7
    assert rows_of(x) == [[1, a, b, c, d, 2], [1, a, b, c, d, 2]] and x.starts.tolist() == [3, 1]
    assert x.token_targets().tolist() == [c, d, 2, a, b, c, d, 2]
    assert x.info.references == ("cd", "abcd", "b", "a") and x.info.kind == "prompt_response"
    assert x.info.max_new_tokens == 4 + 8  # the longest response in tokens + 8
    assert load("prompt_response", tmp_path, tmp_path, tokenizer="char", max_new_tokens=3,
                **files).train_x.info.max_new_tokens == 3
    prompts, lengths = x.prompts()
    assert prompts.tolist() == [[1, a, b], [1, 0, 0]] and lengths.tolist() == [3, 1]


def test_messages_without_a_template_use_the_plain_format(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}]
    files = three_files(tmp_path, [{"messages": chat}], [{"prompt": "hi", "response": "yo"}],
                        [{"prompt": "hi", "response": "yo"}])
    x = load("prompt_response", tmp_path, tmp_path, tokenizer="char", **files).train_x
    tok = x.info.tokenizer
    assert tok.decode(x.ids[0, 1:x.starts[0]]) == "system: be brief\nuser: hi\nassistant: " == \
        src.fallback_prompt(chat[:2])
    assert x.info.text(x.token_targets()) == "yo" and x.info.references[0] == "yo"


def chat_tokenizer(folder, template):
    tok = lmt.char_tokenizer(["[]abcdefghijklmnopqrstuvwxyz :\n"])
    tok.chat_template = template
    tok.save_pretrained(str(folder))
    return str(folder)


def test_messages_with_the_tokenizers_chat_template(tmp_path):
    template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    folder = chat_tokenizer(tmp_path / "tok", template)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    files = three_files(tmp_path, [{"messages": chat}, {"prompt": "ab", "response": "c"}],
                        [{"messages": chat}], [{"messages": chat}])
    x = load("prompt_response", tmp_path, tmp_path, tokenizer=folder, **files).train_x
    assert x.info.tokenizer.decode(x.ids[0, :x.starts[0]], skip_special_tokens=True) == "[user]hi[assistant]"
    assert int(x.ids[0, 0]) == 1 and x.info.text(x.token_targets()[:3]) == "yo"
    assert x.info.tokenizer.decode(x.ids[1, 1:x.starts[1]]) == "ab"  # a prompt/response record: as it is
    assert x.artifacts == {} and x.info.tokenizers[""]["name"] == folder  # a pretrained tokenizer: not copied
    bad = chat_tokenizer(tmp_path / "bad", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(DataError) as e:
        load("prompt_response", tmp_path, tmp_path, tokenizer=bad, **files)
    assert "train.jsonl' line 1: the chat template of tokenizer" in str(e.value)
    assert "roles must alternate" in str(e.value) and "\n" not in str(e.value)


def test_too_long_rows_are_cut_in_the_response_or_refused(tmp_path):
    long = {"prompt": "ab", "response": "cdcdcdcd"}  # 1 + 2 + 8 + 1 = 12 tokens
    files = three_files(tmp_path, [long, {"prompt": "a", "response": "b"}], [long], [{"prompt": "a",
                                                                                      "response": "c"}])
    raw = load("prompt_response", tmp_path, tmp_path, tokenizer="char", max_length=8, **files)
    x = raw.train_x
    assert rows_of(x)[0] == [1, 4, 5, 6, 7, 6, 7, 6] and x.starts[0] == 3  # no EOS: never taught to stop there
    assert x.info.notes["truncated"] == {"train": 1, "val": 1, "test": 0}
    assert raw.warnings == ["dataset 'prompt_response': 2 rows longer than max_length=8 tokens cut in their response "
                            "(option too_long='truncate'): train 1, val 1"]
    with pytest.raises(DataError) as e:
        load("prompt_response", tmp_path, tmp_path, tokenizer="char", max_length=8, too_long="reject", **files)
    assert "train.jsonl' line 1 is 12 tokens long (prompt, response and EOS), more than max_length=8" in str(e.value)
    with pytest.raises(DataError) as e:
        load("prompt_response", tmp_path, tmp_path, tokenizer="char", max_length=3, **files)
    assert "train.jsonl' line 1: the prompt alone is 3 tokens" in str(e.value)


def test_prompt_response_with_a_teacher_tokenisation(tmp_path):
    files = three_files(tmp_path, [{"prompt": "ab", "response": "ééééé"}, {"prompt": "a", "response": "bé"}],
                        [{"prompt": "a", "response": "b"}], [{"prompt": "b", "response": "a"}])
    raw = load("prompt_response", tmp_path, tmp_path, tokenizer="char", teacher_tokenizer="byte", max_length=8,
               **files)
    x, teacher = raw.train_x, raw.train_x.info.teacher_tokenizer
    assert x.t_starts.tolist() == [3, 2] and x.starts.tolist() == [3, 2]
    # the teacher's bytes bind: both rows keep the same two characters of the cut response, without EOS
    assert x.info.tokenizer.decode(x.ids[0, 3:x.lengths[0]]) == "éé" == teacher.decode(x.t_ids[0, 3:x.t_lengths[0]])
    assert x.t_lengths.tolist() == [7, 6] and teacher.decode(x.t_ids[1, 2:6], skip_special_tokens=True) == "bé"
    assert x.info.notes["truncated"]["train"] == 1 and x.info.teacher_pad_id == 0
    x.validate()


# -- bad input: one line naming the file and line -------------------------------------------------------------------
RECORD = json.dumps({"prompt": "a", "response": "b"})
BAD_FILES = [
    ("prompt_response", {"train.jsonl": ""}, "train.jsonl' holds no records"),
    ("prompt_response", {"train.jsonl": f"{RECORD}\n{{bad\n"}, "train.jsonl' line 2 is not JSON"),
    ("prompt_response", {"train.jsonl": '{"response": "b"}\n'}, "train.jsonl' line 1 has no key 'prompt'"),
    ("prompt_response", {"train.jsonl": '{"prompt": 3, "response": "b"}\n'},
     "train.jsonl' line 1 field 'prompt' is a JSON int, not a string"),
    ("prompt_response", {"train.jsonl": "[1, 2]\n"}, "train.jsonl' line 1 is a JSON list, not an object"),
    ("prompt_response", {"train.jsonl": b'{"prompt": "a", "response": "b"}\n{"prompt": "\xff"}\n'},
     "train.jsonl' line 2 is not UTF-8 text"),
    ("prompt_response", {"train.jsonl": json.dumps({"messages": [{"role": "user", "content": "a"},
                                                                 {"role": "user", "content": "b"}]}) + "\n"},
     "train.jsonl' line 1: the last message must be the assistant's"),
    ("prompt_response", {"train.jsonl": json.dumps({"messages": "hi"}) + "\n"},
     "train.jsonl' line 1 field 'messages' must be a list"),
    ("prompt_response", {"train.txt": "a\n"}, "train.txt' of option 'train' is not a file this source reads"),
    ("lm_text", {"train.jsonl": '{"body": "x"}\n'}, "train.jsonl' line 1 has no key 'text'"),
    ("lm_text", {"train.txt": "\n \n"}, "train.txt' holds no documents"),
    ("lm_text", {"train.txt": b"ok\nok\n\xc3(\n"}, "train.txt' line 3 is not UTF-8 text"),
    ("lm_text", {"train.csv": "a\n"}, "train.csv' of option 'train' is not a file this source reads"),
]


@pytest.mark.parametrize("name,files,message", BAD_FILES)
def test_bad_files_are_one_line_naming_file_and_line(tmp_path, name, files, message):
    for fname, content in files.items():
        path = tmp_path / fname
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
    train = next(iter(files))
    with pytest.raises(DataError) as e:
        load(name, tmp_path, tmp_path, train=train, tokenizer="char")
    assert message in str(e.value) and "\n" not in str(e.value)


BAD_OPTIONS = [
    ({"tokenizer": 5}, ConfigError, "option 'tokenizer' must be one of char, byte, bpe"),
    ({"teacher_tokenizer": ""}, ConfigError, "option 'teacher_tokenizer' must be one of char, byte, bpe"),
    ({"tokenizer": "bpe", "vocab_size": 100}, ConfigError, "'vocab_size' must be >= 260 for tokenizer='bpe'"),
    ({"max_length": 1}, ConfigError, "option 'max_length' must be an integer >= 2, got 1"),
    ({"max_tokens": "many"}, ConfigError, "option 'max_tokens' must be an integer >= 2"),
    ({"limit": 0}, ConfigError, "option 'limit' must be an integer >= 1"),
    ({"split_seed": -1}, ConfigError, "option 'split_seed' must be an integer >= 0"),
    ({"too_long": "cut"}, ConfigError, "option 'too_long' is 'cut'; choose one of: truncate, reject"),
    ({"max_new_tokens": 0}, ConfigError, "option 'max_new_tokens' must be an integer >= 1"),
    ({"train": "nope.jsonl"}, DataError, "file 'nope.jsonl' of option 'train' not found"),
    ({"valid": "nope.jsonl"}, DataError, "file 'nope.jsonl' of option 'valid' not found"),
    ({"tokenizer": "no/such/folder"}, ConfigError, "tokenizer 'no/such/folder' not found offline"),
    ({"empty": "skip"}, ConfigError, "unknown option 'empty' for dataset 'prompt_response'"),
]


@pytest.mark.parametrize("options,error,message", BAD_OPTIONS)
def test_bad_options_are_one_line(tmp_path, options, error, message):
    jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "response": "b"}] * 5)
    with pytest.raises(error) as e:
        load("prompt_response", tmp_path, tmp_path, **{"train": "train.jsonl", "tokenizer": "char", **options})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lm_text_option_errors(tmp_path):
    write(tmp_path / "t.txt", ["ab"] * 5)
    with pytest.raises(ConfigError, match="option 'empty' is 'maybe'; choose one of: skip, reject"):
        load("lm_text", tmp_path / "t.txt", tmp_path, empty="maybe")
    with pytest.raises(ConfigError, match="needs option 'train'"):
        load("lm_text", tmp_path, tmp_path)  # data.root is a folder and no train file is named
    write(tmp_path / "two.txt", ["ab", "ba"])
    with pytest.raises(DataError, match=r"2 training documents are too few to carve a test split and val split \(at"):
        load("lm_text", tmp_path / "two.txt", tmp_path, tokenizer="char")


# -- the cache ------------------------------------------------------------------------------------------------------
def test_a_second_load_reads_the_cache(tmp_path, monkeypatch):
    calls = {"encode": 0, "bpe": 0}
    encode, bpe = src.encode_text, lmt.bpe_tokenizer

    def counting_encode(*args, **kwargs):
        calls["encode"] += 1
        return encode(*args, **kwargs)

    def counting_bpe(*args, **kwargs):
        calls["bpe"] += 1
        return bpe(*args, **kwargs)

    monkeypatch.setattr(src, "encode_text", counting_encode)
    monkeypatch.setattr(lmt, "bpe_tokenizer", counting_bpe)
    write(tmp_path / "all.txt", docs(20))
    first = load("lm_text", tmp_path / "all.txt", tmp_path, vocab_size=300, max_length=16)
    assert calls["encode"] > 0 and calls["bpe"] == 1
    calls.update(encode=0, bpe=0)
    second = load("lm_text", tmp_path / "all.txt", tmp_path, vocab_size=300, max_length=16)
    assert calls == {"encode": 0, "bpe": 0}  # neither tokenised nor learned again
    for a, b in zip(first.parts(), second.parts(), strict=True):
        assert torch.equal(a[1].ids, b[1].ids) and torch.equal(a[1].row_ids, b[1].row_ids)
    assert second.train_x.info.tokenizers == first.train_x.info.tokenizers
    assert second.train_x.info.references == first.train_x.info.references
    assert second.train_x.artifacts == first.train_x.artifacts and "tokenizer.json" in second.train_x.artifacts
    load("lm_text", tmp_path / "all.txt", tmp_path, vocab_size=300, max_length=12)  # another option: rebuilt
    assert calls["encode"] > 0
    calls.update(encode=0)
    write(tmp_path / "all.txt", docs(20, seed=1))  # other contents: rebuilt
    load("lm_text", tmp_path / "all.txt", tmp_path, vocab_size=300, max_length=16)
    assert calls["encode"] > 0


# -- as splits --------------------------------------------------------------------------------------------------------
def test_load_splits_keeps_the_sources_splits(tmp_path):
    write(tmp_path / "all.txt", docs(30))
    jsonl(tmp_path / "pr.jsonl", [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(30)])
    for name, root in (("lm_text", tmp_path / "all.txt"), ("prompt_response", tmp_path / "pr.jsonl")):
        options = {"tokenizer": "char", "max_length": 16, "cache_dir": str(tmp_path / "cache")}
        raw = load_raw(name, str(root), options)
        s = load_splits(name, root=str(root), options=options, train_subset=10)
        assert s.task == "causal_lm" and s.num_classes == raw.num_classes and s.mean is None
        assert torch.equal(s.test.x.ids, raw.test_x.ids) and torch.equal(s.val.x.row_ids, raw.val_x.row_ids)
        assert len(s.train) == 10 and s.train.x.num_rows == 10
        batch = next(iter(s.train.x.batch_source(4, True, 0).batches(0)))
        assert torch.equal(batch.y, batch.x.token_targets())
