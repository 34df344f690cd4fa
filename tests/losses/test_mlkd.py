import numpy as np
import pytest
import torch
import torch.nn.functional as F

from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, KDConfig, Progress, build_objective
from teachkit.losses.mlkd import (
    MLKD,
    MLKDOptions,
    batch_consistency,
    class_consistency,
    median_mask,
    mlkd_terms,
)
from teachkit.options import from_mapping
from teachkit.types import Batch, Taps
from tests.losses.helpers import make_pair, probe

P = Progress(0, 0, 1, 1)
F64 = torch.float64


def _reference_mlkd(logits_student_weak, logits_student_strong, logits_teacher_weak, logits_teacher_strong,
                    target, temperature, ce_loss_weight, kd_loss_weight, logit_stand=False):
    """THE REFERENCE'S FORMULA, transcribed from the authors' ``KD_ours.forward_train``
    (Jin-Ying/Multi-Level-Logit-Distillation, mdistiller/distillers/KD_ours.py) with the ``logit_stand``
    switch of sunshangquan/logit-standardization-KD mdistiller/distillers/MLKD.py (its ``normalize`` and
    ``kd_loss``). Written inline here only as a cross-check; returns ``losses_dict`` (the trainer sums it)."""
    def normalize(logit):
        mean = logit.mean(dim=-1, keepdims=True)
        stdv = logit.std(dim=-1, keepdims=True)
        return (logit - mean) / (1e-7 + stdv)

    def kd_loss(logits_student_in, logits_teacher_in, temperature, reduce=True, logit_stand=False):
        logits_student = normalize(logits_student_in) if logit_stand else logits_student_in
        logits_teacher = normalize(logits_teacher_in) if logit_stand else logits_teacher_in
        log_pred_student = F.log_softmax(logits_student / temperature, dim=1)
        pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
        loss_kd = F.kl_div(log_pred_student, pred_teacher, reduction="none").sum(1).mean()
        loss_kd *= temperature**2
        return loss_kd

    def cc_loss(logits_student, logits_teacher, temperature, reduce=True):
        batch_size, class_num = logits_teacher.shape
        pred_student = F.softmax(logits_student / temperature, dim=1)
        pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
        student_matrix = torch.mm(pred_student.transpose(1, 0), pred_student)
        teacher_matrix = torch.mm(pred_teacher.transpose(1, 0), pred_teacher)
        return ((teacher_matrix - student_matrix) ** 2).sum() / class_num

    def bc_loss(logits_student, logits_teacher, temperature, reduce=True):
        batch_size, class_num = logits_teacher.shape
        pred_student = F.softmax(logits_student / temperature, dim=1)
        pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
        student_matrix = torch.mm(pred_student, pred_student.transpose(1, 0))
        teacher_matrix = torch.mm(pred_teacher, pred_teacher.transpose(1, 0))
        return ((teacher_matrix - student_matrix) ** 2).sum() / batch_size

    pred_teacher_weak = F.softmax(logits_teacher_weak.detach(), dim=1)
    confidence, pseudo_labels = pred_teacher_weak.max(dim=1)
    confidence = confidence.detach()
    conf_thresh = np.percentile(confidence.cpu().numpy().flatten(), 50)
    mask = confidence.le(conf_thresh).bool()
    class_confidence = torch.sum(pred_teacher_weak, dim=0)
    class_confidence = class_confidence.detach()
    class_confidence_thresh = np.percentile(class_confidence.cpu().numpy().flatten(), 50)
    class_conf_mask = class_confidence.le(class_confidence_thresh).bool()

    kw, T, ls = kd_loss_weight, temperature, logit_stand
    sw, ss, tw, ts = logits_student_weak, logits_student_strong, logits_teacher_weak, logits_teacher_strong
    loss_ce = ce_loss_weight * (F.cross_entropy(sw, target) + F.cross_entropy(ss, target))
    loss_kd_weak = (kw * ((kd_loss(sw, tw, T, logit_stand=ls) * mask).mean())
                    + kw * ((kd_loss(sw, tw, 3.0, logit_stand=ls) * mask).mean())
                    + kw * ((kd_loss(sw, tw, 5.0, logit_stand=ls) * mask).mean())
                    + kw * ((kd_loss(sw, tw, 2.0, logit_stand=ls) * mask).mean())
                    + kw * ((kd_loss(sw, tw, 6.0, logit_stand=ls) * mask).mean()))
    loss_kd_strong = (kw * kd_loss(ss, ts, T, logit_stand=ls) + kw * kd_loss(ss, ts, 3.0, logit_stand=ls)
                      + kw * kd_loss(ss, ts, 5.0, logit_stand=ls) + kw * kd_loss(sw, tw, 2.0, logit_stand=ls)
                      + kw * kd_loss(sw, tw, 6.0, logit_stand=ls))
    loss_cc_weak = (kw * ((cc_loss(sw, tw, T) * class_conf_mask).mean())
                    + kw * ((cc_loss(sw, tw, 3.0) * class_conf_mask).mean())
                    + kw * ((cc_loss(sw, tw, 5.0) * class_conf_mask).mean())
                    + kw * ((cc_loss(sw, tw, 2.0) * class_conf_mask).mean())
                    + kw * ((cc_loss(sw, tw, 6.0) * class_conf_mask).mean()))
    loss_bc_weak = (kw * ((bc_loss(sw, tw, T) * mask).mean()) + kw * ((bc_loss(sw, tw, 3.0) * mask).mean())
                    + kw * ((bc_loss(sw, tw, 5.0) * mask).mean()) + kw * ((bc_loss(sw, tw, 2.0) * mask).mean())
                    + kw * ((bc_loss(sw, tw, 6.0) * mask).mean()))
    # loss_cc_strong / loss_bc_strong are computed by the reference but not returned: omitted
    return {"loss_ce": loss_ce, "loss_kd": loss_kd_weak + loss_kd_strong, "loss_cc": loss_cc_weak,
            "loss_bc": loss_bc_weak}


