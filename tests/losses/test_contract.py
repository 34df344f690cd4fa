"""The contract every registered distillation loss keeps (``teachkit.losses.base.DistillLoss``).

One parametrised test per clause, over ``LOSSES.names()``: a new loss is checked by registering it. The
models are a small CNN pair that provides every tap (a resnet8 student, a resnet14 teacher in a
:class:`~teachkit.models.FrozenTeacher`), probed and wired as the kd recipe does.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
import typing

import pytest
import torch
from torch import Tensor

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, KDConfig, Progress, build_objective, needs_of
from teachkit.models import FrozenTeacher, Tapped, build_model
from teachkit.options import Options, from_mapping, type_hints
from teachkit.types import Batch, Taps

#: taps only text encoders expose; methods reading them are checked on a text model (test_text_losses.py)
TEXT_TAPS = {"hidden_states", "attentions", "pooled"}
METHODS = [m for m in LOSSES.names()
           if not TEXT_TAPS & (set(LOSSES.get(m).student_needs) | set(LOSSES.get(m).teacher_needs))]
SHAPE = (3, 16, 16)
CLASSES = 10
NUM_SAMPLES = 64
BATCH = 8
#: mid-way through DKD's and ReviewKD's 20-epoch warm-ups, so that ramps are neither 0 nor 1
PROGRESS = Progress(5, 3, 240, 10)


def build(name: str, dtype: torch.dtype = torch.float32):
    """(student, frozen teacher, tapped student, tapped teacher, objective, batch) for method ``name``."""
    torch.manual_seed(0)
    student = build_model("resnet8", SHAPE, CLASSES).to(dtype)
    frozen = FrozenTeacher(build_model("resnet14", SHAPE, CLASSES).to(dtype))
    s_needs, t_needs = needs_of([name])
    s_tap, t_tap = Tapped(student, want=s_needs), Tapped(frozen, want=t_needs)
    with torch.no_grad():
        student.eval()
        x = torch.randn(2, *SHAPE, dtype=dtype)
        s_probe, t_probe = s_tap(x), t_tap(x)
        student.train()
    # a method whose main-stage weight is 0 by default (FSP, AB: the reference pre-trains with them and then
    # trains on CE) is checked as the plain loss it also is, at weight 1
    gamma = {name: 1.0} if LOSSES.get(name).default_weight == 0 else {}
    objective = build_objective(name, s_probe, t_probe, num_classes=CLASSES, num_samples=NUM_SAMPLES,
                                teacher_model=t_tap, gamma=gamma).to(dtype)
    objective.train()
    batch = Batch(torch.randn(BATCH, *SHAPE, dtype=dtype), torch.arange(BATCH) % CLASSES,
                  torch.arange(BATCH) * 7 % NUM_SAMPLES)
    return student, frozen, s_tap, t_tap, objective, objective.transform_batch(batch)


def tensors_of(taps: Taps) -> list[Tensor]:
    out = [taps.logits, taps.embedding, *taps.stages, *taps.stages_pre, *taps.extra.values()]
    return [t for t in out if isinstance(t, Tensor)]


def as_leaves(taps: Taps) -> Taps:
    """The same taps as fresh leaf tensors that require grad, to see whether a loss backpropagates into them."""
    def leaf(t):
        return t.detach().clone().requires_grad_(True) if isinstance(t, Tensor) else t

    return Taps(leaf(taps.logits), leaf(taps.embedding), [leaf(t) for t in taps.stages],
                [leaf(t) for t in taps.stages_pre], {k: leaf(v) for k, v in taps.extra.items()})


def logged_name(name: str, term: str, count: int) -> str:
    return name if count == 1 else f"{name}.{term}"


@pytest.mark.parametrize("name", METHODS)
def test_class_declares_needs_and_terms(name):
    cls = LOSSES.get(name)
    for needs in (cls.student_needs, cls.teacher_needs):
        assert isinstance(needs, tuple) and needs and all(isinstance(n, str) for n in needs)
    assert isinstance(cls.term_names, tuple) and cls.term_names and len(set(cls.term_names)) == len(cls.term_names)
    s_needs, t_needs = needs_of([name])
    assert s_needs == {"logits", *cls.student_needs} and t_needs == {"logits", *cls.teacher_needs}


@pytest.mark.parametrize("name", METHODS)
def test_terms_are_unweighted_finite_scalars_the_objective_weights(name):
    """(a) forward returns finite scalar tensors named in ``term_names``; the objective logs each as
    ``gamma * ramp * term_weight * term`` under ``method`` (one term) or ``method.term``."""
    student, _, s_tap, t_tap, objective, batch = build(name)
    method = objective.methods[name]
    s_out, t_out = s_tap(batch.x), t_tap(batch.x)
    before = copy.deepcopy(objective)  # CRD updates its memory banks per call: replay from the same state
    torch.manual_seed(11)
    raw = before.methods[name](s_out, t_out, batch, PROGRESS)
    assert raw and set(raw) <= set(type(method).term_names)
    for term, value in raw.items():
        assert isinstance(value, Tensor) and value.dim() == 0 and torch.isfinite(value), term
        assert value.device.type == "cpu"  # (d) runs on CPU
    torch.manual_seed(11)
    logged = objective(s_out, t_out, batch, PROGRESS)
    expected = {logged_name(name, t, len(raw)) for t in raw} | (set() if method.replaces_ce else {"ce"})
    assert set(logged) == expected
    coef = objective.weights[name] * method.ramp(PROGRESS)
    assert 0 < method.ramp(PROGRESS) <= 1
    for term, value in raw.items():
        weighted = coef * method.term_weights.get(term, 1.0) * value
        torch.testing.assert_close(logged[logged_name(name, term, len(raw))], weighted, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", METHODS)
def test_gradients_reach_the_student_and_aux_modules_never_the_teacher(name):
    """(b) after backward the student and the objective's trainable modules have gradients; the teacher's
    taps get none, its parameters none, and an SGD step over everything leaves the teacher unchanged."""
    student, frozen, s_tap, t_tap, objective, batch = build(name)
    teacher_state = {k: v.clone() for k, v in frozen.state_dict().items()}
    frozen_aux = {n: p.clone() for n, p in objective.named_parameters() if not p.requires_grad}
    params = list(student.parameters()) + list(objective.parameters()) + list(frozen.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    t_out = as_leaves(t_tap(batch.x))
    terms = objective(s_tap(batch.x), t_out, batch, PROGRESS)
    distill = [v for k, v in terms.items() if k != "ce"]
    grads = torch.autograd.grad(sum(distill), list(student.parameters()), retain_graph=True, allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grads), "the distillation terms do not reach the student"
    opt.zero_grad()
    sum(terms.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in student.parameters())
    for n, p in objective.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
        else:
            assert p.grad is None, n
    assert all(t.grad is None for t in tensors_of(t_out)), "a loss backpropagates into the teacher's taps"
    assert all(p.grad is None for p in frozen.parameters())
    opt.step()
    for k, v in frozen.state_dict().items():
        assert torch.equal(v, teacher_state[k]), k
    for n, p in objective.named_parameters():
        if n in frozen_aux:
            assert torch.equal(p, frozen_aux[n]), n


@pytest.mark.parametrize("name", METHODS)
def test_float64_stays_float64(name):
    """(c) with student, teacher and objective in float64 and float64 inputs, every term is float64."""
    _, _, s_tap, t_tap, objective, batch = build(name, torch.float64)
    s_out, t_out = s_tap(batch.x), t_tap(batch.x)
    assert s_out.logits.dtype == t_out.logits.dtype == torch.float64
    terms = objective(s_out, t_out, batch, PROGRESS)
    assert terms and all(v.dtype == torch.float64 and torch.isfinite(v) for v in terms.values()), \
        {k: v.dtype for k, v in terms.items()}
    sum(terms.values()).backward()


@pytest.mark.parametrize("name", METHODS)
def test_registered_options_are_what_init_accepts(name):
    """(e) ``__init__(student, teacher, options=None, *, num_classes, num_samples)`` takes exactly the
    registered options dataclass (defaults when None); a loss without options takes no ``options``."""
    cls, options_cls = LOSSES.get(name), LOSSES.options_of(name)
    _, _, s_tap, t_tap, _, _ = build(name)
    with torch.no_grad():
        x = torch.randn(2, *SHAPE)
        s_probe, t_probe = s_tap(x), t_tap(x)
    params = inspect.signature(cls.__init__).parameters
    assert params["num_classes"].kind is params["num_samples"].kind is inspect.Parameter.KEYWORD_ONLY
    kw = {"num_classes": CLASSES, "num_samples": NUM_SAMPLES}
    if cls.reads_teacher_model:
        assert params["teacher_model"].kind is inspect.Parameter.KEYWORD_ONLY
        kw["teacher_model"] = t_tap
    if options_cls is None:
        assert "options" not in params
        cls(s_probe, t_probe, **kw)
        return
    assert dataclasses.is_dataclass(options_cls) and issubclass(options_cls, Options)
    assert params["options"].default is None
    assert typing.get_type_hints(cls.__init__)["options"] == (options_cls | None)
    defaults = options_cls()
    assert cls(s_probe, t_probe, defaults, **kw).options == defaults
    assert cls(s_probe, t_probe, **kw).options == defaults


def _strip_none(tp):
    """``X`` for ``X | None``, else ``tp``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


