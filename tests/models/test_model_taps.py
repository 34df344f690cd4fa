"""Feature taps on zoo and user models: shapes, pre/post activations, hooks, wrappers, gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.models import Tapped, Taps, TapSpec, build_model, unwrap

ALL = ("logits", "embedding", "stages", "stages_pre")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture
def resnet20() -> nn.Module:
    return build_model("resnet20", (3, 32, 32), 10).eval()


class Wrapper(nn.Module):
    """Stands in for DistributedDataParallel: the model is ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_resnet20_taps(resnet20: nn.Module) -> None:
    x = torch.randn(2, 3, 32, 32)
    with Tapped(resnet20, want=ALL) as tapped:
        taps = tapped(x)
    assert isinstance(taps, Taps)
    assert [t.shape[1:] for t in taps.stages] == [(16, 32, 32), (32, 16, 16), (64, 8, 8)]
    assert [t.shape for t in taps.stages_pre] == [t.shape for t in taps.stages]
    assert taps.embedding is not None and taps.embedding.shape == (2, 64)
    with torch.no_grad():
        ref = resnet20(x)
    assert torch.equal(taps.logits, ref)
    for pre, post in zip(taps.stages_pre, taps.stages, strict=True):
        assert torch.equal(torch.relu(pre), post)
    assert (taps.stages_pre[-1] < 0).any()  # really the pre-activation, not overwritten by an inplace ReLU
    assert torch.allclose(taps.embedding, taps.stages[-1].mean(dim=(2, 3)), atol=1e-6)
    assert hook_count(resnet20) == 0


def test_resnet20_tap_spec(resnet20: nn.Module) -> None:
    assert resnet20.tap_spec == TapSpec(
        "fc", ("layer1", "layer2", "layer3"), ("layer1.2.preact", "layer2.2.preact", "layer3.2.preact"),
        stages_bn=("layer1.2.bn2", "layer2.2.bn2", "layer3.2.bn2"),
    )
    assert build_model("resnet56", (3, 32, 32), 10).tap_spec.stages_pre[0] == "layer1.8.preact"


@pytest.mark.parametrize(("name", "shape", "stages", "emb"), [
    ("resnet8x4", (3, 32, 32), [(64, 32, 32), (128, 16, 16), (256, 8, 8)], 256),
    ("resnet8", (1, 8, 8), [(16, 8, 8), (32, 4, 4), (64, 2, 2)], 64),
    ("lenet", (1, 28, 28), [(20, 12, 12), (50, 4, 4)], 500),
    ("lenet", (1, 8, 8), [(20, 4, 4), (50, 2, 2)], 500),
    ("cnn1d", (1, 40), [(25, 19), (25, 10), (25, 5)], 125),
    ("mlp", (1, 28, 28), [(500,)], 500),
])
def test_zoo_taps(name: str, shape: tuple[int, ...], stages: list[tuple[int, ...]], emb: int) -> None:
    model = build_model(name, shape, 10).eval()
    spec = model.tap_spec
    modules = dict(model.named_modules())
    assert all(p in modules for p in (spec.embedding, *spec.stages, *spec.stages_pre))
    taps = Tapped(model, want=ALL)(torch.randn(2, *shape))
    assert [tuple(t.shape[1:]) for t in taps.stages] == stages
    assert len(taps.stages_pre) == len(stages)
    assert taps.embedding.shape == (2, emb)
    if name != "lenet":  # LeNet stages are post-pool, its stages_pre the conv outputs
        for pre, post in zip(taps.stages_pre, taps.stages, strict=True):
            assert torch.equal(torch.relu(pre), post)


def test_mlp_taps_per_hidden_layer() -> None:
    model = build_model("mlp", (1, 40), 10, hidden=[64, 32])
    assert model.tap_spec.stages == ("body.relu1", "body.relu2")
    taps = Tapped(model, want=ALL)(torch.randn(3, 1, 40))
    assert [t.shape for t in taps.stages] == [(3, 64), (3, 32)]
    assert [t.shape for t in taps.stages_pre] == [(3, 64), (3, 32)]
    assert torch.equal(taps.embedding, taps.stages[-1])


def test_logits_only_registers_no_hooks(resnet20: nn.Module) -> None:
    tapped = Tapped(resnet20, want=("logits",))
    assert hook_count(resnet20) == 0
    taps = tapped(torch.randn(1, 3, 32, 32))
    assert taps.embedding is None and taps.stages == [] and taps.stages_pre == []


