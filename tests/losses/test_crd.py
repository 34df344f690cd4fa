import copy
import math

import pytest
import torch
import torch.nn.functional as F

from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.errors import ConfigError
from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.crd import CRD, CRDOptions, nce_loss
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)


def _taps(n: int, dim: int, seed: int) -> Taps:
    g = torch.Generator().manual_seed(seed)
    return Taps(torch.zeros(n, 2), embedding=torch.randn(n, dim, generator=g))


def _crd(num_samples: int = 4, **opts) -> CRD:
    torch.manual_seed(0)
    return CRD(_taps(2, 5, 1), _taps(2, 6, 2), CRDOptions(**opts), num_classes=2, num_samples=num_samples)


def _batch(index: list[int]) -> Batch:
    return Batch(torch.zeros(len(index), 1), torch.zeros(len(index), dtype=torch.long), torch.tensor(index))


def test_defaults_buffers_and_state_dict():
    cls = LOSSES.get("crd")
    assert cls is CRD and cls.default_weight == 0.8
    assert cls.student_needs == cls.teacher_needs == ("embedding",) and cls.term_names == ("student", "teacher")
    loss = _crd(num_samples=100000)
    assert (loss.feat_dim, loss.nce_k, loss.nce_t, loss.nce_m) == (128, 16384, 0.07, 0.5)
    keys = set(loss.state_dict())
    assert {"memory_s", "memory_t", "z_s", "z_t", "embed_s.linear.weight", "embed_t.linear.weight"} <= keys
    assert loss.memory_s.shape == (100000, 128) and loss.z_s.item() == -1
    stdv = 1 / math.sqrt(128 / 3)
    assert loss.memory_t.abs().max() <= stdv and loss.memory_t.std() == pytest.approx(stdv / math.sqrt(3), rel=0.02)
    # checkpointed through the objective (the engine saves its state_dict())
    d = build_objective("crd", _taps(2, 5, 1), _taps(2, 6, 2), num_classes=2, num_samples=10)
    assert {"methods.crd.memory_s", "methods.crd.memory_t", "methods.crd.z_s"} <= set(d.state_dict())
    assert d.weights == {"crd": 0.8}


def test_nce_k_capped_at_other_samples():
    assert _crd(num_samples=64).nce_k == 63
    assert _crd(num_samples=64, nce_k=10).nce_k == 10


def test_positive_first_negatives_uniform_over_others():
    loss = _crd(num_samples=5)  # K = 4
    index = torch.tensor([0, 2, 4])
    torch.manual_seed(1)
    idx = torch.cat([loss.sample_indices(index) for _ in range(300)])
    own = index.repeat(300)
    assert idx.shape == (900, 5) and torch.equal(idx[:, 0], own)
    neg = idx[:, 1:]
    assert (neg != own[:, None]).all() and neg.min() >= 0 and neg.max() < 5
    counts = torch.stack([torch.bincount(neg[own == i].flatten(), minlength=5) for i in index])
    assert (counts[torch.arange(3), index] == 0).all()
    others = counts[counts > 0].float()
    assert others.numel() == 12 and (others / 300).sub(1).abs().max() < 0.2  # 1200 draws / 4 others each


def test_memory_update_rule():
    loss = _crd(num_samples=4, feat_dim=3, nce_k=2, nce_m=0.3)
    s, t = _taps(2, 5, 3), _taps(2, 6, 4)
    old_s, old_t = loss.memory_s.clone(), loss.memory_t.clone()
    with torch.no_grad():
        v_s, v_t = loss.embed_s(s.embedding), loss.embed_t(t.embedding)
    loss(s, t, _batch([1, 2]), P)
    for mem, old, v in ((loss.memory_s, old_s, v_s), (loss.memory_t, old_t, v_t)):
        expect = F.normalize(0.3 * old[[1, 2]] + 0.7 * v, dim=1)
        torch.testing.assert_close(mem[[1, 2]], expect)
        torch.testing.assert_close(mem[[0, 3]], old[[0, 3]])
        assert mem[[1, 2]].norm(dim=1).sub(1).abs().max() < 1e-6


def test_normalisation_constant_set_once():
    loss = _crd(num_samples=8, feat_dim=4, nce_k=3)
    torch.manual_seed(0)
    out = loss(_taps(2, 5, 3), _taps(2, 6, 4), _batch([0, 1]), P)
    z_s, z_t = loss.z_s.item(), loss.z_t.item()
    assert z_s > 0 and z_t > 0 and all(torch.isfinite(v) for v in out.values())
    loss(_taps(2, 5, 5), _taps(2, 6, 6), _batch([2, 3]), P)
    assert (loss.z_s.item(), loss.z_t.item()) == (z_s, z_t)