def bad_values():
    """(method, field, bad value, expected message) for every typed option of every registered loss:
    a value of the wrong type, and one just outside each range rule."""
    rows = []
    for name in METHODS:
        cls = LOSSES.options_of(name)
        if cls is None:
            continue
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, rules = _strip_none(hints[f.name]), dict(f.metadata)
            if typing.get_origin(tp) is typing.Literal:
                rows.append((name, f.name, "bogus", "is not allowed; choose one of"))
            elif tp is bool:
                rows.append((name, f.name, "yes", "is not allowed: expected true/false"))
            elif tp is int:
                rows.append((name, f.name, "3", "is not allowed: expected an integer"))
                rows.append((name, f.name, 1.5, "is not allowed: expected an integer"))
            elif tp is float:
                rows.append((name, f.name, "0.5", "is not allowed: expected a number"))
            else:
                raise AssertionError(f"no bad values for {name}.{f.name}: {tp}")
            number = int if tp is int else float
            for rule, bound in rules.items():
                value = {"ge": bound - 1, "gt": bound, "le": bound + 1, "lt": bound}[rule]
                rows.append((name, f.name, number(value), "is out of range: must be"))
    return rows


BAD = bad_values()


def test_every_typed_option_has_bad_values():
    with_options = {n for n in METHODS if LOSSES.options_of(n) is not None}
    assert {row[0] for row in BAD} == with_options and len(BAD) > 2 * len(with_options)
    assert ("crd", "nce_k", 0, "is out of range: must be") in BAD
    assert ("vid", "mid_channels", 0, "is out of range: must be") in BAD
    assert ("fitnet", "kernel_size", "bogus", "is not allowed; choose one of") in BAD


@pytest.mark.parametrize(("name", "field", "value", "message"), BAD,
                         ids=[f"{n}.{f}={v!r}" for n, f, v, _ in BAD])
def test_bad_option_value_is_a_one_line_error_naming_the_key(name, field, value, message):
    prefix = f"kd.options.{name}.{field}={value!r} "
    with pytest.raises(ConfigError) as info:
        from_mapping(KDConfig, {"method": name, "options": {name: {field: value}}}, "kd")
    text = str(info.value)
    assert "\n" not in text and text.startswith(prefix) and message in text, text
    taps = Taps(torch.zeros(2, CLASSES))
    with pytest.raises(ConfigError) as info:  # options are checked before anything reads the taps or the teacher
        build_objective(name, taps, taps, num_classes=CLASSES, num_samples=NUM_SAMPLES,
                        options={name: {field: value}})
    assert str(info.value) == text
