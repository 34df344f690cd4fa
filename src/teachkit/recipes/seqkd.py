"""Sequence-level knowledge distillation for translation (Kim & Rush 2016, "Sequence-Level Knowledge
Distillation", Sec. 3.2 and 3.3).

``teachkit run seqkd CONFIG``: the frozen teacher (``teacher.checkpoint``, or trained first in
``teacher/``) translates every source sentence of the student's training split with beam search, and the
student is trained with the usual label objective (``train.loss``, CE) on those translations instead of the
references -- the training set re-labelled by the teacher. ``seqkd.mode``:

- ``seq`` (Seq-KD): the teacher's best beam hypothesis;
- ``inter`` (Seq-Inter): of the teacher's ``beam`` final hypotheses, the one closest to the reference by
  sentence BLEU (sacreBLEU's ``sentence_bleu`` on tokenised text, exponential smoothing), Kim & Rush's
  interpolation between the teacher's mode and the gold target.

Validation and test keep their references: selection and the reported BLEU measure the student against the
real translations. Word-level KD (Kim & Rush Sec. 3.1) is ``teachkit distill`` with ``kd.method=kd``: the
per-token KL of the ``kd`` loss on the packed target positions.

The teacher's translations are cached once per (teacher weights, training inputs, decoding settings) in
``out_dir/_cache/seqkd/<key>.safetensors`` (atomic, content-verified, never trusted when its key differs), so
every student -- another seed, model or resumed run -- reads them instead of decoding again. A kill during
decoding loses the decoding (it restarts); the student's training resumes exactly from its last checkpoint.
The summary's ``seqkd`` block records the decoding, the number of sentences and tokens, the teacher's
tokenised BLEU against the training references, and whether the translations were computed or loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from teachkit.config import RunConfig
from teachkit.data import Splits
from teachkit.data.base import TensorSplit
from teachkit.data.parallel import EOS, PAD, TRANSLATION, ParallelText
from teachkit.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, write_json
from teachkit.errors import ConfigError, WriteError
from teachkit.models.decoding import beam_search, greedy
from teachkit.models.taps import unwrap
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult, folder_wall_time
from teachkit.recipes.context import RunContext
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import label_step
from teachkit.recipes.teacher import TEACHER_DIR, TeacherSource, declare_teacher_use
from teachkit.recipes.teacher_cache import inputs_digest, weights_digest

FOLDER = Path("_cache") / "seqkd"


@dataclass
class SeqKDOptions(Options):
    """Sequence-level KD (Kim & Rush 2016): the ``seqkd`` section. The teacher decodes the training sources
    with beam search (``beam``, ``length_penalty``; at most ``max_len_a`` x source length + ``max_len_b``
    tokens; ``beam=1`` is greedy) in batches of ``batch_size`` sentences; ``mode`` ``seq`` keeps its best
    hypothesis, ``inter`` the beam hypothesis closest to the reference (sentence BLEU)."""

    mode: Literal["seq", "inter"] = "seq"
    beam: int = option(5, ge=1)
    length_penalty: float = 1.0
    max_len_a: float = option(1.2, ge=0.0)
    max_len_b: int = option(10, ge=1)
    batch_size: int = option(64, ge=1)

    def validate(self) -> None:
        if self.mode == "inter" and self.beam < 2:
            raise ConfigError(f"{self.key('mode')}=inter picks among the teacher's beam hypotheses; it needs "
                              f"{self.key('beam')} >= 2, got {self.beam}")


def sentence_similarity(hypothesis: str, reference: str) -> float:
    """Sentence BLEU of a tokenised hypothesis against its reference (sacreBLEU, exponential smoothing)."""
    import sacrebleu

    return float(sacrebleu.sentence_bleu(hypothesis, [reference], tokenize="none", lowercase=True).score)


@torch.no_grad()
def teacher_translations(model: nn.Module, x: ParallelText, opts: SeqKDOptions) -> list[list[int]]:
    """The teacher's translation of every row of ``x`` (token ids ending with EOS), in row order: rows decoded in
    batches sorted by source length; ``inter`` picks the beam hypothesis with the best sentence BLEU against the
    row's reference."""
    info = x.info
    order = torch.sort(x.src_lengths().cpu(), stable=True).indices
    out: list[list[int] | None] = [None] * x.num_rows
    for start in range(0, x.num_rows, opts.batch_size):
        rows = order[start:start + opts.batch_size]
        src = x.rows(rows.to(x.device)).src
        if opts.beam == 1:
            hyps = greedy(model, src, opts.max_len_a, opts.max_len_b)
            chosen = [[int(t) for t in h if t != PAD] for h in hyps.tolist()]
        else:
            n_best = opts.beam if opts.mode == "inter" else 1
            beams = beam_search(model, src, opts.beam, opts.length_penalty, opts.max_len_a, opts.max_len_b, n_best)
            chosen = []
            for r, hyps_r in zip(rows.tolist(), beams, strict=True):
                if opts.mode == "inter":
                    ref = info.target_texts[int(x.row_ids[r])]
                    best = max(hyps_r, key=lambda h: sentence_similarity(info.text(h.tokens), ref))
                else:
                    best = hyps_r[0]
                chosen.append([int(t) for t in best.tokens.tolist()])
        for r, ids in zip(rows.tolist(), chosen, strict=True):
            out[r] = ids if ids and ids[-1] == EOS else [*ids, EOS]
    return [ids for ids in out if ids is not None]


