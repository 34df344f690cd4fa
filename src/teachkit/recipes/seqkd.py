"""Sequence-level knowledge distillation for translation and causal LMs (Kim & Rush 2016, "Sequence-Level Knowledge
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

Causal language models (task ``causal_lm``, prompt / response data): the teacher answers every training prompt
(``seqkd.decode``: beam search, ``seqkd.beam=1`` greedy, or sampling seeded by ``train.seed``; at most
``seqkd.max_new_tokens`` tokens, batched with the key/value cache) and the student trains with ``train.loss`` on
prompt + the teacher's response, the loss on the response tokens only. The responses are cached the same way; the
``seqkd`` block gives the teacher's exact match and token accuracy against the training references.
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
from teachkit.data.lm import CAUSAL_LM, LMText
from teachkit.data.loader import epoch_generator
from teachkit.data.parallel import EOS, PAD, TRANSLATION, ParallelText
from teachkit.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, write_json
from teachkit.errors import ConfigError, WriteError
from teachkit.models.decoding import beam_search, greedy
from teachkit.models.lm_generate import GenerateOptions, generate_rows
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
    hypothesis, ``inter`` the beam hypothesis closest to the reference (sentence BLEU). Causal language models
    answer the training prompts with at most ``max_new_tokens`` tokens (null: the data's ``max_new_tokens``), by
    beam search (``decode=beam``, ``beam=1``: greedy) or by sampling (``decode=sample``: ``temperature``,
    ``top_p``; seeded by ``train.seed``)."""

    mode: Literal["seq", "inter"] = "seq"
    #: causal LMs: beam search (beam 1: greedy) or sampling; translation decodes by beam search
    decode: Literal["beam", "sample"] = "beam"
    beam: int = option(5, ge=1)
    length_penalty: float = 1.0
    max_len_a: float = option(1.2, ge=0.0)
    max_len_b: int = option(10, ge=1)
    #: causal LMs: the most tokens a response may have (null: the data's max_new_tokens)
    max_new_tokens: int | None = option(None, ge=1)
    #: causal LMs, decode=sample: the sampling temperature
    temperature: float = option(1.0, gt=0.0)
    #: causal LMs, decode=sample: the nucleus (1: no cut)
    top_p: float = option(1.0, gt=0.0, le=1.0)
    batch_size: int = option(64, ge=1)

    def validate(self) -> None:
        if self.mode == "inter" and self.beam < 2:
            raise ConfigError(f"{self.key('mode')}=inter picks among the teacher's beam hypotheses; it needs "
                              f"{self.key('beam')} >= 2, got {self.beam}")
        if self.mode == "inter" and self.decode == "sample":
            raise ConfigError(f"{self.key('mode')}=inter picks among beam hypotheses; it needs "
                              f"{self.key('decode')}=beam, not sample")


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


def check_seqkd_task(ctx: RunContext, opts: SeqKDOptions) -> None:
    """Translation or a causal LM's prompts (one line otherwise); sampling and ``max_new_tokens`` are the LM's."""
    task, name = ctx.splits.task, ctx.splits.name
    if task == CAUSAL_LM:
        if getattr(ctx.splits.train.x.info, "kind", None) != "prompt_response":
            raise ConfigError(f"seqkd answers the training prompts with the teacher, but dataset {name!r} is plain "
                              "text without prompts; use teachkit distill (kd.method=kd) for language modelling")
        if opts.mode == "inter":
            raise ConfigError(f"seqkd.mode=inter picks the beam hypothesis closest to a translation's reference by "
                              f"sentence BLEU; causal LM data (dataset {name!r}) takes seqkd.mode=seq")
        return
    if task != TRANSLATION:
        raise ConfigError(f"seqkd distils translations or a causal LM's responses, but dataset {name!r} has task "
                          f"{task!r}; use teachkit distill (kd.method=kd) for other tasks")
    if opts.decode != "beam":
        raise ConfigError(f"seqkd.decode={opts.decode} samples a causal LM's responses; translation decodes by beam "
                          "search (seqkd.beam=1: greedy)")


def lm_generate_options(ctx: RunContext, opts: SeqKDOptions) -> GenerateOptions:
    """How the teacher answers: beam search (width 1: greedy) or sampling, at most ``max_new_tokens`` tokens."""
    limit = opts.max_new_tokens or ctx.splits.train.x.info.max_new_tokens
    if opts.decode == "sample":
        return GenerateOptions(strategy="sample", max_new_tokens=limit, temperature=opts.temperature, top_p=opts.top_p)
    if opts.beam == 1:
        return GenerateOptions(strategy="greedy", max_new_tokens=limit)
    return GenerateOptions(strategy="beam", max_new_tokens=limit, beam=opts.beam, length_penalty=opts.length_penalty)


