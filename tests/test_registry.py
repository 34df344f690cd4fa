"""The registry's unknown-name error: the registered names and a close match, without the per-process entries the
Python API adds for model objects (``label@python``), which are only counted, so the line stays readable."""

from __future__ import annotations

import pytest

from teachkit.errors import ConfigError
from teachkit.registry import Registry


def test_unknown_name_lists_registered_names_and_counts_python_objects():
    reg: Registry[object] = Registry("widget")
    for name in ("alpha", "beta", "lambda@python", "lambda-2@python"):
        reg.register(name)(object())
    with pytest.raises(ConfigError) as e:
        reg.entry("alpah")
    message = str(e.value)
    assert message == ("unknown widget 'alpah' (did you mean 'alpha'?); choose one of: alpha, beta (and 2 given "
                       "as Python objects in this process)")
    assert reg.entry("lambda@python") is not None  # still found by name


def test_no_python_objects_no_count():
    reg: Registry[object] = Registry("widget")
    reg.register("alpha")(object())
    with pytest.raises(ConfigError, match=r"choose one of: alpha$"):
        reg.entry("zzz")
