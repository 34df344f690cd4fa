"""L2T-DLF, Learning to Teach with Dynamic Loss Functions (Wu et al., NeurIPS 2018), in one place.

- :mod:`~teachkit.recipes.l2t.loss`: the student's dynamic loss L_Phi and the teacher's dev objectives;
- :mod:`~teachkit.recipes.l2t.hypergrad`: exact reverse-mode teacher gradients through the student's
  momentum-SGD unroll (memory modes ``full``, ``checkpoint``, ``truncate:K``);
- :mod:`~teachkit.recipes.l2t.teachers`: teacher models mu_theta(s_t) -> Phi_t and their checkpoints;
- :mod:`~teachkit.recipes.l2t.state`: the student-state tracker s_t;
- :mod:`~teachkit.recipes.l2t.recipe`: the ``l2t`` recipe (``teachkit run l2t CONFIG``) and its options
  :class:`L2TOptions` (the ``l2t`` config section).
"""

from teachkit.recipes.l2t.hypergrad import (
    FunctionalStudent,
    HypergradResult,
    InnerOptimizer,
    InnerState,
    MemoryMode,
    NonFiniteHypergradientError,
    UnrollResult,
    hypergradient,
    parse_memory,
    teacher_params,
    unroll,
)
from teachkit.recipes.l2t.loss import (
    dev_cross_entropy,
    dynamic_loss,
    l2t_loss_terms,
    l2t_student_loss,
    phi_stats,
    smooth_error,
)
from teachkit.recipes.l2t.recipe import L2TOptions, l2t_dlf, student_trainer, train_student, train_teacher
from teachkit.recipes.l2t.state import StudentStateTracker
from teachkit.recipes.l2t.teachers import (
    TEACHER_MODELS,
    GatedTeacher,
    LossTeacher,
    StaticTeacher,
    build_teacher,
    load_teacher,
    save_teacher,
)

__all__ = ["TEACHER_MODELS", "FunctionalStudent", "GatedTeacher", "HypergradResult", "InnerOptimizer", "InnerState",
           "L2TOptions", "LossTeacher", "MemoryMode", "NonFiniteHypergradientError", "StaticTeacher",
           "StudentStateTracker", "UnrollResult", "build_teacher", "dev_cross_entropy", "dynamic_loss", "hypergradient",
           "l2t_dlf", "l2t_loss_terms", "l2t_student_loss", "load_teacher", "parse_memory", "phi_stats",
           "save_teacher", "smooth_error", "student_trainer", "teacher_params", "train_student", "train_teacher",
           "unroll"]