def test_nce_loss_matches_reference_formula():
    torch.manual_seed(0)
    p = torch.rand(3, 5) * 0.1 + 1e-3  # P = h(v, m): positive then K = 4 negatives
    n_data = 20
    c = 4 / n_data
    ref = -(torch.log(p[:, 0] / (p[:, 0] + c + 1e-7)).sum() + torch.log(c / (p[:, 1:] + c + 1e-7)).sum()) / 3
    assert nce_loss(p.log(), n_data).item() == pytest.approx(ref.item(), rel=1e-5)


def test_gather_and_full_score_paths_agree():
    a = _crd(num_samples=16, feat_dim=4, nce_k=5)
    b = copy.deepcopy(a)
    b.full_scores = not a.full_scores
    s, t = _taps(3, 5, 3), _taps(3, 6, 4)
    s.embedding.requires_grad_(True)
    results = []
    for loss in (a, b):
        torch.manual_seed(7)
        out = loss(s, t, _batch([3, 9, 15]), P)
        grad, = torch.autograd.grad(sum(out.values()), s.embedding)
        results.append((out, grad, loss.memory_s.clone()))
    (oa, ga, ma), (ob, gb, mb) = results
    for k in oa:
        torch.testing.assert_close(oa[k], ob[k])
    torch.testing.assert_close(ga, gb)
    torch.testing.assert_close(ma, mb)


def test_resume_from_checkpoint_is_exact(tmp_path):
    a = _crd(num_samples=16, feat_dim=4, nce_k=5)
    a(_taps(2, 5, 3), _taps(2, 6, 4), _batch([0, 1]), P)
    save_checkpoint(tmp_path / "last.safetensors", a.state_dict(), {})
    b = _crd(num_samples=16, feat_dim=4, nce_k=5)
    torch.manual_seed(123)
    b.memory_s.uniform_()  # differs before loading
    b.load_state_dict(load_checkpoint(tmp_path / "last.safetensors")[0])
    assert b.z_s.item() == a.z_s.item() > 0
    outs = []
    for loss in (a, b):
        torch.manual_seed(5)
        outs.append(loss(_taps(2, 5, 8), _taps(2, 6, 9), _batch([4, 5]), P))
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    assert torch.equal(a.memory_s, b.memory_s) and torch.equal(a.memory_t, b.memory_t)


def test_loss_decreases_on_separable_embeddings():
    # every sample has its own teacher feature; the student's is a fixed linear map of it plus noise,
    # so linear embeddings can align each sample with itself and away from the others
    torch.manual_seed(0)
    n = 32
    t_emb = torch.randn(n, 12)
    s_emb = t_emb @ torch.randn(12, 10) + 0.05 * torch.randn(n, 10)
    loss = CRD(Taps(torch.zeros(2, 2), s_emb[:2]), Taps(torch.zeros(2, 2), t_emb[:2]),
               CRDOptions(feat_dim=16, nce_k=8), num_samples=n)
    opt = torch.optim.SGD(loss.parameters(), lr=0.5, momentum=0.9)
    batch = Batch(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), torch.arange(n))
    history = []
    for _ in range(40):
        out = loss(Taps(torch.zeros(n, 2), s_emb), Taps(torch.zeros(n, 2), t_emb), batch, P)
        total = out["student"] + out["teacher"]
        assert torch.isfinite(total)
        opt.zero_grad()
        total.backward()
        opt.step()
        history.append(total.item())
    mean = [sum(history[i:i + 10]) / 10 for i in (0, 10, 20, 30)]
    assert mean[3] < mean[2] < mean[1] < mean[0] and mean[3] < 0.5 * mean[0], history