def _logits(b, c, seed):
    g = torch.Generator().manual_seed(seed)
    return [3 * torch.randn(b, c, generator=g, dtype=F64) for _ in range(4)]


def _loss(options=None, classes=10):
    taps = Taps(torch.zeros(2, classes))
    return MLKD(taps, taps, options, num_classes=classes)


# --- the reference, values and gradients --------------------------------------------------------------------


@pytest.mark.parametrize(("b", "temperature", "ce_w", "kd_w", "ls"),
                         [(8, 4.0, 0.1, 0.9, False), (7, 4.0, 0.1, 0.9, False), (8, 2.0, 0.1, 9.0, True),
                          (5, 1.5, 0.7, 2.0, True), (1, 4.0, 0.1, 0.9, False)])
def test_matches_the_reference_values_and_gradients(b, temperature, ce_w, kd_w, ls):
    sw, ss, tw, ts = _logits(b, 10, seed=b + int(ls))
    y = torch.arange(b) % 10
    s = torch.cat([sw, ss]).requires_grad_(True)
    loss = _loss(MLKDOptions(temperature=temperature, ce_weight=ce_w, kd_weight=kd_w, logit_standardize=ls))
    terms = loss(Taps(s), Taps(torch.cat([tw, ts])), Batch(None, y, torch.arange(b)), P)
    assert set(terms) == {"ce", "kd", "cc", "bc"} and all(v.dtype == F64 for v in terms.values())
    ours = sum(loss.term_weights[k] * v for k, v in terms.items())

    s_ref = s.detach().clone().requires_grad_(True)
    ref = _reference_mlkd(s_ref[:b], s_ref[b:], tw, ts, y, temperature, ce_w, kd_w, ls)
    total = sum(v.mean() for v in ref.values())  # the reference trainer's sum
    for ours_key, ref_key in (("ce", "loss_ce"), ("kd", "loss_kd"), ("cc", "loss_cc"), ("bc", "loss_bc")):
        torch.testing.assert_close(loss.term_weights[ours_key] * terms[ours_key], ref[ref_key], rtol=1e-5, atol=0)
    torch.testing.assert_close(ours, total, rtol=1e-5, atol=0)
    (g_ours,) = torch.autograd.grad(ours, s)
    (g_ref,) = torch.autograd.grad(total, s_ref)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-12)
    assert g_ours[b:].abs().sum() > 0  # the strong rows train too