def test_remove_and_stale_wrappers(resnet20: nn.Module) -> None:
    first = Tapped(resnet20, want=("stages",))
    second = Tapped(resnet20, want=("stages", "embedding"))
    assert hook_count(resnet20) == 8  # 3 + 3 stages, the embedding (classifier input) and its output check
    assert len(second(torch.randn(1, 3, 32, 32)).stages) == 3
    assert first._records == {}  # the other wrapper's hooks do not record outside its own forward
    resnet20(torch.randn(1, 3, 32, 32))
    assert first._records == {} and second._records == {}
    first.remove()
    second.remove()
    assert hook_count(resnet20) == 0


def test_stage_order_follows_spec(resnet20: nn.Module) -> None:
    spec = TapSpec(stages=("layer3", "layer1"))
    with Tapped(resnet20, spec, want=("stages",)) as tapped:
        taps = tapped(torch.randn(1, 3, 32, 32))
    assert [t.shape[1] for t in taps.stages] == [64, 16]
    assert hook_count(resnet20) == 0


def test_user_sequential_with_spec() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    spec = TapSpec.from_dict({"embedding": "3", "stages": "1", "stages_pre": ["0"]})
    assert spec == TapSpec("3", ("1",), ("0",))
    taps = Tapped(model, spec, want=ALL)(torch.randn(2, 1, 8, 8))
    assert taps.stages[0].shape == (2, 4, 6, 6) and taps.embedding.shape == (2, 144)
    assert torch.equal(torch.relu(taps.stages_pre[0]), taps.stages[0])
    with pytest.raises(ConfigError, match="no 'stages' tap"):
        Tapped(model, want=("stages",))  # no spec and no model.tap_spec


def test_bad_path_names_the_path(resnet20: nn.Module) -> None:
    with pytest.raises(ConfigError, match="no module 'layer4'"):
        Tapped(resnet20, TapSpec(stages=("layer1", "layer4")), want=("stages",))
    with pytest.raises(ConfigError, match="no module 'head' for tap 'embedding'"):
        Tapped(resnet20, TapSpec(embedding="head"), want=("embedding",))
    assert hook_count(resnet20) == 0
    # names beyond the built-in taps are extras, resolved at the forward
    with pytest.raises(ConfigError, match=r"no tap 'stage' \(did you mean 'stages'\?\)"), \
            Tapped(resnet20, want=("stage",)) as tapped:
        tapped(torch.zeros(1, 3, 32, 32))


def test_spec_from_dict_errors() -> None:
    with pytest.raises(ConfigError, match="unknown key model.taps.stage"):
        TapSpec.from_dict({"stage": ["layer1"]})
    with pytest.raises(ConfigError, match="model.taps.stages must be"):
        TapSpec.from_dict({"stages": 3.5})


def test_sequential_indices_are_paths() -> None:
    """YAML reads ``model.taps.embedding=3`` (an nn.Sequential index) as an int: it is the path "3"."""
    spec = TapSpec.from_dict({"embedding": 3, "stages": [1, "2"], "extra": {"h": 1}})
    assert spec.embedding == "3" and spec.stages == ("1", "2") and spec.extra == {"h": ("1", "output")}
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    taps = Tapped(net, spec, want=("embedding", "stages"))(torch.randn(2, 4))
    assert taps.embedding.shape == (2, 5) and [t.shape for t in taps.stages] == [(2, 5), (2, 5)]


