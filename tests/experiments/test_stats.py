import math

import pytest

from teachkit.experiments.stats import mean_std, paired_interval, t_critical


def test_mean_std_sample():
    m, s = mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and s == pytest.approx(math.sqrt(5 / 3))
    assert mean_std([7.0]) == (7.0, 0.0)


def test_paired_interval_hand_computed():
    # differences 1, 2, 3: mean 2, sd 1, n 3 -> half width t_{0.975,2} / sqrt(3) = 4.303 / 1.732
    m, lo, hi = paired_interval([11, 12, 13], [10, 10, 10])
    half = 4.303 / math.sqrt(3)
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert t_critical(4) == 2.776 and t_critical(100) == 1.96
