"""On-policy distillation of causal language models: generalised knowledge distillation (GKD; Agarwal et al. ICLR
2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes", Algorithm 1).

``teachkit run gkd CONFIG``: a frozen teacher (``teacher.checkpoint``, or trained first in ``teacher/``) and a
student of the same tokenizer. Every training batch holds prompts and their reference responses. With
probability ``gkd.lmbda`` a batch is **on-policy**: the student samples a response to each prompt (temperature
``gkd.temperature``, top-k / top-p, at most ``gkd.max_new_tokens`` tokens; batched, with the key/value cache, the
student in eval mode) and the batch becomes prompt + sampled response. Otherwise it keeps the references, or with
``gkd.seq_kd`` responses the teacher samples the same way (sequence-level KD on the fly, TRL's ``seq_kd``). Both
models then score the batch's response tokens and the student minimises the generalised Jensen-Shannon
divergence between the teacher's and its own next-token distributions, per response token, averaged over the
batch's response tokens (Eq. 1; :func:`teachkit.losses.divergences.jensen_shannon` with ``gkd.beta``: 0 is
forward KL(teacher || student), 1 reverse KL(student || teacher)); no label term. Gradients do not flow through
the sampling (the samples are data), as in the paper.

The conventions follow Hugging Face TRL's ``GKDTrainer``: ``lmbda`` 0.5, ``beta`` 0.5, sampling temperature 0.9 with
``top_k`` 0 (no cut), the divergence at temperature 1 (``gkd.loss_temperature``), the mean over response tokens.

Exact resume: the coin of each step and its samples come from a generator seeded by (``train.seed``, epoch, step)
(:func:`step_generator`), never from the global random state, so a run resumed from its last checkpoint draws the
same coins and samples as the run that was not interrupted (tested). Off-policy batches on the references read the
teacher's outputs from the teacher cache (``teacher.cache``: computed once, or its top-k with the rest's mass);
sampled batches run the teacher on each batch. The summary's ``gkd`` block counts on-policy batches and sampled
tokens of this session, with the sampling speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from teachkit.config import RunConfig
from teachkit.data import Splits
from teachkit.data.lm import CAUSAL_LM, LMText
from teachkit.data.loader import epoch_generator
from teachkit.engine.checkpoint import write_json
from teachkit.errors import ConfigError
from teachkit.losses.divergences import logit_divergence
from teachkit.models import Tapped
from teachkit.models.lm_generate import GenerateOptions, generate_rows
from teachkit.options import Options, option
from teachkit.recipes.common import RunResult, folder_wall_time
from teachkit.recipes.context import RunContext
from teachkit.recipes.kd import teacher_forward_cost
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.teacher import TEACHER_DIR, TeacherSource, declare_teacher_use
from teachkit.recipes.teacher_cache import TeacherOutputs, run_teacher_outputs
from teachkit.types import Batch, Progress, StepOutput, Taps


@dataclass
class GKDOptions(Options):
    """Generalised knowledge distillation (the ``gkd`` section; TRL's defaults). ``lmbda``: the fraction of
    batches whose responses the student samples (on-policy); ``beta``: the generalised JSD's weight (0 forward KL,
    1 reverse KL); ``temperature``, ``top_k`` (0: no cut), ``top_p`` (1: no cut): how responses are sampled,
    at most ``max_new_tokens`` tokens; ``loss_temperature``: the temperature of both distributions in the
    divergence; ``seq_kd``: off-policy batches train on responses the teacher samples instead of the references."""

    #: the fraction of batches whose responses the student samples (on-policy)
    lmbda: float = option(0.5, ge=0.0, le=1.0)
    #: the generalised JSD's weight: 0 is forward KL(teacher || student), 1 reverse KL(student || teacher)
    beta: float = option(0.5, ge=0.0, le=1.0)
    #: the sampling temperature of on-policy (and seq_kd) responses
    temperature: float = option(0.9, gt=0.0)
    #: sample among the k most probable tokens only (0: no cut)
    top_k: int = option(0, ge=0)
    #: sample from the smallest set of tokens holding this probability (1: no cut)
    top_p: float = option(1.0, gt=0.0, le=1.0)
    #: the most tokens a sampled response may have
    max_new_tokens: int = option(128, ge=1)
    #: the temperature of both distributions in the divergence
    loss_temperature: float = option(1.0, gt=0.0)
    #: off-policy batches train on responses the teacher samples instead of the references (TRL's seq_kd)
    seq_kd: bool = False

    def sampling(self) -> GenerateOptions:
        return GenerateOptions(strategy="sample", max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                               top_k=self.top_k, top_p=self.top_p)


def step_generator(seed: int, epoch: int, step: int) -> torch.Generator:
    """The generator of one training step's coin and samples: a function of (seed, epoch, step) only."""
    return epoch_generator(seed, epoch, f"gkd-step-{step}")


def gkd_divergence(student_logits: Tensor, teacher: Taps, opts: GKDOptions) -> Tensor:
    """The generalised JSD (TRL's ``generalized_jsd_loss``) between the teacher's and the student's per-token
    distributions at ``loss_temperature``, averaged over the tokens; a top-k cached teacher as its (k + 1)-bucket
    distribution."""
    target = teacher.extra.get("topk") if teacher.extra.get("topk") is not None else teacher.logits.detach()
    return logit_divergence(student_logits, target, opts.loss_temperature, "jsd", opts.beta)


