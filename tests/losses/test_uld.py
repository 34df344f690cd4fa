"""Universal Logit Distillation (teachkit.losses.uld, Boizard et al. 2024): hand-computed values over two
vocabularies (3 and 5 tokens) with rows of different target counts, the alignment by response position, the plain
one-to-one case, the objective's weights, bad input."""

import math

import pytest
import torch

from teachkit.losses import LOSSES, Progress, build_objective
from teachkit.losses.base import DistillLoss
from teachkit.losses.uld import ULD, ULDOptions, aligned_pairs, sorted_probability_l1
from teachkit.types import Batch, Taps

P = Progress(0, 0, 1, 1)


class Packed:
    """Inputs carrying per-row target counts, as a causal LM batch's ``LMText`` does."""

    def __init__(self, student_counts, teacher_counts=None):
        self.s, self.t = torch.tensor(student_counts), None if teacher_counts is None else torch.tensor(teacher_counts)

    def tgt_lengths(self):
        return self.s

    @property
    def has_teacher(self):
        return self.t is not None

    def teacher_tgt_lengths(self):
        if self.t is None:  # as LMText without a teacher tokenisation
            raise ValueError("these rows carry no teacher tokenisation")
        return self.t


# student vocabulary 3, teacher vocabulary 5; row 0 has 3 student / 2 teacher targets, row 1 has 2 / 3
S_PROBS = [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.7, 0.1, 0.2], [0.3, 0.3, 0.4]]
T_PROBS = [[0.05, 0.4, 0.3, 0.15, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.1, 0.5, 0.2, 0.1],
           [0.6, 0.1, 0.1, 0.1, 0.1], [0.3, 0.25, 0.2, 0.15, 0.1]]
#: (student packed row, teacher packed row): row 0 pairs s0-t0, s1-t1 (s2 dropped); row 1 s3-t2, s4-t3 (t4 dropped)
PAIRS = [(0, 0), (1, 1), (3, 2), (4, 3)]


def logits(probs):
    return torch.tensor([[math.log(p) for p in row] for row in probs], dtype=torch.float64)


def sorted_l1(p, q):
    a, b = sorted(p, reverse=True), sorted(q, reverse=True)
    width = max(len(a), len(b))
    a, b = a + [0.0] * (width - len(a)), b + [0.0] * (width - len(b))
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def tempered(p, t):
    w = [x ** (1 / t) for x in p]
    return [x / sum(w) for x in w]


def run(zs, zt, x, temperature=1.0):
    loss = ULD(Taps(zs[:2].detach()), Taps(zt[:2]), ULDOptions(temperature=temperature))
    return loss(Taps(zs), Taps(zt), Batch(x, None, torch.arange(2)), P)["uld"]


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_hand_computed_two_vocabularies_and_ragged_rows(temperature):
    expected = sum(sorted_l1(tempered(S_PROBS[s], temperature), tempered(T_PROBS[t], temperature))
                   for s, t in PAIRS) / len(PAIRS)
    if temperature == 1.0:  # the first pair by hand: [.5 .3 .2 0 0] vs [.4 .3 .15 .1 .05]
        assert sorted_l1(S_PROBS[0], T_PROBS[0]) == pytest.approx(0.1 + 0 + 0.05 + 0.1 + 0.05, abs=1e-12)
    value = run(logits(S_PROBS), logits(T_PROBS), Packed([3, 2], [2, 3]), temperature)
    assert value.dtype == torch.float64 and value.item() == pytest.approx(expected, abs=1e-12)


def test_gradient_reaches_the_student_only_and_dropped_targets_get_none():
    zs = logits(S_PROBS).requires_grad_(True)
    zt = logits(T_PROBS).requires_grad_(True)
    run(zs, zt, Packed([3, 2], [2, 3])).backward()
    assert zt.grad is None
    assert torch.isfinite(zs.grad).all()
    assert zs.grad[2].abs().sum() == 0 and all(zs.grad[i].abs().sum() > 0 for i in (0, 1, 3, 4))


def test_aligned_pairs_by_response_position_with_empty_rows():
    s, t = aligned_pairs(torch.tensor([0, 2, 3, 1]), torch.tensor([1, 0, 2, 2]))
    # student rows: row 1 -> 0..1, row 2 -> 2..4, row 3 -> 5; teacher rows: row 0 -> 0, row 2 -> 1..2, row 3 -> 3..4
    assert s.tolist() == [2, 3, 5] and t.tolist() == [1, 2, 3]
    s, t = aligned_pairs(torch.tensor([3, 2]), torch.tensor([2, 3]))
    assert list(zip(s.tolist(), t.tolist(), strict=True)) == PAIRS


