"""Sweep files: expansion into named runs, references, and every malformed sweep refused before anything runs."""

from __future__ import annotations

import pytest
import yaml

from teachkit.errors import ConfigError
from teachkit.experiments.sweep_spec import check_key, read_sweep
from tests.conftest import tiny_config


def write(tmp_path, sweep: dict, base: dict | None = None):
    if base is not None:
        (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
        sweep = {"base": "base.yaml", **sweep}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def test_grid_times_list_with_inner_grid(tmp_path):
    path = write(tmp_path, {"sweep": "s", "grid": {"train.seed": [0, 1, 2]},
                            "list": [{"label": "no-kd", "recipe": "train"},
                                     {"label": "kd", "kd.method": "kd", "grid": {"teacher.loss": ["ce", "mse"]}}]},
                 tiny_config(tmp_path))
    spec = read_sweep(path)
    names = [r.name for r in spec.runs]
    assert len(names) == 3 + 6 == len(set(names))
    assert names[:3] == ["no-kd,seed=0", "no-kd,seed=1", "no-kd,seed=2"]
    assert "kd,loss=mse,seed=2" in names
    run = next(r for r in spec.runs if r.name == "kd,loss=mse,seed=2")
    assert run.recipe == "kd" and run.config["teacher"]["loss"] == "mse" and run.config["train"]["seed"] == 2
    assert run.config["kd"]["method"] == "kd" and run.config["teacher"]["epochs"] == 2  # the base's value kept
    assert run.labels == {"variant": "kd", "train.seed": 2, "teacher.loss": "mse"}
    no_kd = spec.runs[0]
    assert no_kd.recipe == "train" and no_kd.labels["teacher.loss"] is None
    assert spec.seed_keys == ["train.seed"] and spec.folder.name == "s"


def test_named_axes_cross_and_references(tmp_path):
    base = tiny_config(tmp_path, data={"subset_seed": "${train.seed}", "train_subset": 100})
    path = write(tmp_path, {"grid": {"train.seed": [3, 4]},
                            "list": {"pair": [{"label": "a", "model.options": {"hidden": [8]}},
                                              {"label": "b", "model.options": {"hidden": [4]}}],
                                     "method": [{"kd.method": "kd"}, {"kd.method": "dist"}]}}, base)
    spec = read_sweep(path)
    assert spec.name == "s" and len(spec.runs) == 8
    run = next(r for r in spec.runs if r.name == "b,dist,seed=4")
    assert run.config["data"]["subset_seed"] == 4 and run.config["model"]["options"] == {"hidden": [4]}
    assert run.labels == {"pair": "b", "method": "dist", "train.seed": 4}


def test_recipe_in_grid_and_distill_alias(tmp_path):
    path = write(tmp_path, {"recipe": "distill", "grid": {"recipe": ["train", "kd"], "optim.lr": [0.1]}},
                 tiny_config(tmp_path))
    spec = read_sweep(path)
    assert [r.recipe for r in spec.runs] == ["train", "kd"] and spec.recipe == "kd"
    assert [r.name for r in spec.runs] == ["recipe=train", "recipe=kd"]  # a one-value grid key is not in names


def test_check_key_did_you_mean():
    check_key("kd.method")
    check_key("model.options.hidden")  # inside a free-form mapping
    check_key("prokd.tau_max")  # a recipe section
    with pytest.raises(ConfigError, match=r"sweep key 'kd.methd' does not exist: no 'methd' under kd \(did you "
                                          r"mean 'method'\?\)"):
        check_key("kd.methd")
    with pytest.raises(ConfigError, match="no 'trian' under the top level"):
        check_key("trian.seed")


BAD = [
    ("unknown-key", {"grid": {"kd.methd": ["kd"]}}, "did you mean 'method'"),
    ("empty-grid", {"grid": {}}, "sweep grid is empty"),
    ("empty-values", {"grid": {"train.seed": []}}, "sweep grid.train.seed is an empty list"),
    ("not-a-list", {"grid": {"train.seed": 3}}, "must be a list of values"),
    ("grid-and-list", {"grid": {"kd.method": ["kd"]}, "list": [{"kd.method": "dist"}]},
     "'kd.method' is given both in the grid and in list[0]"),
    ("two-axes", {"list": {"a": [{"optim.lr": 0.1}], "b": [{"optim.lr": 0.2}]}}, "is set by two lists"),
    ("empty-list", {"list": []}, "must be a non-empty list"),
    ("same-label", {"list": [{"label": "x", "optim.lr": 0.1}, {"label": "x", "optim.lr": 0.2}]},
     "repeats the label 'x'"),
    ("bad-label", {"list": [{"label": "a/b", "optim.lr": 0.1}]}, "label='a/b' is not allowed"),
    ("unknown-sweep-key", {"grids": {}}, "unknown key 'grids' (did you mean 'grid'?)"),
    ("dangling-reference", {"config": {"data": {"subset_seed": "${train.sed}"}}},
     "refers to key 'train.sed', which the config does not set"),
    ("bad-name", {"sweep": "a b"}, "sweep='a b' is not allowed"),
]


@pytest.mark.parametrize("sweep, fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_sweep_files(tmp_path, sweep, fragment):
    with pytest.raises(ConfigError) as e:
        read_sweep(write(tmp_path, sweep, tiny_config(tmp_path)))
    assert fragment in str(e.value) and "\n" not in str(e.value)
