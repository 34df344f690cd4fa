"""Logit standardisation (Sun et al. CVPR 2024) on kd and dkd: equal to the authors' code, values and
input gradients, float64; invariance; and the trajectory recipes' switch."""

import json

import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import Progress, build_objective
from teachkit.losses.logit_standardization import standardize_logits
from teachkit.types import Batch, Taps


def _reference_normalize(logit):
    """TRANSCRIPTION of ``normalize`` in sunshangquan/logit-standardization-KD mdistiller/distillers/KD.py."""
    mean = logit.mean(dim=-1, keepdims=True)
    stdv = logit.std(dim=-1, keepdims=True)
    return (logit - mean) / (1e-7 + stdv)


def _reference_kd_loss(logits_student_in, logits_teacher_in, temperature, logit_stand):
    """TRANSCRIPTION of ``kd_loss`` in the same file (cross-check only)."""
    logits_student = _reference_normalize(logits_student_in) if logit_stand else logits_student_in
    logits_teacher = _reference_normalize(logits_teacher_in) if logit_stand else logits_teacher_in
    log_pred_student = F.log_softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    loss_kd = F.kl_div(log_pred_student, pred_teacher, reduction="none").sum(1).mean()
    return loss_kd * temperature**2


def _reference_dkd_loss(logits_student_in, logits_teacher_in, target, alpha, beta, temperature, logit_stand):
    """TRANSCRIPTION of ``dkd_loss`` in mdistiller/distillers/DKD.py of the same repository."""
    logits_student = _reference_normalize(logits_student_in) if logit_stand else logits_student_in
    logits_teacher = _reference_normalize(logits_teacher_in) if logit_stand else logits_teacher_in
    gt_mask = torch.zeros_like(logits_student).scatter_(1, target.unsqueeze(1), 1).bool()
    other_mask = torch.ones_like(logits_student).scatter_(1, target.unsqueeze(1), 0).bool()

    def cat_mask(t):
        return torch.cat([(t * gt_mask).sum(1, keepdims=True), (t * other_mask).sum(1, keepdims=True)], dim=1)

    pred_student = cat_mask(F.softmax(logits_student / temperature, dim=1))
    pred_teacher = cat_mask(F.softmax(logits_teacher / temperature, dim=1))
    tckd = F.kl_div(torch.log(pred_student), pred_teacher, reduction="sum") * temperature**2 / target.shape[0]
    pt2 = F.softmax(logits_teacher / temperature - 1000.0 * gt_mask, dim=1)
    lps2 = F.log_softmax(logits_student / temperature - 1000.0 * gt_mask, dim=1)
    nckd = F.kl_div(lps2, pt2, reduction="sum") * temperature**2 / target.shape[0]
    return alpha * tckd + beta * nckd


def _student_and_teacher(seed=0, n=8, c=10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, c, dtype=torch.float64, generator=g)
    zt = 5 * torch.randn(n, c, dtype=torch.float64, generator=g) + 3
    y = torch.randint(0, c, (n,), generator=g)
    return x, w, zt, y


def test_standardize_hand_computed_and_invariant():
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)  # mean 2, unbiased std 1
    expected = torch.tensor([[-1.0, 0.0, 1.0]], dtype=torch.float64) / (1 + 1e-7)
    torch.testing.assert_close(standardize_logits(z), expected)
    zz = torch.randn(4, 7, dtype=torch.float64)
    torch.testing.assert_close(standardize_logits(3.5 * zz - 2.0), standardize_logits(zz), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_kd_with_standardisation_matches_the_authors_code(temperature):
    x, w, zt, y = _student_and_teacher()
    objective = build_objective("kd", Taps(zt), Taps(zt), num_classes=10, num_samples=8, gamma={"kd": 1.0},
                                ce_weight=0.0, options={"kd": {"temperature": temperature, "logit_standardize": True}})
    batch = Batch(torch.zeros(8, 1), y, None)
    ours = objective(Taps(x @ w), Taps(zt), batch, Progress(0, 0, 1, 1))["kd"]
    ref = _reference_kd_loss(x @ w, zt, temperature, True)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0], rtol=1e-8, atol=1e-12)
    # the switch matters: without it the value is the plain KD
    plain = _reference_kd_loss(x @ w, zt, temperature, False)
    assert abs(plain.item() - ref.item()) > 1e-3


@pytest.mark.parametrize("stand", [False, True])
def test_dkd_with_standardisation_matches_the_authors_code(stand):
    x, w, zt, y = _student_and_teacher(1)
    opts = {"alpha": 9.0, "beta": 72.0, "temperature": 2.0, "warmup": 0, "logit_standardize": stand}
    objective = build_objective("dkd", Taps(zt), Taps(zt), num_classes=10, num_samples=8, ce_weight=0.0,
                                options={"dkd": opts})
    terms = objective(Taps(x @ w), Taps(zt), Batch(torch.zeros(8, 1), y, None), Progress(0, 0, 1, 1))
    ours = terms["dkd.tckd"] + terms["dkd.nckd"]
    ref = _reference_dkd_loss(x @ w, zt, y, 9.0, 72.0, 2.0, stand)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0], rtol=1e-7, atol=1e-12)


def test_standardised_kd_ignores_the_teachers_logit_scale():
    x, w, zt, y = _student_and_teacher(2)
    objective = build_objective("kd", Taps(zt), Taps(zt), num_classes=10, num_samples=8,
                                options={"kd": {"logit_standardize": True}})
    batch, p = Batch(torch.zeros(8, 1), y, None), Progress(0, 0, 1, 1)
    a = objective(Taps(x @ w), Taps(zt), batch, p)["kd"]
    b = objective(Taps(x @ w), Taps(0.1 * zt + 7), batch, p)["kd"]
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_one_class_cannot_be_standardised():
    z = torch.zeros(2, 1)
    with pytest.raises(ConfigError, match="logit_standardize=true needs at least 2 classes"):
        build_objective("kd", Taps(z), Taps(z), num_classes=1, num_samples=2,
                        options={"kd": {"logit_standardize": True}})


def test_prokd_switch_changes_the_run_and_logs_the_same_terms(tiny):
    from teachkit.recipes import RECIPES

    def run(name, stand):
        cfg = tiny(name=name, train={"epochs": 4, "progress": False}, teacher={"epochs": 3},
                   prokd={"tau_max": 3, "logit_standardize": stand, "loss": "kl"})
        return RECIPES.get("prokd")(cfg)

    plain, stand = run("plain", False), run("stand", True)
    first = [json.loads((r.run_dir / "metrics.jsonl").read_text().splitlines()[0])["train"] for r in (plain, stand)]
    assert set(first[0]) == set(first[1]) == {"prokd", "loss"}
    assert first[0]["prokd"] != first[1]["prokd"]
    assert all(torch.isfinite(p).all() for p in stand.model.parameters())
