"""L2T-DLF building blocks: teacher models mu_theta(s_t) -> Phi_t and the student-state tracker s_t.

The recipe itself is :mod:`teachkit.recipes.l2t_dlf` (``teachkit run l2t CONFIG``).
"""

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

__all__ = ["TEACHER_MODELS", "GatedTeacher", "LossTeacher", "StaticTeacher", "StudentStateTracker",
           "build_teacher", "load_teacher", "save_teacher"]
