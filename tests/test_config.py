import pytest

from teachkit.config import RunConfig, from_dict, load_config, parse_overrides
from teachkit.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: resnet20}\noptim: {lr: 0.1}\n")
    cfg = load_config(path, ["optim.lr=0.05", "train.epochs=3", "data.options.shape=[3, 8, 8]"])
    assert isinstance(cfg, RunConfig)
    assert cfg.model.name == "resnet20" and cfg.optim.lr == 0.05 and cfg.train.epochs == 3
    assert cfg.data.options == {"shape": [3, 8, 8]}
    assert cfg.kd.alpha == 0.9 and cfg.kd.temperature == 4.0  # Hinton KD defaults


def test_int_accepted_as_float_not_bool_as_int():
    assert from_dict({"optim": {"lr": 1}}).optim.lr == 1.0
    with pytest.raises(ConfigError, match="train.epochs=True"):
        from_dict({"train": {"epochs": True}})


@pytest.mark.parametrize("overrides, match", [
    (["optim.lr=-0.1"], r"optim.lr=-0.1 is out of range: must be > 0.0"),
    (["optim.lr=0"], "optim.lr=0.0 is out of range"),
    (["train.epochs=0"], r"train.epochs=0 is out of range: must be >= 1"),
    (["data.batch_size=-4"], "data.batch_size=-4 is out of range"),
    (["kd.temperature=0"], "kd.temperature=0.0 is out of range: must be > 0.0"),
    (["kd.alpha=1.5"], r"kd.alpha=1.5 is out of range: must be >= 0.0 and <= 1.0"),
    (["optim.lr=fast"], "optim.lr='fast' is not allowed: expected a number"),
    (["optim.lr=.nan"], "expected a finite number"),
    (["optim.name=sgdd"], "did you mean 'sgd'"),
    (["optim.lrr=0.1"], "unknown config key 'optim.lrr' \\(did you mean 'lr'\\?\\)"),
    (["trian.epochs=3"], "unknown config key 'trian' \\(did you mean 'train'\\?\\)"),
    (["optim"], "not of the form key=value"),
])
def test_bad_values_are_one_line_errors(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, overrides)
    assert "\n" not in str(e.value)


def test_missing_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


def test_yaml_cannot_execute_code(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)


def test_whole_mapping_override_replaces(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: mlp, options: {hidden: [8], dropout: 0.1}}\n")
    assert load_config(path, ["model.options.hidden=[4]"]).model.options == {"hidden": [4], "dropout": 0.1}
    assert load_config(path, ["model.options={depth: 8}"]).model.options == {"depth": 8}


def test_parse_overrides_nested():
    assert parse_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


def test_recipe_sections_are_registered_options():
    """A recipe registered with options declares its section: defaults, attribute access, round trip."""
    from teachkit.config import SECTIONS, dump_yaml, to_dict, with_changes
    from teachkit.recipes.prokd import ProKDOptions

    assert SECTIONS["prokd"] is ProKDOptions and {"rco", "takd", "eskd", "l2t"} <= set(SECTIONS)
    cfg = from_dict({"prokd": {"tau_max": 5, "mode": "replay"}})
    assert isinstance(cfg.prokd, ProKDOptions) and cfg.prokd.tau_max == 5.0 and cfg.rco.anchors == 4
    changed = with_changes(cfg, prokd={"tau_max": 3}, train={"epochs": 2})
    assert changed.prokd.tau_max == 3.0 and changed.prokd.mode == "replay" and cfg.prokd.tau_max == 5.0
    assert from_dict(to_dict(changed)) == changed
    assert "prokd:\n  mode: replay" in dump_yaml(cfg)
    with pytest.raises(AttributeError, match="no section 'nosuch'"):
        _ = cfg.nosuch


def test_kd_options_are_typed_and_resolved_for_every_method():
    from teachkit.losses.crd import CRDOptions

    cfg = from_dict({"kd": {"method": ["crd", "kd"], "options": {"crd": {"feat_dim": 16}}}})
    assert isinstance(cfg.kd.options["crd"], CRDOptions) and cfg.kd.options["crd"].feat_dim == 16
    assert cfg.kd.options["crd"].nce_k == 16384 and cfg.kd.options["kd"].temperature is None  # None: kd.temperature
    with pytest.raises(ConfigError, match=r"^kd.options.crd.nce_t=0.0 is out of range: must be > 0.0$"):
        from_dict({"kd": {"method": "crd", "options": {"crd": {"nce_t": 0}}}})
    with pytest.raises(ConfigError, match=r"unknown distillation loss 'kdd' \(did you mean 'kd'\?\)"):
        from_dict({"kd": {"method": ["kdd"]}})


def test_names_are_checked_when_the_config_loads():
    for data, match in (({"model": {"name": "resnet2O"}}, "unknown model 'resnet2O'"),
                        ({"teacher": {"model": {"name": "lenett"}}}, "unknown model 'lenett'"),
                        ({"data": {"name": "cifar1O"}}, "unknown dataset 'cifar1O'"),
                        ({"train": {"loss": "msee"}}, "unknown loss 'msee'"),
                        ({"teacher": {"loss": "cee"}}, "unknown loss 'cee'")):
        with pytest.raises(ConfigError, match=match):
            from_dict(data)
