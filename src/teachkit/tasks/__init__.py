"""Tasks beyond image classification: one file per task.

A task is a kind of target and how models are measured on it. A task file registers its data sources in
:data:`teachkit.data.DATASETS` (returning ``RawDataset(..., task="<name>")``) and its evaluator factory in
:data:`teachkit.engine.EVALUATORS` under the same name; recipes pick the evaluator named by ``splits.task``
and the engine selects checkpoints on the evaluator's primary metric (or ``train.select_metric``).
Classification is built in (``teachkit.data`` sources, ``teachkit.engine.evaluate``). Every module of
this package is imported when the package is, so a new task is one new file here plus its test.
"""

from teachkit.registry import import_all

import_all(__name__, __path__)
