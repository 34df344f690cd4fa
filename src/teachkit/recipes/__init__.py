"""Recipes: how teacher and student are scheduled (``train``, ``kd``; Pro-KD etc. come later)."""

from teachkit.recipes.common import FrozenTeacher, RunResult, load_model
from teachkit.recipes.kd import distill
from teachkit.recipes.registry import RECIPES
from teachkit.recipes.standalone import train_model

__all__ = ["RECIPES", "RunResult", "FrozenTeacher", "distill", "train_model", "load_model"]
