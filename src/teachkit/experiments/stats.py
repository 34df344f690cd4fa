"""Small statistics for reports: mean +- std over seeds and paired 95% intervals (Student t)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Two-sided 95% Student-t critical values t_{0.975, df} for df = 1..30 (standard tables).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t_critical(df: int) -> float:
    """t_{0.975, df}; the normal 1.96 beyond df = 30 (within 2%)."""
    if df < 1:
        return float("nan")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    if n == 1:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def paired_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Mean of the paired differences a - b and its 95% t interval (low, high)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    d = [x - y for x, y in zip(a, b, strict=True)]
    m, s = mean_std(d)
    if len(d) < 2:
        return m, float("nan"), float("nan")
    half = t_critical(len(d) - 1) * s / math.sqrt(len(d))
    return m, m - half, m + half


def fmt_mean_std(values: Sequence[float]) -> str:
    """``mean +- std`` of ``values`` with two decimals (a table cell)."""
    m, sd = mean_std(values)
    return f"{m:.2f} +- {sd:.2f}"


def fmt_interval(triple: Sequence[float] | None) -> str:
    """``+d [lo, hi]`` of a paired interval (:func:`paired_interval`); empty for None."""
    if not triple:
        return ""
    m, lo, hi = triple
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


#: the widest a figure is drawn (inches); legends go outside the axes, so the saved image is a little wider
MAX_FIGURE_WIDTH_IN = 10.0


@contextmanager
def quiet_plotting() -> Iterator[None]:
    """Library warnings (layout, fonts, deprecations) kept out of the output while a figure is drawn and saved."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def legend_outside(ax: Any, **options: Any) -> Any:
    """The axes' legend in one column right of the axes, clear of the data (None when nothing is labelled)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                     fontsize="small", frameon=False, **options)


def save_figure(plt: Any, fig: Any, path: Path, kind: str | None = None, close: bool = True) -> Path:
    """Save ``fig`` to ``path`` as ``kind`` (png, svg; default: the suffix's) at 120 dpi, cropped to what is drawn
    (outside legends included), and close it unless ``close`` is False."""
    with quiet_plotting():
        fig.savefig(path, format=kind, dpi=120, bbox_inches="tight")
    if close:
        plt.close(fig)
    return path


def pyplot() -> Any | None:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        with quiet_plotting():
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def median_after_first(values: Sequence[float]) -> float:
    """The median of per-epoch figures without the first epoch (warm-up), or of all when there is only one."""
    import statistics

    return statistics.median(values[1:] if len(values) > 1 else values)
