"""The distillation-loss contract every method implements.

A :class:`DistillLoss` compares the taps of a student and a frozen teacher and returns named
*unweighted* terms; :class:`~teachkit.losses.objective.DistillObjective` weights and sums them. Each
loss module registers its class with its typed options dataclass next to its definition::

    @dataclass
    class CRDOptions(Options):
        feat_dim: int = option(128, ge=1)

    @LOSSES.register("crd", "Contrastive Representation Distillation ...", options=CRDOptions)
    class CRD(DistillLoss):
        student_needs = teacher_needs = ("embedding",)
        term_names = ("student", "teacher")
        def __init__(self, student, teacher, options=None, *, num_classes=0, num_samples=0): ...

The run configuration validates ``kd.options.<method>`` against the registered dataclass (types, ranges,
choices; one-line errors naming the key), so a loss never re-checks its options; it only checks what
depends on the models (tap shapes, stage indices), at construction from the probed taps. The rank of the
logits is checked here, for every method that reads them (:class:`LogitRanks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from teachkit.errors import ConfigError
from teachkit.types import Batch, Progress, Taps, TrainingStage

__all__ = ["CLASS_LOGITS", "DistillLoss", "LogitRanks", "Progress", "check_logit_rank"]


@dataclass(frozen=True)
class LogitRanks:
    """The logit ranks a method accepts: ``low`` to ``high`` (None: no upper bound), shown as ``layout``."""

    low: int
    high: int | None
    layout: str

    def allows(self, rank: int) -> bool:
        return rank >= self.low and (self.high is None or rank <= self.high)


#: Classification logits, one row per sample: the default of every method that reads logits.
CLASS_LOGITS = LogitRanks(2, 2, "(batch, classes)")


def check_logit_rank(method: str, side: str, logits: object, ranks: LogitRanks) -> None:
    """One ConfigError line naming ``method``, the ``side``'s logit shape and what ``ranks`` allows, when a
    tensor ``logits`` has a rank outside it (anything but a tensor is left to the method)."""
    if isinstance(logits, Tensor) and not ranks.allows(logits.dim()):
        raise ConfigError(f"{method} needs {ranks.layout} logits; the {side}'s are shaped {tuple(logits.shape)} "
                          f"(rank {logits.dim()})")


class DistillLoss(nn.Module):
    """One distillation objective comparing student and teacher taps.

    Class attributes:

    - ``student_needs`` / ``teacher_needs``: the taps read from each side ("logits", "embedding",
      "stages", "stages_pre", or a named extra); a student is asked only for what the loss reads of it;
    - ``term_names``: the keys :meth:`forward` may return;
    - ``default_weight``: the paper's gamma in ``L = CE + gamma * L_distill``;
    - ``replaces_ce``: True when the method computes its own label loss (the objective adds no CE);
    - ``token_level``: True when it compares per-token tensors, so teacher and student must share a tokenizer;
    - ``vocabulary_agnostic``: True when it compares no class identities (ULD's sorted probabilities), so teacher
      and student may have different vocabularies (two tokenizers of a causal LM);
    - ``regression_ok``: True when it reads no class probabilities (it distils real-valued outputs too);
    - ``reads_teacher_model``: True when the constructor also takes ``teacher_model=`` (the tapped, frozen
      teacher module), for methods that read the teacher's parameters (OFD's BatchNorm margins);
    - ``frozen_parts``: names of teacher-side submodules fitted in a training stage and frozen otherwise
      (HSAKD's teacher heads, FT's paraphraser): :meth:`freeze_parts` and :meth:`train` keep them frozen.
    - ``logit_ranks``: the logit ranks a method reading ``logits`` accepts (default (batch, classes) only);
      other ranks are refused at construction in one ConfigError line naming the method and the shape.

    ``__init__(student, teacher, options=None, *, num_classes, num_samples)``: ``student``/``teacher`` are
    probed :class:`Taps` (batch of 2, eval mode, no grad); ``options`` the method's typed options (its
    defaults when None); ``num_samples`` the size of the student's training split (memory banks indexed by
    ``batch.index``). Trainable auxiliary modules (regressors, embeddings, memory banks) are built here
    from the probed shapes -- never from hand-written ones -- and train, save and resume with the student.

    ``forward(student, teacher, batch, progress) -> dict[str, Tensor]`` returns unweighted terms, computed
    in at least float32 (float64 stays float64). The objective multiplies term ``t`` by
    ``gamma * ramp(progress) * term_weights.get(t, 1)``.
    """

    student_needs: ClassVar[tuple[str, ...]] = ("logits",)
    teacher_needs: ClassVar[tuple[str, ...]] = ("logits",)
    term_names: ClassVar[tuple[str, ...]] = ()
    default_weight: ClassVar[float] = 1.0
    replaces_ce: ClassVar[bool] = False
    #: compares token-level tensors (hidden states, attention maps): teacher and student need one tokenizer
    token_level: ClassVar[bool] = False
    #: compares no class identities, so teacher and student may have different vocabularies (ULD)
    vocabulary_agnostic: ClassVar[bool] = False
    #: reads no class probabilities, so it also distils real-valued outputs (regression tasks such as STS-B)
    regression_ok: ClassVar[bool] = False
    #: the constructor takes ``teacher_model=`` (the tapped frozen teacher) besides the probed taps
    reads_teacher_model: ClassVar[bool] = False
    #: teacher-side submodules trained only in a training stage: no gradients and eval mode otherwise
    frozen_parts: ClassVar[tuple[str, ...]] = ()
    #: the logit ranks the method accepts, checked on the probed taps when it reads ``logits``
    logit_ranks: ClassVar[LogitRanks] = CLASS_LOGITS
    #: the name the class is registered under (set by ``LOSSES.register``), for error messages
    method_name: ClassVar[str] = ""

    def __init__(self, student: Taps | None = None, teacher: Taps | None = None, *, num_classes: int = 0,
                 num_samples: int = 0) -> None:
        super().__init__()
        self.check_logit_ranks(student, teacher)
        #: per-term weights inside the method (RKD's 25 / 50, DKD's alpha / beta); missing terms weigh 1
        self.term_weights: dict[str, float] = {}

    def check_logit_ranks(self, student: Taps | None, teacher: Taps | None) -> None:
        """ConfigError when a side the method reads logits of has logits of a rank outside ``logit_ranks``."""
        name = self.method_name or type(self).__name__
        for side, taps, needs in (("student", student, self.student_needs), ("teacher", teacher, self.teacher_needs)):
            if taps is not None and "logits" in needs:
                check_logit_rank(name, side, taps.logits, self.logit_ranks)

    def freeze_parts(self) -> None:
        """No gradients and eval mode (frozen BatchNorm statistics) for every module in ``frozen_parts``."""
        for name in self.frozen_parts:
            part = getattr(self, name)
            for p in part.parameters():
                p.requires_grad_(False)
            part.eval()

    def train(self, mode: bool = True) -> DistillLoss:
        """Everything follows ``mode`` except the ``frozen_parts``, which stay in eval mode."""
        super().train(mode)
        for name in self.frozen_parts:
            getattr(self, name).eval()
        return self

    def ramp(self, progress: Progress) -> float:
        """A factor on every term of this method at ``progress`` (a warm-up); default 1."""
        return 1.0

    def transform_batch(self, batch: Batch) -> Batch:
        """The batch both models see (HSAKD: each image with its 4 rotations). Default: unchanged.

        The original samples must stay first (rows 0..B-1): the training metrics read them."""
        return batch

    def training_stage(self, teacher: nn.Module, student: nn.Module | None = None) -> TrainingStage | None:
        """A training stage the recipe runs through the engine before the student trains (HSAKD: fit the
        teacher's auxiliary heads with its backbone frozen; FSP / AB: pre-train the student's body on the
        feature loss; FT: train the paraphraser). ``teacher`` / ``student`` are the tapped teacher (frozen)
        and student (called on inputs they return :class:`Taps`; the student module is ``student.model``).
        Default: none."""
        return None

    def forward(self, student: Taps, teacher: Taps, batch: Batch, progress: Progress) -> dict[str, Tensor]:
        raise NotImplementedError
