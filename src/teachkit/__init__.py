"""teachkit: knowledge distillation with the teacher in the loop.

Importing the package registers every built-in dataset, model, loss, evaluator and recipe (and so every
config section), so a config file can be validated as soon as ``teachkit`` is imported. The Python API
(``teachkit.train``, ``teachkit.distill``, ``teachkit.run``, ``teachkit.load``: a predictor, ``teachkit.load_model``:
the bare module) is :mod:`teachkit.api`.
"""

from teachkit import recipes  # noqa: F401  (fills every registry; the package root sits above all layers)
from teachkit.api import Run, distill, load, load_model, run, train

__all__ = ["Run", "distill", "load", "load_model", "run", "train"]

__version__ = "0.1.0"
