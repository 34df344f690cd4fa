"""Typed options (teachkit.options): every value is coerced and checked once, when the options are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from teachkit.errors import ConfigError
from teachkit.options import NoOptions, Options, describe, from_mapping, option, short_repr, to_plain


@dataclass
class Inner(Options):
    width: int = option(4, ge=1)


@dataclass
class Example(Options):
    lr: float = option(0.1, gt=0.0, le=1.0)
    steps: int = option(3, ge=1)
    mode: Literal["full", "checkpoint"] = "full"
    clip: float | None = option(None, gt=0.0)
    names: list[str] = option(factory=list)
    weights: dict[str, float] = option(factory=dict)
    extra: dict[str, Any] = option(factory=dict)
    inner: Inner = option(factory=Inner)
    flag: bool = False

    def validate(self) -> None:
        if self.mode == "checkpoint" and self.steps < 2:
            raise ConfigError(f"{self.key('steps')}={self.steps} needs >= 2 with {self.key('mode')}=checkpoint")


def test_defaults_and_coercion():
    e = from_mapping(Example, {"lr": 1, "clip": 2, "weights": {"a": 3}, "inner": {"width": 8}}, "opt")
    assert e.lr == 1.0 and isinstance(e.lr, float) and e.clip == 2.0 and e.weights == {"a": 3.0}
    assert isinstance(e.inner, Inner) and e.inner.width == 8 and e.key("lr") == "opt.lr"
    assert to_plain(e) == {"lr": 1.0, "steps": 3, "mode": "full", "clip": 2.0, "names": [], "weights": {"a": 3.0},
                           "extra": {}, "inner": {"width": 8}, "flag": False}
    assert Example() == Example(lr=0.1)  # made directly in Python: validated the same way
    assert describe(Inner) == "width=4" and describe(NoOptions) == ""


@pytest.mark.parametrize("data, message", [
    ({"lr": 0}, "opt.lr=0.0 is out of range: must be > 0.0 and <= 1.0"),
    ({"lr": 2}, "opt.lr=2.0 is out of range: must be > 0.0 and <= 1.0"),
    ({"lr": "fast"}, "opt.lr='fast' is not allowed: expected a number"),
    ({"lr": float("nan")}, "opt.lr=nan is not allowed: expected a finite number"),
    ({"steps": True}, "opt.steps=True is not allowed: expected an integer"),
    ({"steps": 2.5}, "opt.steps=2.5 is not allowed: expected an integer"),
    ({"mode": "ful"}, "opt.mode='ful' is not allowed (did you mean 'full'?); choose one of: full, checkpoint"),
    ({"clip": -1}, "opt.clip=-1.0 is out of range: must be > 0.0"),
    ({"clip": "x"}, "opt.clip='x' is not allowed: expected a number or null"),
    ({"names": "abc"}, "opt.names='abc' is not allowed: expected a list of a string"),
    ({"names": ["a", 1]}, "opt.names[1]=1 is not allowed: expected a string"),
    ({"weights": {"a": "x"}}, "opt.weights.a='x' is not allowed: expected a number"),
    ({"weights": [1]}, "opt.weights=[1] is not allowed: expected a mapping"),
    ({"inner": {"width": 0}}, "opt.inner.width=0 is out of range: must be >= 1"),
    ({"inner": {"wdth": 2}}, "unknown config key 'opt.inner.wdth' (did you mean 'width'?); allowed under opt.inner"),
    ({"flag": "yes"}, "opt.flag='yes' is not allowed: expected true/false"),
    ({"step": 3}, "unknown config key 'opt.step' (did you mean 'steps'?)"),
    ({"mode": "checkpoint", "steps": 1}, "opt.steps=1 needs >= 2 with opt.mode=checkpoint"),
])
def test_bad_values_are_one_line_errors_naming_the_key(data, message):
    with pytest.raises(ConfigError) as e:
        from_mapping(Example, data, "opt")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_direct_construction_checks_too_with_short_keys():
    with pytest.raises(ConfigError, match=r"^steps=0 is out of range: must be >= 1$"):
        Example(steps=0)
    with pytest.raises(ConfigError, match=r"^opt must be a mapping of keys \(opt.lr, ...\), got list \[1, 2\]$"):
        from_mapping(Example, [1, 2], "opt")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^opt.inner must be a mapping of keys \(opt.inner.width, ...\), got int 5$"):
        from_mapping(Example, {"inner": 5}, "opt")


def test_nested_defaults_are_independent():
    @dataclass
    class Holder(Options):
        items: list[int] = field(default_factory=list)

    a, b = Holder(), Holder()
    a.items.append(1)
    assert b.items == []


def test_short_repr_is_bounded_and_exact_when_short():
    for value in (0.1, "fast", [1, "a", None], {"a": [1, 2]}, (1,), (), set(), {3}, True, None):
        assert short_repr(value) == repr(value)
    assert short_repr("x" * 1000) == repr("x" * 1000)[:77] + "..."
    layer: list = [1] * 9
    for _ in range(30):  # 9**30 leaves if printed in full: a YAML alias bomb's shape
        layer = [layer] * 9
    text = short_repr(layer, 40)
    assert len(text) == 40 and text.endswith("...")
    loop: list = []
    loop.append(loop)
    assert len(short_repr(loop, 20)) == 20


def test_messages_show_values_bounded():
    layer: list = ["x"] * 9
    for _ in range(20):
        layer = [layer] * 9
    with pytest.raises(ConfigError) as e:
        from_mapping(Example, {"lr": layer}, "opt")
    assert len(str(e.value)) < 160 and str(e.value).startswith("opt.lr=[[[[")
    with pytest.raises(ConfigError, match=r"opt.steps=1000.0 is not allowed: expected an integer \(write 1000\)"):
        from_mapping(Example, {"steps": 1e3}, "opt")