def test_config_errors():
    loss = _crd(num_samples=4, feat_dim=3, nce_k=2)
    s, t = _taps(2, 5, 3), _taps(2, 6, 4)
    with pytest.raises(ConfigError, match=r"^crd needs the dataset index of every sample"):
        loss(s, t, Batch(torch.zeros(2, 1), torch.zeros(2), None), P)
    with pytest.raises(ConfigError, match=r"crd needs the dataset index of every sample in \[0, 4\)"):
        loss(s, t, _batch([1, 4]), P)
    with pytest.raises(ConfigError, match=r"crd needs the dataset index of every sample in \[0, 4\)"):
        loss(s, t, _batch([-1, 0]), P)
    with pytest.raises(ConfigError, match="must be 2 integers"):
        loss(s, t, _batch([0, 1, 2]), P)
    with pytest.raises(ConfigError, match="'embedding' tap"):
        CRD(Taps(torch.zeros(2, 2)), t, num_samples=4)
    with pytest.raises(ConfigError, match="at least 2 samples"):
        CRD(s, t, num_samples=1)
    for key, value, message in (("nce_t", 0, r"nce_t=0.0 is out of range: must be > 0"),
                                ("nce_m", 1.5, r"nce_m=1.5 is out of range: must be >= 0.0 and <= 1.0"),
                                ("feat_dim", 0, r"feat_dim=0 is out of range: must be >= 1"),
                                ("nce_k", 2.5, r"nce_k=2.5 is not allowed: expected an integer")):
        with pytest.raises(ConfigError, match=rf"^kd.options.crd.{message}"):
            build_objective("crd", s, t, num_classes=2, num_samples=4, options={"crd": {key: value}})


def test_float32_under_bfloat16_autocast():
    loss = _crd(num_samples=8, feat_dim=4, nce_k=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss(_taps(2, 5, 3), _taps(2, 6, 4), _batch([0, 1]), P)
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in out.values())
    assert loss.memory_s.dtype == torch.float32


def test_cross_family_step_trains_both_embeddings():
    s, t = make_pair("lenet", "resnet20")
    terms, objective, teacher = one_step("crd", s, t)
    assert set(terms) == {"ce", "crd.student", "crd.teacher"}
    assert all(torch.isfinite(v) for v in terms.values())
    crd = objective.methods["crd"]
    assert all(p.grad is not None for p in crd.parameters())
    assert crd.nce_k == 63 and crd.z_s.item() > 0


def test_no_host_sync_after_the_first_call(monkeypatch):
    """Z is set on the device and the index range is checked once: later calls never read a tensor back."""
    loss = _crd(num_samples=16, feat_dim=4, nce_k=5)
    loss(_taps(2, 5, 3), _taps(2, 6, 4), _batch([0, 1]), P)  # first call: one sync for the index range

    def sync(*args, **kwargs):
        raise AssertionError("host sync in CRD's per-step path")

    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    z_before = loss.z_s.clone()
    for step in range(3):
        out = loss(_taps(2, 5, 5 + step), _taps(2, 6, 9 + step), _batch([2 + step, 7]), P)
        sum(out.values()).backward()
    monkeypatch.undo()
    assert torch.equal(loss.z_s, z_before) and all(torch.isfinite(v) for v in out.values())


def test_index_range_is_checked_on_the_first_call_only():
    loss = _crd(num_samples=4, feat_dim=3, nce_k=2)
    s, t = _taps(2, 5, 3), _taps(2, 6, 4)
    with pytest.raises(ConfigError, match=r"in \[0, 4\) \(the bank's size\); got values 1 .. 4"):
        loss(s, t, _batch([1, 4]), P)
    loss(s, t, _batch([1, 3]), P)  # a failed check does not count: this first good call is checked
    assert loss._index_range_checked
    fresh = _crd(num_samples=4, feat_dim=3, nce_k=2)  # e.g. after a resume: checked again
    with pytest.raises(ConfigError, match="got values -1 .. 0"):
        fresh(s, t, _batch([-1, 0]), P)
    # shape and dtype are still checked on every call (metadata, no sync)
    with pytest.raises(ConfigError, match="must be 2 integers"):
        loss(s, t, Batch(torch.zeros(2, 1), torch.zeros(2), torch.tensor([0.0, 1.0])), P)


def test_float64_end_to_end():
    loss = _crd(num_samples=8, feat_dim=4, nce_k=3).double()
    assert loss.memory_s.dtype == loss.z_s.dtype == torch.float64
    s, t = _taps(2, 5, 3), _taps(2, 6, 4)
    s64 = Taps(s.logits.double(), s.embedding.double())
    t64 = Taps(t.logits.double(), t.embedding.double())
    out = loss(s64, t64, _batch([0, 1]), P)
    assert all(v.dtype == torch.float64 and torch.isfinite(v) for v in out.values())
    assert loss.memory_s.dtype == loss.memory_t.dtype == torch.float64 and loss.z_s.item() > 0