def test_objective_total_equals_the_reference_sum():
    b, c = 6, 5
    sw, ss, tw, ts = _logits(b, c, seed=3)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    taps = Taps(torch.zeros(2, c, dtype=F64))
    objective = build_objective("mlkd", taps, taps, num_classes=c, num_samples=10)
    logged = objective(Taps(torch.cat([sw, ss])), Taps(torch.cat([tw, ts])), Batch(None, y, torch.arange(b)), P)
    assert set(logged) == {"mlkd.ce", "mlkd.kd", "mlkd.cc", "mlkd.bc"}  # no CE of the objective's own
    ref = _reference_mlkd(sw, ss, tw, ts, y, 4.0, 0.1, 0.9)
    torch.testing.assert_close(sum(logged.values()), sum(ref.values()), rtol=1e-5, atol=0)


def test_strong_class_and_batch_levels_do_not_count():
    """The reference computes loss_cc_strong / loss_bc_strong but does not return them: cc and bc read only
    the weak rows; the strong rows reach ce and kd."""
    sw, ss, tw, ts = _logits(4, 6, seed=5)
    sw, ss = sw.clone().requires_grad_(True), ss.clone().requires_grad_(True)
    terms = mlkd_terms(sw, ss, tw, ts, torch.arange(4), 4.0)
    for name in ("cc", "bc"):
        g_weak, g_strong = torch.autograd.grad(terms[name], [sw, ss], allow_unused=True, retain_graph=True)
        assert g_strong is None and g_weak.abs().sum() > 0
    for name in ("ce", "kd"):
        assert torch.autograd.grad(terms[name], ss, retain_graph=True)[0].abs().sum() > 0


def test_weak_logits_in_the_strong_sum_quirk():
    """kd = frac * sum_T kd_w(T) + [kd_s(T), kd_s(3), kd_s(5), kd_w(2), kd_w(6)]: with identical student and
    teacher strong logits the strong part is exactly the two weak terms."""
    sw, _, tw, ts = _logits(4, 6, seed=9)
    terms = mlkd_terms(sw, ts, tw, ts, torch.arange(4), 4.0)

    def kd(s, t, temp):
        return temp**2 * F.kl_div(F.log_softmax(s / temp, 1), F.softmax(t / temp, 1), reduction="batchmean")

    frac = median_mask(F.softmax(tw, 1).max(1).values).double().mean()
    expected = frac * sum(kd(sw, tw, t) for t in (4.0, 3.0, 5.0, 2.0, 6.0)) + kd(sw, tw, 2.0) + kd(sw, tw, 6.0)
    torch.testing.assert_close(terms["kd"], expected, rtol=1e-10, atol=0)


# --- hand-computed cases -----------------------------------------------------------------------------------

# B = 3 samples, C = 2 classes, T = 1, logits = log-probabilities:
#   P_t = [[3/4, 1/4], [1/4, 3/4], [1/2, 1/2]],   P_s = [[1/2, 1/2]] * 3
# class level: P_t^T P_t = [[9+1+4, 3+3+4], [10, 1+9+4]] / 16 = [[7/8, 5/8], [5/8, 7/8]];
#   P_s^T P_s = [[3/4, 3/4], [3/4, 3/4]]; difference [[1/8, -1/8], [-1/8, 1/8]], squares 4/64 = 1/16;
#   / C = 2  ->  cc = 1/32.
# batch level: P_t P_t^T = [[10, 6, 8], [6, 10, 8], [8, 8, 8]] / 16, P_s P_s^T = 8/16 everywhere;
#   difference [[2, -2, 0], [-2, 2, 0], [0, 0, 0]] / 16, squares 16/256 = 1/16; / B = 3  ->  bc = 1/48.
PT = [[3 / 4, 1 / 4], [1 / 4, 3 / 4], [1 / 2, 1 / 2]]
PS = [[1 / 2, 1 / 2]] * 3


