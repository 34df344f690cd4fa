"""No silent leakage: a teacher whose training data may overlap the student's validation or test split.

A teacher checkpoint records the ``data`` section it was trained with (:func:`~teachkit.recipes.common.model_meta`).
The student's val and test splits are carved from the dataset (``name``, ``root``, ``options``) by
``val_fraction`` and ``split_seed`` (:mod:`teachkit.data.splits`), so a teacher trained with any of these
different may have trained on the student's val/test images (a teacher with another ``split_seed`` had
seen 721 of a student's 1,000 test images and 368 of its 500 validation images).
``train_subset``, ``subset_seed``, ``omit_classes`` and ``few_shot`` only shrink the training pool after val
and test are carved, and batching/augmentation and a text or translation source's tokenisation options
(tokenizer, lengths, stride; vocabulary, BPE, decoding) move nothing, so those may differ; every other data setting
(including ones added later) must match. A teacher that was itself distilled from an overlapping teacher
(its checkpoint records ``teacher_overlap_allowed``) passes the overlap on.

Such a teacher is refused with one line naming the differing setting; ``teacher.allow_overlap=true`` runs
anyway, and the run records ``teacher_overlap_allowed: <reason>`` in its checkpoints and summary.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from teachkit.config import to_dict
from teachkit.data import DataConfig
from teachkit.errors import ConfigError

#: data settings that only shrink the training pool (after val/test are carved) or batch/augment it
POOL_ONLY = frozenset({"train_subset", "subset_seed", "omit_classes", "few_shot", "augment", "augment_options",
                       "batch_size", "eval_batch_size", "group_by_length"})
OVERLAP_KEY = "teacher_overlap_allowed"


#: text and translation source options that change how examples are tokenised, batched or decoded, never which
#: examples are in val/test (those are carved from the examples themselves: by label, by question id, by line)
TOKENISATION_OPTIONS = frozenset({"tokenizer", "teacher_tokenizer", "max_length", "doc_stride", "max_query_length",
                                  "cache_dir", "n_best", "max_answer_length", "null_threshold",
                                  # translation: vocabulary, BPE, length handling, batching and decoding
                                  "vocab_file", "bpe", "bpe_size", "min_freq", "lowercase", "too_long", "empty_lines",
                                  "max_tokens", "decode", "beam", "length_penalty", "max_len_a", "max_len_b"})


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "root" and isinstance(a, str) and isinstance(b, str):
        return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))
    if key == "options" and isinstance(a, Mapping) and isinstance(b, Mapping):
        return ({k: v for k, v in a.items() if k not in TOKENISATION_OPTIONS}
                == {k: v for k, v in b.items() if k not in TOKENISATION_OPTIONS})
    return a == b


def split_differences(teacher_data: Mapping[str, Any], student: DataConfig) -> list[str]:
    """The data settings that move val/test and differ, as ``data.KEY=<teacher> (this run: <student>)``."""
    defaults, mine = to_dict(DataConfig()), to_dict(student)
    keys = [k for k in dict.fromkeys([*mine, *teacher_data]) if k not in POOL_ONLY]
    out = []
    for key in keys:
        theirs = teacher_data.get(key, defaults.get(key))
        if not _same(key, theirs, mine.get(key)):
            out.append(f"data.{key}={theirs!r} (this run: {mine.get(key)!r})")
    return out


def overlap_reason(teacher_state: Mapping[str, Any], student: DataConfig, where: str) -> str | None:
    """Why the teacher in ``where`` may have trained on the student's val/test data; None when it cannot."""
    inherited = teacher_state.get(OVERLAP_KEY)
    data = teacher_state.get("data")
    if not isinstance(data, Mapping):
        return f"teacher {where} records no data settings, so it may have trained on this run's val/test data"
    diffs = split_differences(data, student)
    if diffs:
        return (f"teacher {where} was trained with {', '.join(diffs)}, so its training data may include this "
                f"run's val/test images")
    if inherited:
        return f"teacher {where} was distilled from an overlapping teacher ({inherited})"
    return None


def check_overlap(teacher_state: Mapping[str, Any], student: DataConfig, allow: bool, where: str) -> str | None:
    """Refuse (one-line ConfigError) a teacher that may have seen the student's val/test data unless
    ``allow`` (``teacher.allow_overlap``); returns the reason when allowed, None when there is no overlap."""
    reason = overlap_reason(teacher_state, student, where)
    if reason is not None and not allow:
        raise ConfigError(f"{reason}; use a teacher trained on this run's data split, or set "
                          f"teacher.allow_overlap=true to run anyway")
    return reason


__all__ = ["OVERLAP_KEY", "POOL_ONLY", "check_overlap", "overlap_reason", "split_differences"]
