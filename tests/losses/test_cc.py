import pytest
import torch
from torch import nn

from teachkit.errors import ConfigError
from teachkit.losses import Progress
from teachkit.losses.cc import CCOptions, CorrelationCongruence
from teachkit.models import Tapped
from teachkit.types import Batch, Taps

from .helpers import make_pair, one_step

P = Progress(0, 0, 1, 1)
BATCH = Batch(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), torch.arange(3))


def emb(e):
    return Taps(torch.zeros(e.shape[0], 2), embedding=e)


def test_cc_hand_computed_repdistiller_form():
    # identity embeddings; e_s - e_t = [[-1,2],[2,-1],[1,1]], so delta = [[1,2],[2,1],[1,1]] (abs drops signs):
    # consecutive rows: (1*2 + 2*1) = 4 and (2*1 + 1*1) = 3; mean over the 2 pairs = 3.5
    s = torch.tensor([[0.0, 3.0], [3.0, 0.0], [2.0, 2.0]], requires_grad=True)
    t = torch.ones(3, 2, requires_grad=True)
    loss = CorrelationCongruence(emb(s), emb(t), CCOptions(feat_dim=2))
    with torch.no_grad():
        for lin in (loss.embed_s, loss.embed_t):
            lin.weight.copy_(torch.eye(2))
            lin.bias.zero_()
    out = loss(emb(s), emb(t), BATCH, P)
    assert set(out) == {"cc"}
    assert out["cc"].item() == pytest.approx(3.5, abs=1e-6)
    out["cc"].backward()
    assert s.grad.abs().sum() > 0 and t.grad is None
    assert loss.embed_t.weight.grad.abs().sum() > 0
    # a batch of one has no consecutive pair: 0, not NaN
    one = loss(emb(s[:1]), emb(t[:1]), BATCH, P)["cc"]
    assert one.item() == 0.0


def test_cc_embeddings_sized_from_probes():
    student, teacher = make_pair("mlp", "resnet20", student_opts={"hidden": [24]}, teacher_opts={"width": 2})
    with Tapped(student, want=("embedding",)) as s, Tapped(teacher, want=("embedding",)) as t, torch.no_grad():
        x = torch.randn(2, 3, 32, 32)
        ps, pt = s(x), t(x)
    loss = CorrelationCongruence(ps, pt)
    assert loss.embed_s.in_features == ps.embedding.shape[1] == 24
    assert loss.embed_t.in_features == pt.embedding.shape[1] == 128
    assert loss.embed_s.out_features == loss.embed_t.out_features == 128


def test_cc_cross_family_step_trains_both_embeddings():
    student, teacher = make_pair("mlp", "resnet20", student_opts={"hidden": [32]})
    terms, objective, teacher = one_step("cc", student, teacher)
    assert set(terms) == {"ce", "cc"} and all(torch.isfinite(v) for v in terms.values())
    assert objective.weights["cc"] == 0.02
    aux = list(objective.methods["cc"].parameters())
    assert len(aux) == 4 and all(p.grad is not None and p.grad.abs().sum() > 0 for p in aux)


def test_cc_missing_embedding_tap_and_bad_option():
    _, teacher = make_pair("resnet8", "resnet20")
    plain = nn.Sequential(nn.Conv2d(3, 10, 32), nn.Flatten())  # no nn.Linear: no embedding tap to infer
    with pytest.raises(ConfigError, match="'embedding'"):
        one_step("cc", plain, teacher)
    with pytest.raises(ConfigError, match="'cc' needs the student's 'embedding' tap"):
        CorrelationCongruence(Taps(torch.zeros(2, 10)), emb(torch.zeros(2, 3)))
    with pytest.raises(ConfigError, match="feat_dim"):
        CorrelationCongruence(emb(torch.zeros(2, 3)), emb(torch.zeros(2, 3)), CCOptions(feat_dim=0))