def pad_targets(seqs: list[list[int]]) -> Tensor:
    """Token id lists (each ending with EOS) as an int32 (N, longest) tensor padded with PAD."""
    width = max((len(s) for s in seqs), default=1)
    out = torch.full((len(seqs), width), PAD, dtype=torch.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.int32)
    return out


def distilled_targets(ctx: RunContext, teacher: nn.Module, opts: SeqKDOptions) -> tuple[Tensor, dict[str, Any]]:
    """The teacher's translations of the training split as padded targets (N, L), read from the cache when a
    verified entry with this key exists, else decoded now and written; and the summary's ``seqkd`` block."""
    x = ctx.splits.train.x
    key = hashlib.sha256("|".join([weights_digest(teacher), inputs_digest(x), repr(dataclasses.asdict(opts)),
                                   str(x.num_rows)]).encode()).hexdigest()
    path = Path(ctx.cfg.out_dir) / FOLDER / f"{key}.safetensors"
    report: dict[str, Any] = {"mode": opts.mode, "decoding": "greedy" if opts.beam == 1 else
                              f"beam {opts.beam}, length penalty {opts.length_penalty:g}"}
    tgt = None
    if path.is_file():
        try:
            tensors, state = load_checkpoint(path)
            if state.get("key") == key and tensors.get("targets") is not None and \
                    tensors["targets"].shape[0] == x.num_rows:
                tgt, report["status"] = tensors["targets"], "loaded"
                report["teacher_bleu_tok_train"] = state.get("teacher_bleu_tok_train")
        except CheckpointError:
            pass  # unreadable or tampered: decoded again below
    if tgt is None:
        if ctx.cfg.train.progress:
            print(f"{ctx.cfg.name}: seqkd: the teacher translates {x.num_rows:,} training sentences "
                  f"({report['decoding']}, mode {opts.mode})", flush=True)
        t0 = time.perf_counter()
        seqs = teacher_translations(teacher, x, opts)
        tgt = pad_targets(seqs)
        from teachkit.tasks.translation import corpus_bleu, references

        bleu = corpus_bleu([x.info.text(s) for s in seqs], references(x), tokenised=True)
        report.update(status="computed", decode_time_s=time.perf_counter() - t0, teacher_bleu_tok_train=bleu)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_checkpoint(path, {"targets": tgt.contiguous()}, {"key": key, "teacher_bleu_tok_train": bleu})
            report["file"] = str(path)
        except (OSError, WriteError) as e:  # an optimisation: the run goes on without it
            report["file"] = f"not written ({e})"
    else:
        report["file"] = str(path)
    lengths = (tgt != PAD).sum(dim=1)
    report.update(sentences=int(tgt.shape[0]), tokens=int(lengths.sum()),
                  mean_target_length=float(lengths.float().mean()) if len(lengths) else 0.0)
    return tgt, report


@RECIPES.register("seqkd", "sequence-level KD for translation (Kim & Rush 2016): the student trains on the "
                           "teacher's beam translations (seqkd.mode seq | inter)", options=SeqKDOptions)
def sequence_kd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
                run_dir: Path | None = None) -> RunResult:
    """Re-label the training split with the frozen teacher's translations, then train ``cfg.model`` on them with
    ``train.loss``; val and test keep their references."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    if ctx.splits.task != TRANSLATION:
        raise ConfigError(f"seqkd distils translations, but dataset {ctx.splits.name!r} has task {ctx.splits.task!r}; "
                          "use teachkit distill (kd.method=kd) for other tasks")
    source = TeacherSource(ctx)
    teacher, teacher_state = source.frozen(inference=False)  # beam search calls the teacher's submodules
    opts: SeqKDOptions = ctx.section("seqkd")
    tgt, report = distilled_targets(ctx, unwrap(teacher.module), opts)
    train = ctx.splits.train
    relabelled = dataclasses.replace(ctx.splits, train=TensorSplit(train.x.with_targets(tgt), tgt.to(train.y.device)))
    ctx.seed()
    student = ctx.model()
    meta = ctx.meta(cfg.train.loss)
    meta["teacher"] = {"epoch": teacher_state.get("epoch"), "loss": teacher_state.get("loss"),
                       **{k: v for k, v in teacher_state.items() if k.startswith(("val_", "test_"))}}
    meta["seqkd"] = {k: v for k, v in report.items() if k not in ("decode_time_s",)}
    trainer = ctx.trainer(student, label_step(student, cfg.train), meta=meta, splits=relabelled,
                          evaluator=ctx.evaluator())
    source.report(trainer)
    while not trainer.done:
        trainer.run_epoch()
    decoded = report["sentences"] if report.get("status") == "computed" else 0
    result = trainer.finish(seqkd=report, cost={
        "teacher_epochs_trained": source.epochs_trained, "student_epochs": cfg.train.epochs,
        "teacher_forward_images": decoded, "teacher_sentences_decoded": decoded,
        "wall_time_s": trainer.wall_time + (0.0 if source.given else folder_wall_time(ctx.run_dir / TEACHER_DIR))})
    write_json(ctx.run_dir / "teacher.json", meta["teacher"])
    return RunResult(ctx.run_dir, result.summary, student, result.history)


declare_teacher_use("seqkd", "frozen")