@dataclass
class OnPolicyCount:
    """What this session sampled: on-policy batches (of all batches), sampled response tokens and seconds."""

    batches: int = 0
    on_policy: int = 0
    teacher_sampled: int = 0
    #: rows whose responses were sampled (the teacher runs on each of them: no cache)
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def report(self) -> dict[str, Any]:
        return {"batches": self.batches, "on_policy_batches": self.on_policy,
                "teacher_sampled_batches": self.teacher_sampled, "sampled_tokens": self.tokens,
                "sampling_tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds > 0 else None}


class GKDStep:
    """The engine step of GKD (module docstring)."""

    def __init__(self, student: nn.Module, teacher: nn.Module, t_tap: Tapped, outputs: TeacherOutputs,
                 opts: GKDOptions, seed: int) -> None:
        self.student, self.teacher, self.t_tap, self.outputs = student, teacher, t_tap, outputs
        self.opts, self.seed = opts, seed
        self.count = OnPolicyCount()

    def sample(self, model: nn.Module, x: LMText, generator: torch.Generator) -> LMText:
        """``x``'s prompts with responses ``model`` samples (the generator's stream)."""
        prompts, lengths = x.prompts()
        t0 = time.perf_counter()
        responses, tokens = generate_rows(model, prompts, lengths, self.opts.sampling(), eos_id=x.info.eos_id,
                                          pad_id=x.info.pad_id, batch_size=max(1, x.num_rows), generator=generator)
        self.count.rows += x.num_rows
        self.count.tokens += tokens
        self.count.seconds += time.perf_counter() - t0
        return x.with_responses(responses)

    def __call__(self, batch: Batch, progress: Progress) -> StepOutput:
        generator = step_generator(self.seed, progress.epoch, progress.step)
        on_policy = bool(torch.rand((), generator=generator) < self.opts.lmbda)
        self.count.batches += 1
        x = batch.x
        if on_policy:
            self.count.on_policy += 1
            x = self.sample(self.student, x, generator)
        elif self.opts.seq_kd:
            self.count.teacher_sampled += 1
            x = self.sample(self.teacher, x, generator)
        teacher = self.outputs(batch) if x is batch.x else self.t_tap(x)
        logits = self.student(x)
        terms = {"gkd": gkd_divergence(logits, teacher, self.opts)}
        on = torch.tensor(float(batch.size if x is not batch.x else 0), device=logits.device)
        # the training accuracy reads the references' batches only (sampled ones have other targets)
        return StepOutput(terms, logits if x is batch.x else None, {"on_policy": on})


def check_gkd_data(ctx: RunContext) -> None:
    """GKD needs prompt / response data of a causal LM and one tokenizer for both models."""
    splits = ctx.splits
    info = getattr(splits.train.x, "info", None)
    if splits.task != CAUSAL_LM or getattr(info, "kind", None) != "prompt_response":
        raise ConfigError(f"gkd distils responses to prompts of a causal language model, but dataset {splits.name!r} "
                          f"has task {splits.task!r}" + ("" if splits.task != CAUSAL_LM else " without prompts (plain "
                                                         "text)") + "; use prompt_response or addition data")
    if (ctx.cfg.data.options or {}).get("teacher_tokenizer"):
        raise ConfigError("gkd compares the teacher's and the student's next-token distributions on the same "
                          f"tokens, so both need one tokenizer, but data.options.teacher_tokenizer="
                          f"{ctx.cfg.data.options['teacher_tokenizer']!r} is set; use kd.method=uld (teachkit distill) "
                          "for different tokenizers")


@RECIPES.register("gkd", "on-policy distillation of causal LMs (GKD, Agarwal et al. 2024): the student samples "
                         "responses (gkd.lmbda), the teacher scores them, generalised JSD(beta)", options=GKDOptions)
def gkd(cfg: RunConfig, resume: bool = False, splits: Splits | None = None, run_dir: Path | None = None) -> RunResult:
    """Distil ``cfg.model`` from the frozen teacher on a mix of reference and self-sampled responses."""
    ctx = RunContext.open(cfg, resume, splits, run_dir)
    check_gkd_data(ctx)
    opts: GKDOptions = ctx.section("gkd")
    source = TeacherSource(ctx)
    teacher, teacher_state = source.frozen()
    ctx.seed()
    student = ctx.model()
    t_tap = Tapped(teacher, side="teacher")
    outputs = run_teacher_outputs(ctx, t_tap, {"logits"})
    step = GKDStep(student, teacher, t_tap, outputs, opts, cfg.train.seed)
    meta = ctx.meta("gkd")
    meta["teacher"] = {"epoch": teacher_state.get("epoch"), "loss": teacher_state.get("loss"),
                       **{k: v for k, v in teacher_state.items() if k.startswith(("val_", "test_"))},
                       "inference": source.inference}
    trainer = ctx.trainer({"model": student}, step, meta=meta, callbacks=outputs.callbacks(),
                          frozen={"teacher": teacher})
    source.report(trainer)
    while not trainer.done:
        trainer.run_epoch()
    forwards = teacher_forward_cost(outputs, trainer)
    forwards["teacher_forward_images"] += step.count.rows
    result = trainer.finish(gkd=step.count.report(), teacher_cache=outputs.report(), cost={
        "teacher_epochs_trained": source.epochs_trained, "student_epochs": cfg.train.epochs, **forwards,
        "wall_time_s": trainer.wall_time + (0.0 if source.given else folder_wall_time(ctx.run_dir / TEACHER_DIR))})
    write_json(ctx.run_dir / "teacher.json", meta["teacher"])
    return RunResult(ctx.run_dir, result.summary, student, result.history)


declare_teacher_use("gkd", "frozen")
