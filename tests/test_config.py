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


def test_yaml_1_2_numbers_in_files_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-3, weight_decay: 5E-4, momentum: .5}\ndata: {options: {n_train: 1e3}}\n")
    cfg = load_config(path, ["kd.temperature=1e1", "optim.warmup_epochs=+2.5e0"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.momentum) == (1e-3, 5e-4, 0.5)
    assert cfg.kd.temperature == 10.0 and cfg.optim.warmup_epochs == 2.5 and cfg.data.options["n_train"] == 1000.0
    assert parse_overrides(["a=1_000", "b=0x10", "c=e5", "d=1.0", "e=12e", "f=yes"]) == \
        {"a": 1000, "b": 16, "c": "e5", "d": 1.0, "e": "12e", "f": True}  # the rest reads as safe_load does
    with pytest.raises(ConfigError, match=r"train.epochs=1000.0 is not allowed: expected an integer \(write 1000\)"):
        load_config(None, ["train.epochs=1e3"])


def test_repeated_keys_and_alias_bombs_are_refused(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("optim:\n  lr: 0.1\n  momentum: 0.8\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"repeats key 'lr' \(line 4; first given on line 2\)"):
        load_config(dup)
    merged = tmp_path / "merge.yaml"  # a YAML merge key then an override of one of its keys is no repeat
    merged.write_text("optim: &o {lr: 0.1, momentum: 0.8}\nteacher: {optim: {<<: *o, lr: 0.2}}\n")
    cfg = load_config(merged)
    assert cfg.teacher.optim.lr == 0.2 and cfg.teacher.optim.momentum == 0.8 and cfg.optim.lr == 0.1
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nname: *i\n")
    with pytest.raises(ConfigError, match="anchors and aliases that expand to 926,177,115 values from 29 written"):
        load_config(bomb)
    rec = tmp_path / "rec.yaml"
    rec.write_text("name: &a [*a]\n")
    with pytest.raises(ConfigError, match="alias inside its own anchor"):
        load_config(rec)
    with pytest.raises(ConfigError, match=r"override 'data.options=\{a: 1, a: 2\}' repeats key 'a'"):
        load_config(None, ["data.options={a: 1, a: 2}"])


def test_files_that_are_not_yaml_text(tmp_path):
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)))
    with pytest.raises(ConfigError, match="is a binary file"):
        load_config(binary)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config(latin)
    with pytest.raises(ConfigError, match="is a folder, not a YAML file"):
        load_config(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: {lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line 2: "):
        load_config(bad)


def test_sections_given_as_scalars_and_malformed_overrides(tmp_path):
    for data, message in (({"data": 5}, "data must be a mapping of keys (data.name, ...), got int 5"),
                          ({"optim": [1]}, "optim must be a mapping of keys (optim.name, ...), got list [1]"),
                          ({"prokd": "x"}, "prokd must be a mapping of keys (prokd.mode, ...), got str 'x'")):
        with pytest.raises(ConfigError) as e:
            from_dict(data)
        assert str(e.value) == message
    with pytest.raises(ConfigError, match=r"^override 'model.options.hidden=\[8,' is malformed: '\[8,' is not valid "
                                          r"YAML \(.*\); e.g. model.options.hidden=\[8, 8\]$"):
        parse_overrides(["model.options.hidden=[8,"])
    with pytest.raises(ConfigError, match="override key 'optim..lr' has an empty part"):
        parse_overrides(["optim..lr=1"])
    assert parse_overrides(["name=@home"]) == {"name": "@home"}  # a plain word YAML cannot read is kept as text


@pytest.mark.parametrize("betas", ["[0.9]", "[0.9, 1.0]", "[-0.1, 0.9]", "[0.9, 0.99, 0.999]"])
def test_adamw_betas_are_two_numbers_in_0_1(betas):
    with pytest.raises(ConfigError, match=r"optim.betas=.* is not allowed: expected two numbers in \[0, 1\)"):
        load_config(None, ["optim.name=adamw", f"optim.betas={betas}"])
    with pytest.raises(ConfigError, match=r"teacher.optim.betas="):
        load_config(None, [f"teacher.optim.betas={betas}"])


def test_plugins_are_imported_before_validation_and_recorded(tmp_path, monkeypatch):
    from teachkit.config import dump_yaml

    (tmp_path / "cfgplug.py").write_text(
        "from teachkit.models import MODELS\nfrom teachkit.models.mlp import mlp\n\n"
        "MODELS.register('cfgplug_mlp', 'an MLP from a plugin')(mlp)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown model 'cfgplug_mlp'"):
        from_dict({"model": {"name": "cfgplug_mlp"}})
    cfg = from_dict({"plugins": ["cfgplug", "cfgplug"], "model": {"name": "cfgplug_mlp"}})
    assert cfg.plugins == ["cfgplug"] and "plugins:\n- cfgplug\n" in dump_yaml(cfg)
    with pytest.raises(ConfigError, match=r"^plugin 'nosuch_plugin_mod' cannot be imported: ModuleNotFoundError: No "
                                          r"module named 'nosuch_plugin_mod' \(is its folder on PYTHONPATH"):
        from_dict({"plugins": ["nosuch_plugin_mod"]})
    with pytest.raises(ConfigError, match=r"plugins='cfgplug' is not allowed: expected a list of a string"):
        from_dict({"plugins": "cfgplug"})
    with pytest.raises(ConfigError, match=r"plugin 'a b' is not a module name"):
        from_dict({"plugins": ["a b"]})
    # --resume reads the plugins recorded in the run folder's config.yaml
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("plugins: [cfgplug]\n")
    cfg = load_config(None, [f"out_dir={tmp_path / 'runs'}", "name=r"], plugins=["json"], resume=True)
    assert cfg.plugins == ["cfgplug", "json"]
    assert load_config(None, [f"out_dir={tmp_path / 'runs'}", "name=r"]).plugins == []


def test_plugin_reusing_a_builtin_name_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "dupplug.py").write_text(
        "from teachkit.models import MODELS\n\nMODELS.register('mlp')(lambda *a, **k: None)\n")
    (tmp_path / "synplug.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^plugin 'dupplug': model 'mlp' registered twice \(first by "
                                          r"teachkit.models.mlp\); choose another name$"):
        from_dict({"plugins": ["dupplug"]})
    with pytest.raises(ConfigError, match=r"^plugin 'synplug' cannot be imported: SyntaxError in .*synplug.py line 1"):
        from_dict({"plugins": ["synplug"]})
