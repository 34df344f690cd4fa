"""FT (Kim, Park & Kwak, NeurIPS 2018): factor loss, paraphraser / translator, paraphraser stage, recipe run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from teachkit.data.base import TensorSplit
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.ft import (
    PARAPHRASER_STAGE,
    FactorTransfer,
    FTOptions,
    Paraphraser,
    Translator,
    factor_code,
    factor_loss,
)
from teachkit.losses.stage_eval import StageLossEvaluator, pretrain_optim
from teachkit.types import Batch, Taps

from . import helpers
from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
SHAPE = (3, 16, 16)


# ----------------------------------------------------------------------------- reference transcriptions
# THE REFERENCE'S CODE, transcribed from RepDistiller (HobbitLong/RepDistiller): distiller_zoo/FT.py
# (FactorTransfer, p1=2, p2=1) and models/util.py (Paraphraser, Translator). Written inline here only as a
# cross-check of teachkit's implementation; the nn.Sequential() placeholders are kept, so the state-dict
# keys are the same as teachkit's modules (which use nn.Identity).


def _reference_factor_loss(f_s, f_t, p1=2, p2=1):
    def factor(f):
        return F.normalize(f.pow(p1).mean(1).view(f.size(0), -1))

    s_H, t_H = f_s.shape[2], f_t.shape[2]
    if s_H > t_H:
        f_s = F.adaptive_avg_pool2d(f_s, (t_H, t_H))
    elif s_H < t_H:
        f_t = F.adaptive_avg_pool2d(f_t, (s_H, s_H))
    if p2 == 1:
        return (factor(f_s) - factor(f_t)).abs().mean()
    return (factor(f_s) - factor(f_t)).pow(p2).mean()


def _reference_paper_ft(factor_s, factor_t):
    """The paper's Eq. 3 as the authors' Jangho-Kim/Factor-Transfer-pytorch code writes it:
    ``nn.L1Loss()(FT(factor_s), FT(factor_t))`` with ``FT(x) = F.normalize(x.view(x.size(0), -1))``."""
    def ft(x):
        return F.normalize(x.view(x.size(0), -1))

    return nn.L1Loss()(ft(factor_s), ft(factor_t))


class _ReferenceParaphraser(nn.Module):
    def __init__(self, t_shape, k=0.5, use_bn=False):
        super().__init__()
        in_channel = t_shape[1]
        out_channel = int(t_shape[1] * k)
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channel, in_channel, 3, 1, 1),
            nn.BatchNorm2d(in_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Conv2d(in_channel, out_channel, 3, 1, 1),
            nn.BatchNorm2d(out_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Conv2d(out_channel, out_channel, 3, 1, 1),
            nn.BatchNorm2d(out_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
        )
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(out_channel, out_channel, 3, 1, 1),
            nn.BatchNorm2d(out_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.ConvTranspose2d(out_channel, in_channel, 3, 1, 1),
            nn.BatchNorm2d(in_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.ConvTranspose2d(in_channel, in_channel, 3, 1, 1),
            nn.BatchNorm2d(in_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
        )

    def forward(self, f_s, is_factor=False):
        factor = self.encoder(f_s)
        if is_factor:
            return factor
        rec = self.decoder(factor)
        return factor, rec


class _ReferenceTranslator(nn.Module):
    def __init__(self, s_shape, t_shape, k=0.5, use_bn=True):
        super().__init__()
        in_channel = s_shape[1]
        out_channel = int(t_shape[1] * k)
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channel, in_channel, 3, 1, 1),
            nn.BatchNorm2d(in_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Conv2d(in_channel, out_channel, 3, 1, 1),
            nn.BatchNorm2d(out_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Conv2d(out_channel, out_channel, 3, 1, 1),
            nn.BatchNorm2d(out_channel) if use_bn else nn.Sequential(),
            nn.LeakyReLU(0.1, inplace=True),
        )

    def forward(self, f_s):
        return self.encoder(f_s)


# ----------------------------------------------------------------------------- helpers


def stage_taps(*maps):
    return Taps(torch.zeros(maps[0].shape[0], 2, dtype=maps[0].dtype), stages=list(maps))


def batch_of(n):
    return Batch(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), torch.arange(n))


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)


# ----------------------------------------------------------------------------- the factor loss


def test_factor_loss_hand_computed():
    # attention factor, one sample, C' = 2 channels, 1x2 positions:
    #   student channels [1, 2] and [sqrt5, 2]: squares [1, 4], [5, 4], channel mean [3, 4], norm 5 -> [0.6, 0.8]
    #   teacher channels [2, 0] and [2, 0]: channel mean of squares [4, 0] -> [1, 0]
    #   difference [-0.4, 0.8]: p = 1 -> mean |d| = 0.6; p = 2 -> mean d^2 = (0.16 + 0.64) / 2 = 0.4
    s = torch.tensor([[[[1.0, 2.0]], [[math.sqrt(5), 2.0]]]], dtype=torch.float64)
    t = torch.tensor([[[[2.0, 0.0]], [[2.0, 0.0]]]], dtype=torch.float64)
    assert factor_code(s)[0].tolist() == pytest.approx([0.6, 0.8], abs=1e-12)
    assert factor_loss(s, t, 1).item() == pytest.approx(0.6, abs=1e-12)
    assert factor_loss(s, t, 2).item() == pytest.approx(0.4, abs=1e-12)
    # flatten factor (paper Eq. 3), C' = 2, 1x2: student vec [3, 0, 0, 4] / 5 = [0.6, 0, 0, 0.8], teacher
    # [0, 0, 0, 2] / 2 = [0, 0, 0, 1]; difference [0.6, 0, 0, -0.2]: mean |d| over 4 entries = 0.8 / 4 = 0.2
    s = torch.tensor([[[[3.0, 0.0]], [[0.0, 4.0]]]], dtype=torch.float64)
    t = torch.tensor([[[[0.0, 0.0]], [[0.0, 2.0]]]], dtype=torch.float64)
    assert factor_loss(s, t, 1, "flatten").item() == pytest.approx(0.2, abs=1e-12)
    # identical factors up to a positive scale give 0 in both modes (the codes are normalised)
    assert factor_loss(s, 3 * s, 1).item() == pytest.approx(0.0, abs=1e-12)
    assert factor_loss(s, 3 * s, 1, "flatten").item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("sizes", [(4, 4), (4, 2), (2, 4)])
def test_factor_loss_matches_repdistiller_values_and_gradients(p, sizes):
    torch.manual_seed(0)
    f_s = torch.randn(4, 6, sizes[0], sizes[0], dtype=torch.float64, requires_grad=True)
    f_t = torch.randn(4, 6, sizes[1], sizes[1], dtype=torch.float64, requires_grad=True)
    ours, ref = factor_loss(f_s, f_t, p), _reference_factor_loss(f_s, f_t, p2=p)
    assert ours.dtype == torch.float64
    close(ours, ref)
    close(torch.autograd.grad(ours, (f_s, f_t)), torch.autograd.grad(ref, (f_s, f_t)))


def test_flatten_factor_matches_the_paper_code_values_and_gradients():
    torch.manual_seed(1)
    f_s = torch.randn(4, 6, 3, 3, dtype=torch.float64, requires_grad=True)
    f_t = torch.randn(4, 6, 3, 3, dtype=torch.float64)
    ours, ref = factor_loss(f_s, f_t, 1, "flatten"), _reference_paper_ft(f_s, f_t)
    close(ours, ref)
    close(torch.autograd.grad(ours, f_s), torch.autograd.grad(ref, f_s))


# ----------------------------------------------------------------------------- paraphraser and translator


@pytest.mark.parametrize("bn", [False, True])
def test_paraphraser_matches_repdistiller(bn):
    torch.manual_seed(2)
    ours = Paraphraser(8, 4, bn).double()
    ref = _ReferenceParaphraser((4, 8, 3, 3), 0.5, bn).double()
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 8, 3, 3, dtype=torch.float64, requires_grad=True)
    factor, rec = ours(x)
    ref_factor, ref_rec = ref(x)
    assert factor.shape == (4, 4, 3, 3) and rec.shape == x.shape
    close(factor, ref_factor)
    close(rec, ref_rec)
    close(ref(x, is_factor=True), factor)
    # RepDistiller's init criterion nn.MSELoss() on the reconstruction, and its gradient w.r.t. the map
    ours_mse, ref_mse = F.mse_loss(rec, x.detach()), nn.MSELoss()(ref_rec, x.detach())
    close(ours_mse, ref_mse)
    close(torch.autograd.grad(ours_mse, x), torch.autograd.grad(ref_mse, x))


@pytest.mark.parametrize("bn", [True, False])
def test_translator_matches_repdistiller(bn):
    torch.manual_seed(3)
    ours = Translator(6, 5, bn).double()
    ref = _ReferenceTranslator((4, 6, 3, 3), (4, 10, 3, 3), 0.5, bn).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 6, 3, 3, dtype=torch.float64, requires_grad=True)
    out, ref_out = ours(x), ref(x)
    assert out.shape == (4, 5, 3, 3)
    close(out, ref_out)
    close(torch.autograd.grad(out.sum(), x), torch.autograd.grad(ref_out.sum(), x))


@pytest.mark.parametrize(("s_size", "t_size"), [(4, 4), (4, 2), (2, 4)])
def test_main_stage_loss_matches_repdistiller_values_and_gradients(s_size, t_size):
    """train_distill's ``criterion_kd(translator(feat_s[-2]), paraphraser(feat_t[-2], is_factor=True))``, with the
    translator in train mode (BN batch statistics) and the paraphraser in eval mode."""
    torch.manual_seed(4)
    f_s = torch.randn(4, 6, s_size, s_size, dtype=torch.float64, requires_grad=True)
    f_t = torch.randn(4, 10, t_size, t_size, dtype=torch.float64)
    s_taps = stage_taps(torch.randn(4, 3, 8, 8, dtype=torch.float64), f_s)
    t_taps = stage_taps(f_t)
    loss = FactorTransfer(s_taps, t_taps, FTOptions(paraphraser_bn=True)).double().train()
    ref_t = _ReferenceTranslator(f_s.shape, f_t.shape).double().train()
    ref_p = _ReferenceParaphraser(f_t.shape, use_bn=True).double().eval()
    ref_t.load_state_dict(loss.translator.state_dict())
    ref_p.load_state_dict(loss.paraphraser.state_dict())
    assert loss.translator.training and not loss.paraphraser.training
    out = loss(s_taps, t_taps, batch_of(4), P)
    assert set(out) == {"ft"} and out["ft"].dtype == torch.float64
    ref = _reference_factor_loss(ref_t(f_s), ref_p(f_t, is_factor=True))
    close(out["ft"], ref)
    ours_grads = torch.autograd.grad(out["ft"], [f_s, *loss.translator.parameters()])
    ref_grads = torch.autograd.grad(ref, [f_s, *ref_t.parameters()])
    close(ours_grads, ref_grads)
    assert ours_grads[0].abs().sum() > 0


def test_modules_sized_from_probed_stages():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    _, _, s_probe, t_probe = helpers.probe(student, teacher, "ft", shape=SHAPE)
    c_s, c_t = s_probe.stages[-1].shape[1], t_probe.stages[-1].shape[1]
    loss = FactorTransfer(s_probe, t_probe)
    assert loss.factor_channels == c_t // 2
    assert loss.translator.encoder[0].in_channels == c_s and loss.translator.encoder[-3].out_channels == c_t // 2
    assert isinstance(loss.translator.encoder[1], nn.BatchNorm2d)  # translator: BN (RepDistiller use_bn=True)
    assert loss.paraphraser.encoder[0].in_channels == c_t and loss.paraphraser.decoder[-3].out_channels == c_t
    assert not any(isinstance(m, nn.BatchNorm2d) for m in loss.paraphraser.modules())  # Paraphraser(t_shape)
    assert not any(p.requires_grad for p in loss.paraphraser.parameters())
    assert all(p.requires_grad for p in loss.translator.parameters())
    other = FactorTransfer(s_probe, t_probe, FTOptions(rate=0.75, translator_bn=False, paraphraser_bn=True))
    assert other.factor_channels == int(c_t * 0.75)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in other.translator.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in other.paraphraser.modules())


def test_registered_defaults():
    entry = LOSSES.get("ft")
    assert entry is FactorTransfer and FactorTransfer.default_weight == 200.0
    o = FTOptions()
    assert (o.rate, o.factor, o.p, o.paraphraser_bn, o.translator_bn) == (0.5, "attention", 1, False, True)
    assert (o.init_epochs, o.init_lr, o.init_weight_decay, o.init_batch_size, o.init_data) == (30, 0.01, 5e-4, None,
                                                                                               "full")


# ----------------------------------------------------------------------------- bad inputs


def _maps(*shapes):
    return stage_taps(*(torch.zeros(2, *s) for s in shapes))


BAD = [
    ("missing student stages", Taps(torch.zeros(2, 4)), _maps((8, 2, 2)), {},
     "'ft' needs the student's 'stages' tap"),
    ("missing teacher stages", _maps((8, 2, 2)), Taps(torch.zeros(2, 4)), {},
     "'ft' needs the teacher's 'stages' tap"),
    ("flat student stage", _maps((8, 2, 2), (16,)), _maps((8, 2, 2)), {},
     r"spatial last stage map .* student's stage 1 has shape \(2, 16\)"),
    ("flat teacher stage", _maps((8, 2, 2)), _maps((16,)), {},
     r"teacher's stage 0 has shape \(2, 16\)"),
    ("no factor channels", _maps((8, 2, 2)), _maps((1, 2, 2)), {},
     r"rate=0.5 gives int\(1 \* 0.5\) = 0 factor channels"),
    ("1x1 attention", _maps((8, 1, 1)), _maps((8, 4, 4)), {},
     r"last stages \(student \(8, 1, 1\), teacher \(8, 4, 4\)\) pool to 1x1"),
]


@pytest.mark.parametrize(("case", "student", "teacher", "options", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_are_config_errors(case, student, teacher, options, match):
    with pytest.raises(ConfigError, match=match) as e:
        FactorTransfer(student, teacher, FTOptions(**options))
    assert "\n" not in str(e.value)


def test_accepted_shapes_and_option_errors():
    # 1x1 maps are fine for the flattened factor, (B, C, L) maps are read as (B, C, L, 1)
    FactorTransfer(_maps((8, 1, 1)), _maps((8, 4, 4)), FTOptions(factor="flatten"))
    loss = FactorTransfer(_maps((8, 5)), _maps((6, 3)))
    out = loss(_maps((8, 5)), _maps((6, 3)), batch_of(2), P)
    assert math.isfinite(out["ft"].item())
    for bad in ({"rate": 0.0}, {"p": 3}, {"factor": "sum"}, {"init_epochs": 0}, {"init_lr": 0.0},
                {"init_data": "test"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            FTOptions(**bad)
    plain = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))
    with pytest.raises(ConfigError, match="'stages'"):
        one_step("ft", plain, make_pair("resnet8", "resnet8", shape=SHAPE)[1], shape=SHAPE, batch_size=4)


# ----------------------------------------------------------------------------- one step, training stage


def test_one_step_trains_translator_not_paraphraser():
    student, teacher = make_pair("resnet8", "resnet20", shape=SHAPE)
    before = state(teacher)
    torch.manual_seed(5)
    terms, objective, teacher = one_step("ft", student, teacher, shape=SHAPE, batch_size=4)
    assert set(terms) == {"ce", "ft"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["ft"] == 200.0
    ft = objective.methods["ft"]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ft.translator.parameters())
    assert all(p.grad is None for p in ft.paraphraser.parameters())
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k


def stage_setup(**options):
    torch.manual_seed(0)
    student, teacher = make_pair("resnet8", "resnet8", shape=SHAPE)
    s_tap, t_tap, s_probe, t_probe = helpers.probe(student, teacher, "ft", shape=SHAPE)
    kd = {"options": {"ft": options}} if options else {}
    objective = build_objective(["ft"], s_probe, t_probe, num_classes=10, num_samples=64, **kd)
    return objective, student, teacher, s_tap, t_tap


def test_training_stage_describes_repdistillers_init():
    objective, _, _, s_tap, t_tap = stage_setup()
    ft = objective.methods["ft"]
    stages = objective.training_stages(t_tap, s_tap)
    assert len(stages) == 1
    stage = stages[0]
    assert stage.name == PARAPHRASER_STAGE == "ft_paraphraser"
    assert list(stage.modules) == ["model"] and stage.modules["model"] is ft.paraphraser
    assert all(p.requires_grad for p in ft.paraphraser.parameters())  # unfrozen for the stage
    assert (stage.epochs, stage.batch_size, stage.data) == (30, None, "full")
    assert stage.optim == pretrain_optim(0.01) == {"name": "sgd", "lr": 0.01, "momentum": 0.9, "nesterov": False,
                                                   "weight_decay": 5e-4, "schedule": "constant",
                                                   "warmup_epochs": 0.0}
    other, _, _, s_tap, t_tap = stage_setup(init_epochs=3, init_lr=0.05, init_weight_decay=0.0, init_batch_size=8,
                                            init_data="student")
    stage = other.methods["ft"].training_stage(t_tap, s_tap)
    assert (stage.epochs, stage.batch_size, stage.data, stage.optim["lr"], stage.optim["weight_decay"]) == \
        (3, 8, "student", 0.05, 0.0)


def test_training_stage_trains_only_the_paraphraser_then_freezes_it():
    objective, student, teacher, s_tap, t_tap = stage_setup()
    ft = objective.methods["ft"]
    stage = ft.training_stage(t_tap, s_tap)
    model = stage.modules["model"]
    teacher_before, student_before, translator_before = state(teacher), state(student), state(ft.translator)
    paraphraser_before = state(ft.paraphraser)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    torch.manual_seed(6)
    batch = Batch(torch.randn(4, *SHAPE), torch.arange(4), torch.arange(4))
    losses = []
    for step in range(8):
        out = stage.step(batch, Progress(0, step, 1, 8))
        assert set(out.terms) == {"rec"}
        # the term is nn.MSELoss() between the reconstruction and the frozen teacher's last stage map
        if step == 0:
            with torch.no_grad():
                f_t = t_tap(batch.x).stages[-1]
            assert out.terms["rec"].item() == pytest.approx(F.mse_loss(model(f_t)[1], f_t).item(), rel=1e-5)
        opt.zero_grad()
        out.terms["rec"].backward()
        opt.step()
        losses.append(out.terms["rec"].item())
    assert losses[-1] < losses[0]
    for before, module in ((teacher_before, teacher), (student_before, student), (translator_before, ft.translator)):
        for k, v in module.state_dict().items():
            assert torch.equal(v, before[k]), k
    assert any(not torch.equal(v, paraphraser_before[k]) for k, v in ft.paraphraser.state_dict().items())
    assert all(p.grad is None for p in [*teacher.parameters(), *student.parameters(), *ft.translator.parameters()])

    # the evaluator: the reconstruction MSE over the validation split, finite, modes restored
    torch.manual_seed(7)
    splits = SimpleNamespace(val=TensorSplit(torch.randn(10, *SHAPE), torch.arange(10)))
    evaluator = stage.evaluator(splits, 3)
    assert isinstance(evaluator, StageLossEvaluator) and evaluator.direction("loss") == "min"
    value = evaluator.evaluate(model)["val"]["loss"]
    assert math.isfinite(value) and value > 0 and model.training
    with torch.no_grad():
        f_t = t_tap(splits.val.x).stages[-1]
        assert value == pytest.approx(F.mse_loss(model(f_t)[1], f_t).item(), rel=1e-5)

    # finish: frozen, eval mode, and kept so when the objective trains; only the translator trains next
    stage.finish()
    model.zero_grad(set_to_none=True)  # the stage's own gradients
    assert not any(p.requires_grad for p in ft.paraphraser.parameters()) and not ft.paraphraser.training
    objective.train()
    assert ft.translator.training and not ft.paraphraser.training
    trained = state(ft.paraphraser)
    student.train()
    params = [p for p in [*student.parameters(), *objective.parameters()] if p.requires_grad]
    assert {id(p) for p in ft.translator.parameters()} <= {id(p) for p in params}
    assert not {id(p) for p in ft.paraphraser.parameters()} & {id(p) for p in params}
    opt = torch.optim.SGD(params, lr=0.05, weight_decay=5e-4)
    y = torch.arange(4)
    terms = objective(s_tap(batch.x), t_tap(batch.x), Batch(batch.x, y, torch.arange(4)), P)
    assert set(terms) == {"ce", "ft"}
    opt.zero_grad()
    sum(terms.values()).backward()
    opt.step()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ft.translator.parameters())
    assert all(p.grad is None for p in ft.paraphraser.parameters())
    for k, v in ft.paraphraser.state_dict().items():
        assert torch.equal(v, trained[k]), k


# ----------------------------------------------------------------------------- through the kd recipe

IMAGES = {"shape": [3, 8, 8], "num_classes": 4, "n_train": 80, "n_test": 20}


def test_kd_recipe_runs_the_paraphraser_stage_and_reuses_it(tiny, monkeypatch):
    from teachkit.engine import load_checkpoint
    from teachkit.recipes import distill

    cfg = tiny(name="ft", data={"options": IMAGES, "batch_size": 16}, model={"name": "resnet8", "options": {}},
               train={"epochs": 1, "progress": False}, teacher={"model": {"name": "resnet8", "options": {}},
                                                                 "epochs": 1},
               kd={"method": "ft", "options": {"ft": {"init_epochs": 1}}})
    result = distill(cfg)
    stage_dir = result.run_dir / PARAPHRASER_STAGE
    assert (stage_dir / "summary.json").is_file() and (result.run_dir / "summary.json").is_file()
    stage_record = json.loads((stage_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(stage_record["train"]["rec"]) and math.isfinite(stage_record["val"]["loss"])
    record = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"ce", "ft"} <= set(record["train"]) and all(math.isfinite(v) for v in record["train"].values())
    # the student ran with the trained paraphraser, frozen: its copy in the student checkpoint is the stage's
    stage_tensors, _ = load_checkpoint(stage_dir / "checkpoints" / "last.safetensors")
    student_tensors, _ = load_checkpoint(result.run_dir / "checkpoints" / "last.safetensors")
    prefix = "objective/methods.ft.paraphraser."
    copied = {k[len(prefix):]: v for k, v in student_tensors.items() if k.startswith(prefix)}
    stage_model = {k[len("model/"):]: v for k, v in stage_tensors.items() if k.startswith("model/")}
    assert copied and copied.keys() == stage_model.keys()
    assert all(torch.equal(copied[k], stage_model[k]) for k in copied)
    # a resumed rerun loads the finished stage instead of training it again
    monkeypatch.setattr(FactorTransfer, "reconstruction_loss",
                        lambda *a: pytest.fail("a finished paraphraser stage was retrained"))
    again = distill(cfg, resume=True)
    assert again.run_dir == result.run_dir
