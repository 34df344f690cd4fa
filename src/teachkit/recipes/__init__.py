"""Recipes: how teacher and student are scheduled (train, kd, prokd, annealing, rco, takd, eskd, l2t)."""

import teachkit.recipes.l2t_dlf  # noqa: F401  (registers the l2t recipe)
from teachkit.recipes import baselines, prokd  # noqa: F401  (register prokd, annealing, rco, takd, eskd)
from teachkit.recipes.common import FrozenTeacher, RunResult, load_model
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model

__all__ = ["RECIPES", "RunResult", "FrozenTeacher", "distill", "train_model", "load_model"]
