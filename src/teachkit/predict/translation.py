"""The translation predictor: source sentences -> the run's units and vocabulary -> decoded, detokenised text.

It fits checkpoints of task ``translation`` (``toy_translation``, ``parallel_text``, ``iwslt14``). A sentence goes
through what the run's data went through: whitespace normalisation (and lower-casing when the run set
``lowercase``), the run's joint BPE (``bpe.json``) or word units, the run's vocabulary (``vocab.json``; unknown
units become ``<unk>``), EOS, and ``max_length``. Both files are read from the run folder (or an export folder,
:meth:`TranslationPredictor.export_files`), and the vocabulary's sha256 must be the one the checkpoint records.
Corpora whose files already carried BPE (``@@`` markers, ``bpe: given``) take inputs segmented the same way.

:meth:`TranslationPredictor.translate` decodes with the run's evaluator settings (greedy unless the run set
``decode: beam``) or the ``beam`` / ``max_len`` given, through :func:`teachkit.models.decoding.translate_split`,
and returns the text the BLEU evaluator scores: BPE merged, then Moses-detokenised in the target language.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.bpe import JointBPE
from teachkit.data.parallel import TRANSLATION, DecodeOptions, ParallelText, TranslationInfo, Vocab
from teachkit.data.raw import SEQUENCE_TASKS
from teachkit.data.translation_files import id_array, normalise, read_lines
from teachkit.errors import CheckpointError, ConfigError, DataError
from teachkit.models.decoding import translate_split
from teachkit.models.taps import unwrap
from teachkit.predict.base import Predictor, recorded_task, register_predictor
from teachkit.predict.text import data_options
from teachkit.tasks.translation import Detokenizer

#: the files a translation run keeps in its folder and an export copies
VOCAB_FILE, BPE_FILE = "vocab.json", "bpe.json"


def decode_options(options: dict[str, Any]) -> DecodeOptions:
    """The evaluator's decoding settings a run's data options give (``decode``, ``beam``, ...)."""
    return DecodeOptions(strategy=options.get("decode", "greedy"), beam=options.get("beam", 5),
                         length_penalty=float(options.get("length_penalty", 1.0)),
                         max_len_a=options.get("max_len_a", 1.2), max_len_b=options.get("max_len_b", 10))


@register_predictor
class TranslationPredictor(Predictor):
    """Sentences in, translations out (module docstring); ``predict`` is ``translate``."""

    row_label = "line"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        task = recorded_task(state)
        return task == TRANSLATION or (isinstance(state.get("vocabulary"), str) and task not in SEQUENCE_TASKS)

    def __init__(self, model: torch.nn.Module, state: dict[str, Any], source: Path,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(model, state, source, device)
        self.task, self.class_names = TRANSLATION, None
        self.options = data_options(state)
        self.folder = self._files_folder()
        self.vocab, self.bpe = self._read_files(self.folder)
        self.lowercase = bool(self.options.get("lowercase", False))
        self.max_length = int(self.options.get("max_length") or 1024)  # toy_translation keeps every unit
        self.tgt_lang = str(self.options.get("tgt_lang") or "en")
        self.decode = decode_options(self.options)
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        self.batch_size = int(data.get("eval_batch_size") or 64)
        self._detokenizer: Detokenizer | None = None

    def _files_folder(self) -> Path:
        """The folder holding ``vocab.json``: the run or export folder, or the run folder of a checkpoint file."""
        base = self.source if self.source.is_dir() else self.source.parent
        for folder in (base, base.parent):
            if (folder / VOCAB_FILE).is_file():
                return folder
        raise CheckpointError(f"no {VOCAB_FILE} beside {str(self.source)!r}: a translation model needs the vocabulary "
                              "its run wrote (the run folder, or an export folder made by teachkit export)")

    def _read_files(self, folder: Path) -> tuple[Vocab, JointBPE | None]:
        """The vocabulary (checked against the checkpoint's sha256) and the BPE merges when the run learned them."""
        path = folder / VOCAB_FILE
        vocab = Vocab.from_json(path.read_text(encoding="utf-8"), where=f"vocabulary {str(path)!r}")
        recorded = self.state.get("vocabulary")
        if isinstance(recorded, str) and vocab.digest != recorded:
            raise CheckpointError(f"{str(path)!r} is not the vocabulary the model was trained with (sha256 "
                                  f"{vocab.digest[:12]}, the checkpoint records {recorded[:12]})")
        bpe_path = folder / BPE_FILE
        bpe = JointBPE.from_json(bpe_path.read_text(encoding="utf-8"), where=f"BPE file {str(bpe_path)!r}") \
            if bpe_path.is_file() else None
        return vocab, bpe

    # -- inputs ------------------------------------------------------------------------------------------------
    def sentences(self, inputs: Any) -> list[str]:
        """``inputs`` (a sentence, a list of them, or a file given as a ``Path``) as a list of sentences."""
        if isinstance(inputs, Path):
            inputs = self.read_inputs(inputs)[0]
        items = [inputs] if isinstance(inputs, str) else list(inputs)
        for i, s in enumerate(items):
            if not isinstance(s, str) or not s.strip():
                raise DataError(f"input {i + 1} is {s!r}: a translation model needs a non-empty sentence per input")
        return items

    def units(self, sentence: str) -> list[str]:
        """The units of one sentence as the run made them (normalised, BPE-segmented or whitespace-split)."""
        line = normalise(sentence, self.lowercase)
        return self.bpe.apply(line) if self.bpe is not None else line.split()

    def preprocess(self, inputs: Any) -> torch.Tensor:
        """Source ids (N, S) int64, each row ending with EOS and padded with PAD; at most ``max_length`` ids."""
        ids, _ = id_array([self.units(s) for s in self.sentences(inputs)], self.vocab, self.max_length)
        return torch.from_numpy(ids.astype(np.int64))

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """A text file, one source sentence per line (blank lines skipped); the sentences and their line numbers."""
        if not path.is_file():
            raise DataError(f"input {str(path)!r} is not a file (expected one source sentence per line)")
        numbered = [(n, line) for n, line in enumerate(read_lines(path, "translation input"), 1) if line.strip()]
        return [line for _, line in numbered], [str(n) for n, _ in numbered]

    # -- outputs -----------------------------------------------------------------------------------------------
    def options_for(self, beam: int | None, max_len: int | None) -> DecodeOptions:
        """The run's decoding settings, with ``beam`` (1: greedy) and ``max_len`` (tokens per sentence) when given."""
        options = self.decode
        if beam is not None:
            if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
                raise ConfigError(f"beam must be an integer >= 1 (1: greedy search), got {beam!r}")
            options = DecodeOptions("greedy" if beam == 1 else "beam", beam, options.length_penalty, options.max_len_a,
                                    options.max_len_b)
        if max_len is not None:
            if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
                raise ConfigError(f"max_len must be an integer >= 1 (target tokens per sentence), got {max_len!r}")
            options = DecodeOptions(options.strategy, options.beam, options.length_penalty, 0.0, max_len)
        return options

    def translate(self, sentences: Any, beam: int | None = None, max_len: int | None = None) -> list[str]:
        """Translations of ``sentences``, detokenised as the BLEU evaluator scores them (module docstring)."""
        src = self.preprocess(sentences)
        info = TranslationInfo(vocab=self.vocab, tgt_lang=self.tgt_lang)
        x = ParallelText(src, src, torch.arange(len(src)), info)  # the targets are unused by decoding
        ids = translate_split(unwrap(self.model), x, self.options_for(beam, max_len), self.batch_size)
        if self._detokenizer is None:
            self._detokenizer = Detokenizer(self.tgt_lang)
        return [self._detokenizer(info.text(row)) for row in ids]

    def predict(self, inputs: Any, batch_size: int = 256) -> list[Any]:
        """``translate(inputs)`` with the run's decoding settings."""
        return self.translate(inputs)

    def scores(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        raise CheckpointError("a translation model outputs sentences, not scores: use translate (or predict)")

    def predict_proba(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        raise CheckpointError("a translation model outputs sentences, not class probabilities: use translate")

    @property
    def labels(self) -> list[str] | None:
        return None

    def export_files(self, folder: Path) -> dict[str, Any] | None:
        """Copy ``vocab.json`` (and ``bpe.json``) into the export ``folder``, where this predictor finds them."""
        for name in (VOCAB_FILE, BPE_FILE):
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, Path(folder) / name)
        return None