def describe_generation(gen: GenerateOptions) -> str:
    """``greedy``, ``beam 4, length penalty 1`` or ``sampling, temperature 0.9, top-p 1``, at most N new tokens."""
    if gen.strategy == "beam":
        how = f"beam {gen.beam}, length penalty {gen.length_penalty:g}"
    elif gen.strategy == "sample":
        how = f"sampling, temperature {gen.temperature:g}, top-p {gen.top_p:g}"
    else:
        how = "greedy"
    return f"{how}, at most {gen.max_new_tokens} new tokens"


def teacher_responses(ctx: RunContext, teacher: nn.Module, opts: SeqKDOptions) -> tuple[LMText, dict[str, Any]]:
    """The training prompts with the teacher's responses (a causal LM), read from the cache when a verified entry
    with this key exists, else generated now and written; and the summary's ``seqkd`` block (the teacher's exact
    match against the training references)."""
    x = ctx.splits.train.x
    gen = lm_generate_options(ctx, opts)
    seed = ctx.cfg.train.seed if gen.strategy == "sample" else None
    key = hashlib.sha256("|".join(["lm", weights_digest(teacher), inputs_digest(x), repr(gen), str(seed),
                                   str(x.num_rows)]).encode()).hexdigest()
    path = Path(ctx.cfg.out_dir) / FOLDER / f"{key}.safetensors"
    report: dict[str, Any] = {"mode": opts.mode, "decoding": describe_generation(gen)}
    responses = read_responses(path, key, x.num_rows, x.info.pad_id)
    if responses is not None:
        report["status"], report["file"] = "loaded", str(path)
    else:
        if ctx.cfg.train.progress:
            print(f"{ctx.cfg.name}: seqkd: the teacher answers {x.num_rows:,} training prompts ({report['decoding']})",
                  flush=True)
        t0 = time.perf_counter()
        prompts, lengths = x.prompts()
        generator = epoch_generator(seed, 0, "seqkd") if seed is not None else None
        responses, tokens = generate_rows(teacher, prompts, lengths, gen, eos_id=x.info.eos_id, pad_id=x.info.pad_id,
                                          batch_size=opts.batch_size, generator=generator)
        seconds = time.perf_counter() - t0
        report.update(status="computed", decode_time_s=seconds, tokens_per_s=tokens / seconds if seconds else None)
        report["file"] = write_responses(path, key, responses, x.info.pad_id)
    from teachkit.tasks.causal_lm import response_scores

    exact, token_acc = response_scores(x, responses)
    report.update(teacher_exact_train=100.0 * exact, teacher_token_acc_train=100.0 * token_acc,
                  sentences=len(responses), tokens=sum(len(r) for r in responses))
    return x.with_responses(responses), report


def read_responses(path: Path, key: str, rows: int, pad_id: int) -> list[list[int]] | None:
    """The cached responses of ``path`` when it verifies (content digest, key, row count); None otherwise."""
    if not path.is_file():
        return None
    try:
        tensors, state = load_checkpoint(path)
    except CheckpointError:
        return None  # unreadable or tampered: generated again
    ids, lengths = tensors.get("responses"), tensors.get("lengths")
    if state.get("key") != key or ids is None or lengths is None or ids.shape[0] != rows or lengths.shape != (rows,):
        return None
    return [row[:n] for row, n in zip(ids.tolist(), lengths.tolist(), strict=True)]


def write_responses(path: Path, key: str, responses: list[list[int]], pad_id: int) -> str:
    """Write the responses (padded ids and lengths) atomically; the file, or why it was not written."""
    width = max((len(r) for r in responses), default=1)
    ids = torch.full((len(responses), max(1, width)), pad_id, dtype=torch.int32)
    for i, r in enumerate(responses):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.int32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, {"responses": ids, "lengths": lengths}, {"key": key})
        return str(path)
    except (OSError, WriteError) as e:  # an optimisation: the run goes on without it
        return f"not written ({e})"


@RECIPES.register("seqkd", "sequence-level KD for translation (Kim & Rush 2016): the student trains on the "
                           "teacher's beam translations (seqkd.mode seq | inter)", options=SeqKDOptions)
def sequence_kd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None,
                run_dir: Path | None = None) -> RunResult:
    """Re-label the training split with the frozen teacher's translations, then train ``cfg.model`` on them with
    ``train.loss``; val and test keep their references."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    opts: SeqKDOptions = ctx.section("seqkd")
    check_seqkd_task(ctx, opts)
    source = TeacherSource(ctx)
    teacher, teacher_state = source.frozen(inference=False)  # beam search calls the teacher's submodules
    train = ctx.splits.train
    if ctx.splits.task == CAUSAL_LM:
        x, report = teacher_responses(ctx, teacher, opts)
        relabelled = dataclasses.replace(ctx.splits, train=TensorSplit(x, x.ids.to(train.y.device)))
    else:
        tgt, report = distilled_targets(ctx, unwrap(teacher.module), opts)
        relabelled = dataclasses.replace(ctx.splits, train=TensorSplit(train.x.with_targets(tgt),
                                                                       tgt.to(train.y.device)))
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