def test_class_and_batch_consistency_hand_computed():
    zs, zt = torch.tensor(PS, dtype=F64).log(), torch.tensor(PT, dtype=F64).log()
    assert class_consistency(zs, zt, 1.0).item() == pytest.approx(1 / 32, abs=1e-14)
    assert batch_consistency(zs, zt, 1.0).item() == pytest.approx(1 / 48, abs=1e-14)
    # T = 2 on doubled logits gives the same probabilities (no T^2 factor at these levels)
    assert class_consistency(2 * zs, 2 * zt, 2.0).item() == pytest.approx(1 / 32, abs=1e-14)
    assert batch_consistency(zs, zs, 1.0).item() == 0.0


def test_median_masks_hand_computed():
    # 4 values: the median interpolates 0.7 and 0.8 -> 0.75; 0.6 and 0.7 are kept (fraction 1/2)
    v = torch.tensor([0.9, 0.6, 0.7, 0.8], dtype=F64)
    assert median_mask(v).tolist() == [False, True, True, False]
    # 3 values: the median is the middle one, kept (fraction 2/3); ties are all kept
    assert median_mask(torch.tensor([0.9, 0.6, 0.7])).tolist() == [False, True, True]
    assert median_mask(torch.tensor([0.5, 0.5, 0.5, 0.9])).tolist() == [True, True, True, False]
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 64):
        x = torch.rand(n, generator=g, dtype=F64)
        assert median_mask(x).tolist() == (x.numpy() <= np.percentile(x.numpy(), 50)).tolist()


def test_full_terms_hand_computed():
    """The hand-computed P_t / P_s through mlkd_terms with T = 1 replaced by T in (1, 3, 5, 2, 6): the teacher
    confidences are (3/4, 3/4, 1/2) (median 3/4: all three kept, fraction 1) and the class sums (3/2, 3/2)
    (fraction 1), so cc = sum_T cc(T) and bc = sum_T bc(T) unscaled; at T = 1 they are 1/32 and 1/48."""
    zs, zt = torch.tensor(PS, dtype=F64).log(), torch.tensor(PT, dtype=F64).log()
    terms = mlkd_terms(zs, zs, zt, zt, torch.tensor([0, 1, 0]), 1.0)
    temps = (1.0, 3.0, 5.0, 2.0, 6.0)
    assert terms["cc"].item() == pytest.approx(sum(class_consistency(zs, zt, t).item() for t in temps), rel=1e-12)
    assert terms["bc"].item() == pytest.approx(sum(batch_consistency(zs, zt, t).item() for t in temps), rel=1e-12)
    assert class_consistency(zs, zt, 1.0).item() == pytest.approx(1 / 32)
    # CE of uniform predictions on 2 classes: log 2 per view
    assert terms["ce"].item() == pytest.approx(2 * np.log(2), rel=1e-12)


# --- views ------------------------------------------------------------------------------------------------------


def test_transform_batch_weak_first_then_strong_reproducible_and_resumable():
    x = torch.randn(4, 3, 8, 8)
    batch = Batch(x, torch.tensor([0, 1, 2, 3]), torch.tensor([5, 9, 2, 7]))
    a, b = _loss(), _loss()
    seen = a.transform_batch(batch)
    assert seen.x.shape == (8, 3, 8, 8) and torch.equal(seen.x[:4], x)
    assert seen.y is batch.y and seen.index is batch.index
    assert not torch.equal(seen.x[4:], x)
    assert torch.equal(b.transform_batch(batch).x, seen.x)  # same seed, ids and counter -> same view
    assert int(a.views_drawn) == 1 and "views_drawn" in a.state_dict()
    state = {k: v.clone() for k, v in a.state_dict().items()}
    second = a.transform_batch(batch).x
    assert not torch.equal(second[4:], seen.x[4:])  # a new view next epoch
    c = _loss()
    c.load_state_dict(state)  # resume: the counter comes back with the objective
    assert torch.equal(c.transform_batch(batch).x, second)
    other_ids = _loss().transform_batch(Batch(x, batch.y, torch.tensor([1, 2, 3, 4]))).x
    assert not torch.equal(other_ids, seen.x)
    other_seed = _loss(MLKDOptions(seed=1)).transform_batch(batch).x
    assert not torch.equal(other_seed, seen.x)
    no_index = [_loss().transform_batch(Batch(x, batch.y, None)).x for _ in range(2)]
    assert torch.equal(no_index[0], no_index[1]) and no_index[0].shape == (8, 3, 8, 8)


