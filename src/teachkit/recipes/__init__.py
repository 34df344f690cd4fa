"""Recipes: who trains when (train, kd, prokd, annealing, rco, takd, eskd, l2t).

Each recipe is a short function ``recipe(cfg, resume=False, splits=None, run_dir=None) -> RunResult``
registered in :data:`RECIPES` with its options dataclass (its config section); it composes a
:class:`RunContext` (run folder, device, data, seeding), a :class:`TeacherSource` and engine calls.
"""

from teachkit.recipes.common import RunResult, load_model
from teachkit.recipes.context import RunContext
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model
from teachkit.recipes.teacher import TeacherSource, TeacherTrajectory
from teachkit.registry import import_all

import_all(__name__, __path__)  # every recipe module registers itself (and its config section)

__all__ = ["RECIPES", "RunContext", "RunResult", "TeacherSource", "TeacherTrajectory", "distill", "load_model",
           "train_model"]
