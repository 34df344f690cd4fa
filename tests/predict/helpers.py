"""Tiny runs shared by the predictor tests: a raw breast-cancer CSV and a folder of PNGs, trained through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from teachkit.cli import main

FP32 = {"epochs": 4, "progress": False, "precision": "fp32", "channels_last": False}


def breast_cancer_csv(path: Path) -> pd.DataFrame:
    """The breast-cancer table with its raw features, string labels and a split column (every 5th row test)."""
    from sklearn.datasets import load_breast_cancer

    b = load_breast_cancer()
    df = pd.DataFrame(b.data, columns=[c.replace(" ", "_") for c in b.feature_names])
    df.insert(3, "patient", [f"p{i}" for i in range(len(df))])  # a text column: not a feature
    df["diagnosis"] = np.array(b.target_names)[b.target]
    df["split"] = ["test" if i % 5 == 0 else "val" if i % 10 == 1 else "train" for i in range(len(df))]
    df.to_csv(path, index=False)
    return df


def train_run(folder: Path, data: dict[str, Any], model: dict[str, Any], name: str = "run",
              lr: float = 0.05) -> Path:
    """Train ``model`` on ``data`` through ``teachkit train`` (fp32, 4 epochs); the run folder."""
    cfg = {"name": name, "out_dir": str(folder / "runs"), "data": data, "model": model,
           "optim": {"name": "sgd", "lr": lr}, "train": FP32}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(folder / f"{name}.yaml"), "--quiet"]) == 0
    return folder / "runs" / name


def summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def accuracy(predicted: list[Any], truth: Any) -> float:
    return 100.0 * float(np.mean(np.asarray(predicted, dtype=object) == np.asarray(truth, dtype=object)))


def write_images(root: Path, per_class: int, seed: int = 0) -> None:
    """``root/{train,test}/{dark,light}/*.png``: 12x10 RGB images, dark or light with noise (test: 1 in 4)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, (name, level) in enumerate((("dark", 120), ("light", 134))):
        for i in range(per_class):
            part = "test" if i % 4 == 0 else "train"
            pixels = np.clip(rng.normal(level, 60, size=(10, 12, 3)), 0, 255).astype(np.uint8)
            (root / part / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / part / name / f"{c}-{i:03d}.png")
