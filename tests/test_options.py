"""Typed options (teachkit.options): every value is coerced and checked once, when the options are made."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from teachkit.config import dump_yaml, load_config
from teachkit.errors import ConfigError
from teachkit.options import (
    BOOL_WORDS,
    NoOptions,
    Options,
    describe,
    from_mapping,
    option,
    short_repr,
    to_plain,
    type_hints,
)


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


# ----------------------------------------------------------------------------- YAML 1.1 words read as booleans


@dataclass
class Words(Options):
    cache: Literal["auto", "off"] = "auto"
    switch: Literal["on", "off", "auto"] = "auto"
    answer: Literal["yes", "no"] = "yes"
    cased: Literal["Auto", "False", "True"] = "Auto"
    channels: bool | Literal["auto"] = "auto"
    flag: bool = False
    label: str = "x"


def test_a_word_yaml_read_as_a_boolean_is_the_choice_it_spells():
    w = from_mapping(Words, {"cache": False, "switch": True, "answer": False, "cased": True}, "w")
    assert (w.cache, w.switch, w.answer, w.cased) == ("off", "on", "no", "True")
    assert from_mapping(Words, {"switch": False}).switch == "off"
    # real booleans stay booleans, also beside a word choice
    w = from_mapping(Words, {"flag": True, "channels": False})
    assert w.flag is True and w.channels is False
    with pytest.raises(ConfigError, match=r"^w.cache=True is not allowed \(YAML reads on/yes/true as True\); choose "
                                          r"one of: auto, off$"):
        from_mapping(Words, {"cache": True}, "w")  # no 'on'/'yes'/'true' among the choices
    with pytest.raises(ConfigError, match=r"^w.flag='off' is not allowed: expected true/false$"):
        from_mapping(Words, {"flag": "off"}, "w")


def test_a_boolean_for_a_string_says_how_to_write_the_word():
    with pytest.raises(ConfigError) as e:
        from_mapping(Words, {"label": False}, "w")
    assert str(e.value) == ("w.label=False is not allowed: expected a string (YAML reads off/no/false as False; "
                            "quote the word, e.g. w.label='off')")
    with pytest.raises(ConfigError, match=r"^teacher.checkpoint=True is not allowed: expected a string \(YAML reads "
                                          r"on/yes/true as True; quote the word, e.g. teacher.checkpoint='on'\)$"):
        load_config(None, ["teacher.checkpoint=yes"])  # a `str | None` option


def _literals(tp: Any) -> list[tuple]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return [typing.get_args(tp)]
    if origin in (typing.Union, types.UnionType, list, dict):
        return [args for a in typing.get_args(tp) for args in _literals(a)]
    return []


def _all_options() -> set[type]:
    import teachkit.config
    import teachkit.data
    import teachkit.engine
    import teachkit.losses
    import teachkit.models
    import teachkit.recipes  # noqa: F401 -- each registers its options

    out, todo = set(), [Options]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return {c for c in out if dataclasses.is_dataclass(c) and c.__module__.startswith("teachkit.")}


def test_every_registered_word_choice_accepts_the_boolean_yaml_makes_of_it():
    """Every Literal option of the package whose choices include a YAML 1.1 boolean word (off, no, on, ...)
    accepts the boolean YAML reads it as, and gives back that word."""
    found = []
    for cls in _all_options():
        for name, tp in type_hints(cls).items():
            if typing.get_origin(tp) is not Literal:
                continue
            for value, words in BOOL_WORDS.items():
                spelled = [c for c in typing.get_args(tp) if isinstance(c, str) and c.lower() in words]
                if spelled:
                    found.append(f"{cls.__name__}.{name}")
                    assert from_mapping(cls, {name: value}).__dict__[name] == spelled[0]
    assert "TeacherConfig.cache" in found


def test_teacher_cache_off_as_the_readme_writes_it(tmp_path):
    assert load_config(None, ["teacher.cache=off"]).teacher.cache == "off"
    (tmp_path / "c.yaml").write_text("teacher:\n  cache: off\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.teacher.cache == "off"
    assert load_config(None, [f"teacher.cache={cfg.teacher.cache}"]) == cfg
    assert "cache: 'off'" in dump_yaml(cfg)  # written back quoted, read back the same
    (tmp_path / "back.yaml").write_text(dump_yaml(cfg))
    assert load_config(tmp_path / "back.yaml").teacher.cache == "off"