def test_one_tokenisation_uses_the_student_counts_and_same_vocabulary_is_sorted_l1():
    g = torch.Generator().manual_seed(0)
    zs, zt = torch.randn(5, 4, dtype=torch.float64, generator=g), torch.randn(5, 4, dtype=torch.float64, generator=g)
    value = run(zs, zt, Packed([2, 3]))  # no teacher tokenisation: the teacher reads the student's targets
    expected = sum(sorted_l1(torch.softmax(zs[i], 0).tolist(), torch.softmax(zt[i], 0).tolist()) for i in range(5)) / 5
    assert value.item() == pytest.approx(expected, abs=1e-12)
    # no class identities: permuting the teacher's vocabulary changes nothing, equal distributions give 0
    assert run(zs, zt[:, [2, 0, 3, 1]], Packed([2, 3])).item() == pytest.approx(value.item(), abs=1e-12)
    assert run(zs, zs[:, [1, 0, 3, 2]].clone(), Packed([2, 3])).item() == pytest.approx(0.0, abs=1e-12)


def test_plain_inputs_align_rows_one_to_one():
    zs, zt = logits(S_PROBS), logits(T_PROBS)
    value = run(zs, zt, torch.zeros(5, 1))  # a tensor batch (a classifier): one logit row per sample
    expected = sum(sorted_l1(S_PROBS[i], T_PROBS[i]) for i in range(5)) / 5
    assert value.item() == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="one to one without per-row target counts, but they have 5 and 4 rows"):
        run(zs, zt[:4], torch.zeros(5, 1))


def test_counts_that_do_not_match_the_logits_are_one_line_errors():
    zs, zt = logits(S_PROBS), logits(T_PROBS)
    with pytest.raises(ValueError, match="the teacher's packed logits have 5 rows but its per-row target counts sum "
                                         "to 6") as info:
        run(zs, zt, Packed([3, 2], [3, 3]))
    assert "\n" not in str(info.value)


def test_no_aligned_position_gives_zero_connected_to_the_student():
    zs = logits(S_PROBS[:2]).requires_grad_(True)
    value = run(zs, logits(T_PROBS[:1]), Packed([2, 0], [0, 1]))
    value.backward()
    assert value.item() == 0.0 and zs.grad is not None


def test_sorted_probability_l1_pads_the_shorter_vocabulary():
    # student [1, 0, 0] (a near-one-hot) vs teacher uniform over 5: |1 - .2| + 4 * .2 = 1.6
    zs = torch.tensor([[50.0, 0.0, 0.0]], dtype=torch.float64)
    assert sorted_probability_l1(zs, torch.zeros(1, 5, dtype=torch.float64)).item() == pytest.approx(1.6, abs=1e-12)


def test_registration_weights_and_flags():
    assert LOSSES.get("uld") is ULD and ULD.vocabulary_agnostic and not DistillLoss.vocabulary_agnostic
    assert not LOSSES.get("kd").vocabulary_agnostic
    assert ULD.default_weight == 1.5 and ULD.term_names == ("uld",)
    zs = logits(S_PROBS).requires_grad_(True)
    zt = logits(T_PROBS)
    y = torch.tensor([0, 1, 2, 0, 1])
    objective = build_objective("uld", Taps(zs[:2].detach()), Taps(zt[:2]), num_classes=3, num_samples=2,
                                options={"uld": {"temperature": 2.0}})
    assert objective.ce_weight == 1.0 and objective.weights == {"uld": 1.5}
    terms = objective(Taps(zs), Taps(zt), Batch(Packed([3, 2], [2, 3]), y, torch.arange(2)), P)
    assert set(terms) == {"ce", "uld"}
    expected = sum(sorted_l1(tempered(S_PROBS[s], 2.0), tempered(T_PROBS[t], 2.0)) for s, t in PAIRS) / 4
    assert terms["uld"].item() == pytest.approx(1.5 * expected, abs=1e-12)
    ce = -sum(math.log(S_PROBS[i][c]) for i, c in enumerate(y.tolist())) / 5
    assert terms["ce"].item() == pytest.approx(ce, abs=1e-12)