def test_embedding_must_name_the_classifier() -> None:
    """The embedding tap is the classifier's input; naming another module is one line, not a wrong feature."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    with pytest.raises(ConfigError, match=r"embedding='1' .* is not its classifier: its output has shape \(2, 5\), "
                                          r"the logits \(2, 3\)"):
        Tapped(net, TapSpec(embedding="1"), want=("embedding",))(torch.randn(2, 4))

    class PairIn(nn.Module):
        def forward(self, pair: tuple) -> torch.Tensor:
            return pair[0]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = PairIn()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head((x, x))

    with pytest.raises(ConfigError, match="model.taps.embedding has a tuple input, not a tensor"):
        Tapped(Net(), TapSpec(embedding="head"), want=("embedding",))(torch.randn(2, 3))


def test_module_that_did_not_run() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.unused = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    model = Net()
    with pytest.raises(ConfigError, match="'unused' named in model.taps.stages did not run"):
        Tapped(model, TapSpec(stages=("unused",)), want=("stages",))(torch.randn(1, 3))


def test_taps_resolve_through_wrapper() -> None:
    model = build_model("resnet8", (3, 16, 16), 10)
    wrapped = Wrapper(Wrapper(model))
    assert unwrap(wrapped) is model
    taps = Tapped(wrapped, want=ALL)(torch.randn(2, 3, 16, 16))
    assert len(taps.stages) == 3 and taps.embedding.shape == (2, 64)
    assert taps.logits.shape == (2, 10)


def test_model_with_a_module_attribute_is_not_unwrapped() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(4, 4)
            self.head = nn.Linear(4, 2)

    net = Net()
    assert unwrap(net) is net


def test_gradients_flow_through_taps() -> None:
    model = build_model("resnet8", (3, 16, 16), 10)
    taps = Tapped(model, want=ALL)(torch.randn(2, 3, 16, 16))
    loss = sum(t.pow(2).mean() for t in taps.stages) + taps.stages_pre[0].mean()
    loss.backward()
    assert model.conv1.weight.grad is not None and model.conv1.weight.grad.abs().sum() > 0
    assert model.layer3[0].conv1.weight.grad.abs().sum() > 0
    assert model.fc.weight.grad is None  # stage losses do not reach the classifier
    model.zero_grad()
    taps = Tapped(model, want=("embedding",))(torch.randn(2, 3, 16, 16))
    taps.embedding.sum().backward()
    assert model.layer1[0].conv1.weight.grad.abs().sum() > 0


def test_extra_taps_by_module_path_input_and_output(resnet20: nn.Module) -> None:
    spec = TapSpec.from_dict({"extra": {"block": "layer2.0", "block_in": "layer2.0:input", "fc_out": "fc:output"}})
    with Tapped(resnet20, spec, want=("logits", "block", "block_in", "fc_out")) as tapped:
        taps = tapped(torch.randn(2, 3, 32, 32))
    assert taps.extra["block"].shape == (2, 32, 16, 16)  # layer2's first block halves the map
    assert taps.extra["block_in"].shape == (2, 16, 32, 32)  # its input is layer1's output
    assert torch.equal(taps.extra["fc_out"], taps.logits) and taps.get("block") is taps.extra["block"]
    assert hook_count(resnet20) == 0


class HFLike(nn.Module):
    """Returns a structured output, as a Hugging Face model does: a mapping of named fields."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 6)
        self.classifier = nn.Linear(6, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        hidden = torch.tanh(self.encoder(input_ids * attention_mask))
        return {"logits": self.classifier(hidden), "hidden_states": (input_ids, hidden), "scores": hidden.sum(1)}


def test_structured_output_fields_and_mapping_inputs() -> None:
    model = HFLike()
    x = {"input_ids": torch.randn(2, 4), "attention_mask": torch.ones(2, 4)}
    taps = Tapped(model, want=("logits", "hidden_states"))(x)
    assert taps.logits.shape == (2, 3) and taps.extra["hidden_states"][1].shape == (2, 6)
    other = Tapped(model, TapSpec.from_dict({"logits": "scores"}))(x)  # another field as the logits
    assert other.logits.shape == (2,)
    emb = Tapped(model, TapSpec(embedding="classifier"), want=("embedding",))(x)
    assert emb.embedding.shape == (2, 6)  # the classifier's input
    with pytest.raises(ConfigError, match="model HFLike has no tap 'attentions'"):
        Tapped(model, want=("attentions",))(x)
    with pytest.raises(ConfigError, match=r"has no field 'start_logits' .*model.taps.logits"):
        Tapped(model, TapSpec.from_dict({"logits": "start_logits"}))(x)


@pytest.mark.parametrize("taps, match", [
    ({"extra": {"logits": "fc"}}, "'logits' is a built-in tap"),
    ({"extra": {"a": 3.5}}, "model.taps.extra.a must be a module path"),
    ({"extra": ["fc"]}, "model.taps.extra must be a mapping"),
    ({"logits": 1}, "model.taps.logits must be the name of an output field"),
])
def test_bad_extra_specs(taps, match) -> None:
    with pytest.raises(ConfigError, match=match):
        TapSpec.from_dict(taps)


def test_plain_module_without_spec_serves_logit_methods_and_names_what_feature_methods_need() -> None:
    """A plain nn.Module (no tap_spec) works for every logit-only method; a feature method says what to declare."""
    from teachkit.losses import build_objective, needs_of

    student = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    x = torch.randn(2, 3, 4)
    for method in ("kd", "dkd"):
        s_needs, t_needs = needs_of([method])
        s, t = Tapped(student, want=s_needs)(x), Tapped(teacher, want=t_needs)(x)
        assert build_objective(method, s, t, num_classes=5, num_samples=2)
    assert Tapped(student, want=needs_of(["crd"])[0]).inferred == "1"  # its only nn.Linear: inferred
    with pytest.raises(ConfigError) as e:
        Tapped(nn.Sequential(nn.Flatten(), nn.Identity()), want=needs_of(["crd"])[0])
    assert str(e.value) == ("model Sequential has no 'embedding' tap (it has no nn.Linear to infer it from); name its "
                            "module path in model.taps.embedding")


class HeadFirst(nn.Module):
    """An MLP whose classifier ``head`` is declared before ``body``: its last nn.Linear in module order is not
    the output layer, so the embedding tap cannot be inferred."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(6, 3)
        self.body = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


class Scaled(nn.Module):
    """The last nn.Linear's output is rescaled before it is returned: not the logits themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2.0


def test_embedding_is_inferred_as_the_input_of_the_last_linear() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    x = torch.randn(2, 4)
    tapped = Tapped(net, want=("logits", "embedding"), side="student")
    taps = tapped(x)
    assert tapped.inferred == "3" and tapped.spec.embedding == "3"
    assert torch.equal(taps.embedding, torch.relu(net[1](x)))  # the penultimate feature, by hand
    assert torch.equal(taps.logits, net(x))
    assert Tapped(net, want=("logits",)).inferred is None  # only when the embedding is wanted
    assert Tapped(net, TapSpec(embedding="3"), want=("embedding",)).inferred is None  # named: never inferred


def test_teacher_taps_update_the_recorded_spec() -> None:
    recorded = TapSpec(stages=("body",), extra={"a": ("body", "output")})
    updated = recorded.updated({"embedding": "head", "extra": {"b": "head:input"}})
    assert updated == TapSpec("head", ("body",), (), {"a": ("body", "output"), "b": ("head", "input")})
    model = HeadFirst()
    model.tap_spec = updated
    x = torch.randn(2, 4)
    taps = Tapped(model, want=("embedding",), side="teacher")(x)
    assert torch.equal(taps.embedding, torch.relu(model.body(x)))
    with pytest.raises(ConfigError, match=r"^unknown key teacher.taps.embeding \(did you mean 'embedding'\?\)"):
        recorded.updated({"embeding": "head"})


SIDES = [("student", "model.taps"), ("teacher", "teacher.taps")]


@pytest.mark.parametrize("side, key", SIDES)
@pytest.mark.parametrize("make, spec, want, message", [
    (lambda: nn.Sequential(nn.Flatten(), nn.Identity()), None, ("embedding",),
     "{side} model Sequential has no 'embedding' tap (it has no nn.Linear to infer it from); name its module path "
     "in {key}.embedding"),
    (HeadFirst, None, ("embedding",),
     "{side} model HeadFirst has no 'embedding' tap and it cannot be inferred: its last nn.Linear 'body' does not "
     "output the logits; name the classifier's module path in {key}.embedding (nn.Linear modules: 'head', 'body')"),
    (Scaled, None, ("embedding",),
     "{side} model Scaled has no 'embedding' tap and it cannot be inferred: its last nn.Linear 'fc' does not output "
     "the logits; name the classifier's module path in {key}.embedding (nn.Linear modules: 'fc')"),
    (HeadFirst, None, ("stages",), "{side} model HeadFirst has no 'stages' tap; name its module path in {key}.stages"),
    (HeadFirst, TapSpec(embedding="haed"), ("embedding",),
     "{side} model HeadFirst has no module 'haed' for tap 'embedding' ({key}.embedding) (did you mean 'head'?)"),
    (HeadFirst, TapSpec(embedding="body"), ("embedding",),
     "{key}.embedding='body' of the {side} model HeadFirst is not its classifier: its output has shape (2, 6), the "
     "logits (2, 3); name the module that maps the penultimate feature to the logits (e.g. 'fc' or 'head')"),
    (HeadFirst, None, ("feat",),
     "{side} model HeadFirst has no tap 'feat': declare it as {key}.extra.feat=<module path>[:input] or return it as "
     "a field of the model's output"),
])
def test_every_tap_error_names_the_side(side, key, make, spec, want, message) -> None:
    with pytest.raises(ConfigError) as e:
        Tapped(make(), spec, want=want, side=side)(torch.randn(2, 4))
    assert str(e.value) == message.format(side=side, key=key)
