"""``teachkit demo``: CE vs MSE teacher (ECCV 2024) and Hinton KD vs no KD, several paired seeds.

The protocol of :mod:`teachkit.experiments.teacher_study` with Hinton KD alone, on embedded data
(no downloads): every seed trains its own CE and MSE teachers and draws its own student subset, so the
intervals cover teacher, subset and student-initialisation variation. The teachers dominate the cost, so
their epochs are few; times: see README (measured).
"""

from __future__ import annotations

from pathlib import Path

from teachkit.experiments.teacher_study import StudySetting, run_study

SETTINGS: dict[str, StudySetting] = {
    "mnist5k": StudySetting("mnist5k", teacher={"name": "lenet"}, student={"name": "mlp", "options": {"hidden": [100]}},
                            teacher_epochs=5, student_epochs=30, train_subset=500, seeds=8),
    "digits": StudySetting("digits", teacher={"name": "lenet"}, student={"name": "mlp", "options": {"hidden": [32]}},
                           teacher_epochs=20, student_epochs=30, train_subset=200, seeds=10),
    "mnist1d": StudySetting("mnist1d", teacher={"name": "cnn1d"},
                            student={"name": "mlp", "options": {"hidden": [100]}},
                            teacher_epochs=30, student_epochs=40, train_subset=1000, seeds=10),
}


def run_demo(data: str = "mnist5k", seeds: int | None = None, out: str = "runs/demo", quick: bool = False) -> dict:
    """Run the demo protocol on ``data``, print and write the results table; returns the results."""
    setting = SETTINGS[data].quick() if quick else SETTINGS[data]
    return run_study(setting, ["kd"], out, seeds=seeds, title="demo")


def demo_sweep_file() -> Path:
    """The shipped sweep file of the images demo (``teachkit demo --sweep``): the mnist5k protocol above."""
    return Path(__file__).with_name("sweeps") / "demo.yaml"
