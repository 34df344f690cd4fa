"""``model.name: "package.module:factory"``: any importable callable returning an nn.Module."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models import ModelConfig, TapSpec, make_model
from teachkit.models.zoo import build_model
from teachkit.options import from_mapping

NETS = textwrap.dedent('''
    from torch import nn

    class Net(nn.Module):
        def __init__(self, input_shape, num_classes, hidden=4):
            super().__init__()
            self.fc1 = nn.Linear(input_shape[0], hidden)
            self.fc = nn.Linear(hidden, num_classes)

        def forward(self, x):
            return self.fc(self.fc1(x).relu())

    def plain(width=3):
        return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 2))

    def anything(**kwargs):
        return nn.Linear(kwargs["input_shape"][0], kwargs["num_classes"])

    def not_a_module():
        return 3

    VALUE = 5
''')


@pytest.fixture()
def nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "tk_user_nets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "tk_user_nets"
    sys.modules.pop("tk_user_nets", None)


def test_factory_gets_shape_and_classes_when_it_names_them(nets: str) -> None:
    model = build_model(f"{nets}:Net", (6,), 3, hidden=5)
    assert model.fc1.out_features == 5 and model(torch.randn(2, 6)).shape == (2, 3)
    assert model.tap_spec == TapSpec()  # a plain module: logits only
    assert build_model(f"{nets}:anything", (6,), 4)(torch.randn(1, 6)).shape == (1, 4)
    plain = build_model(f"{nets}:plain", (6,), 2, width=7)  # takes neither: only its options
    assert plain[0].out_features == 7


def test_config_taps_apply_to_factory_models(nets: str) -> None:
    cfg = from_mapping(ModelConfig, {"name": f"{nets}:Net", "taps": {"embedding": "fc"}}, "model")
    assert make_model(cfg, (6,), 3).tap_spec == TapSpec(embedding="fc")


@pytest.mark.parametrize("name, options, match", [
    ("tk_no_such_module:Net", {}, "cannot import module 'tk_no_such_module'"),
    ("{nets}:Missing", {}, "has no attribute 'Missing'"),
    ("{nets}:VALUE", {}, "'VALUE' is a int, not a callable"),
    ("{nets}:not_a_module", {}, "returned a int, not an nn.Module"),
    ("{nets}:Net", {"depth": 3}, "has no option 'depth'.*allowed: hidden"),
    ("{nets}:Net", {"num_classes": 3}, "model.options.num_classes is set by teachkit"),
    ("{nets}:", {}, "must be a registered model or 'package.module:factory'"),
])
def test_factory_errors_are_one_line(nets: str, name: str, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_model(ModelConfig(name.format(nets=nets), options), (6,), 3)


def test_config_validation_imports_the_factory(nets: str) -> None:
    with pytest.raises(ConfigError, match="cannot import module 'tk_nope'"):
        from_mapping(ModelConfig, {"name": "tk_nope:Net"}, "model")
    assert from_mapping(ModelConfig, {"name": f"{nets}:Net"}, "model").name == f"{nets}:Net"


def test_registered_builder_may_return_a_plain_module() -> None:
    from teachkit.models import MODELS

    name = "tk-test-plain-linear"
    if name not in [e.name for e in MODELS.entries()]:
        MODELS.register(name, "test only")(lambda input_shape, num_classes: nn.Linear(input_shape[0], num_classes))
    model = build_model(name, (4,), 2)
    assert isinstance(model, nn.Linear) and model.tap_spec == TapSpec()