def test_one_channel_views():
    seen = _loss().transform_batch(Batch(torch.randn(3, 1, 6, 6), torch.zeros(3, dtype=torch.long),
                                         torch.arange(3)))
    assert seen.x.shape == (6, 1, 6, 6) and torch.isfinite(seen.x).all()


# --- options and bad input ----------------------------------------------------------------------------------------


def test_defaults_are_the_reference_config_and_registration():
    opts = MLKDOptions()
    assert (opts.temperature, opts.ce_weight, opts.kd_weight, opts.logit_standardize) == (4.0, 0.1, 0.9, False)
    assert _loss().term_weights == {"ce": 0.1, "kd": 0.9, "cc": 0.9, "bc": 0.9}
    assert LOSSES.get("mlkd") is MLKD and MLKD.replaces_ce and MLKD.default_weight == 1.0
    cfg = from_mapping(KDConfig, {"method": "mlkd", "options": {"mlkd": {"logit_standardize": True,
                                                                          "temperature": 2, "kd_weight": 9}}}, "kd")
    ls = cfg.options["mlkd"]
    assert (ls.temperature, ls.kd_weight, ls.logit_standardize) == (2.0, 9.0, True)


def _rows(loss, n_student, b):
    loss(Taps(torch.zeros(n_student, 10)), Taps(torch.zeros(n_student, 10)),
         Batch(None, torch.zeros(b, dtype=torch.long), torch.arange(b)), P)


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: MLKD(Taps(torch.zeros(2, 1)), Taps(torch.zeros(2, 1)), MLKDOptions(logit_standardize=True),
                  num_classes=1), ConfigError, r"logit_standardize=true needs at least 2 classes"),
    (lambda: MLKD(Taps(torch.zeros(2, 5, 7)), Taps(torch.zeros(2, 7)), num_classes=7), ConfigError,
     r"mlkd needs \(batch, classes\) logits; the student's are shaped \(2, 5, 7\)"),
    (lambda: _loss().transform_batch(Batch(torch.zeros(4, 10), torch.zeros(4), torch.arange(4))), ConfigError,
     r"mlkd makes strong views of images: inputs must be float \(batch, C, H, W\), got \(4, 10\)"),
    (lambda: _rows(_loss(), 8, 8), ValueError, r"mlkd expects 2B rows .* for 8 labels, got 8 student"),
    (lambda: _rows(_loss(), 12, 4), ValueError, r"mlkd expects 2B rows .* for 4 labels, got 12 student"),
])
def test_bad_input_is_a_clear_error(make, error, match):
    with pytest.raises(error, match=match):
        make()


# --- one training step on real zoo models --------------------------------------------------------------------------


def test_one_step_on_tiny_models_with_the_2b_batch():
    shape, classes, b = (3, 16, 16), 10, 8
    student, teacher = make_pair("resnet8", "resnet14", shape=shape, classes=classes)
    x = torch.randn(b, *shape)
    s_tap, t_tap, s_probe, t_probe = probe(student, teacher, "mlkd", x=x[:2])
    student.train()
    objective = build_objective("mlkd", s_probe, t_probe, num_classes=classes, num_samples=64)
    seen = objective.transform_batch(Batch(x, torch.arange(b) % classes, torch.arange(b)))
    assert seen.x.shape[0] == 2 * b
    before = [p.detach().clone() for p in student.parameters()]
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    terms = objective(s_tap(seen.x), t_tap(seen.x), seen, P)
    assert set(terms) == {"mlkd.ce", "mlkd.kd", "mlkd.cc", "mlkd.bc"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in terms.values())
    opt.zero_grad()
    sum(terms.values()).backward()
    opt.step()
    assert any(not torch.equal(p, q) for p, q in zip(student.parameters(), before, strict=True))
    assert all(p.grad is None for p in teacher.parameters())
