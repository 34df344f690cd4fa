"""The KD dominance warning compares gradients on the student's weights, not loss values: the shipped weights
never trigger it (Hinton KD's T^2-scaled value is ~100x CE's by design), an absurd gamma does, naming the term,
the ratio and the weight to lower."""

from __future__ import annotations

import json
import re

import pytest
import torch

from teachkit.recipes import distill, train_model
from teachkit.recipes.kd import DOMINANCE, GradientProbe, dominant_terms, method_terms
from teachkit.types import Progress

RATIO = re.compile(r"gradient of the (\w+) term on the student's weights is ([0-9,]+)x the CE term's.*"
                   r"lower kd\.gamma\.(\w+) \(now ([0-9.]+)\) to about ([0-9.e+-]+) or less")


def test_method_terms_groups_each_methods_terms():
    one, two = torch.tensor(1.0), torch.tensor(2.0)
    got = method_terms({"ce": one, "crd.student": two, "crd.teacher": two, "kd": one}, ["crd", "kd"])
    assert set(got) == {"label", "crd", "kd"} and float(got["crd"]) == 4.0
    assert set(method_terms({"l2": one}, ["kd"])) == {"label"}  # real-valued targets: the squared error


def test_probe_measures_gradient_norms_by_hand():
    """Student w (2 weights, both 1): CE stand-in sum(w) has gradient (1, 1), norm sqrt(2); kd = 3 * sum(w^2)
    has gradient 6w = (6, 6), norm 6 sqrt(2): ratio 6 on every measured step; later steps are not measured."""
    w = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(w.weight)
    probe = GradientProbe(w, ["kd"], steps=2)
    for step in range(4):
        terms = {"ce": w.weight.sum(), "kd": 3 * w.weight.pow(2).sum()}
        probe(terms, Progress(0, step, 2, 4))
    probe(terms, Progress(1, 0, 2, 4))
    assert probe.calls == 2 and len(probe.norms["kd"]) == 2
    assert probe.ratios() == {"kd": pytest.approx(6.0)}
    assert w.weight.grad is None  # the probe leaves the training gradients alone


def test_dominant_terms_suggests_the_weight_that_meets_the_limit():
    (message,) = dominant_terms({"kd": 4 * DOMINANCE, "dist": 2.0}, {"kd": 0.9, "dist": 1.0})
    term, ratio, gamma_of, now, suggested = RATIO.search(message).groups()
    assert (term, gamma_of, float(now)) == ("kd", "kd", 0.9)
    assert int(ratio.replace(",", "")) == 4 * DOMINANCE and float(suggested) == pytest.approx(0.9 / 4, rel=0.05)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from teachkit.config import from_dict
    from tests.conftest import tiny_config

    root = tmp_path_factory.mktemp("kdwarn")
    cfg = from_dict(tiny_config(root, name="teacher", model={"name": "mlp", "options": {"hidden": [32]}},
                                optim={"name": "sgd", "lr": 0.2, "schedule": "cosine"},
                                train={"epochs": 10, "progress": False}))  # confident: KD's value ~200x CE's
    return root, train_model(cfg).run_dir


def student(teacher, name: str, **kd) -> tuple[dict, dict]:
    """The student's summary and its epoch-1 training record (weighted term means)."""
    from teachkit.config import from_dict
    from tests.conftest import tiny_config

    root, folder = teacher
    cfg = from_dict(tiny_config(root, name=name, teacher={"checkpoint": str(folder)}, kd=kd,
                                train={"epochs": 1, "progress": False}))
    result = distill(cfg)
    return result.summary, json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])["train"]


@pytest.mark.parametrize("method", ["kd", "dkd", "dist", "rkd", "pkt"])
def test_shipped_defaults_do_not_warn(teacher, method):
    summary, train = student(teacher, f"default-{method}", method=method)
    assert not any("the CE term" in w for w in summary.get("warnings", [])), summary["warnings"]
    if method == "kd":  # the old rule (term values) fired here: the T^2-scaled KL is far above 100x the CE term
        assert train["kd"] > 100 * train["ce"]


def test_absurd_gamma_warns_with_term_ratio_and_fix(teacher):
    warnings = student(teacher, "loud", method="kd", gamma={"kd": 1000})[0].get("warnings", [])
    found = [RATIO.search(w) for w in warnings if RATIO.search(w)]
    assert len(found) == 1, warnings
    term, ratio, gamma_of, now, suggested = found[0].groups()
    assert term == gamma_of == "kd" and float(now) == 1000
    ratio = float(ratio.replace(",", ""))
    assert ratio > DOMINANCE and float(suggested) == pytest.approx(1000 * DOMINANCE / ratio, rel=0.05)
