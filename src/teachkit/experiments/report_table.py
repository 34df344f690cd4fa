"""The report's table: :class:`Report` holds the aggregated rows and renders them as Markdown and CSV.

The Markdown table stays readable for a folder of mixed runs (:meth:`Report.markdown_table`): a ``run`` column
names each row's folders when the keys were not chosen, keys equal on every row move to an ``all runs:`` line,
and more than :data:`MAX_KEY_COLUMNS` varying keys share one ``settings`` column; the CSV keeps every key.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from teachkit.experiments.report_rows import (
    ReportRow,
    RunRecord,
    as_number,
    cell,
    dotted_value,
    finite_mean,
    hashable,
)
from teachkit.experiments.stats import fmt_interval, fmt_mean_std, mean_std

SELECTS = ("last", "best")
SELECT_TEXT = {"last": "test at the last epoch", "best": "test at the best-validation epoch"}
#: varying report keys shown one column each in the Markdown table; beyond, one ``settings`` column
MAX_KEY_COLUMNS = 6
#: run folder names listed in a row's ``run`` cell; beyond, ``+N more``
MAX_RUN_NAMES = 3


@dataclass
class Report:
    """The aggregated table and what it is about; :meth:`to_markdown` and :meth:`to_csv` render it."""

    root: Path
    by: list[str]
    select: str
    metric: str
    rows: list[ReportRow]
    pairing_keys: list[str]
    baseline: str | None = None
    baseline_row: ReportRow | None = None
    unfinished: list[RunRecord] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    teachers: list[RunRecord] = field(default_factory=list)
    teacher_forwards_saved: int = 0
    wall_time_s: float = 0.0
    percent: bool = True
    #: a ``run`` column first (the rows' run folders, relative to ``root``): the keys were not chosen (``--by``)
    named: bool = False

    @property
    def runs(self) -> list[RunRecord]:
        return [run for row in self.rows for run in row.runs]

    def _has_published(self) -> bool:
        return any(row.published is not None for row in self.rows)

    def figure_columns(self) -> list[str]:
        """The table's columns after the run and key columns: counts, figures, diff, published."""
        m = self.metric
        columns = ["n", f"test {m} (last)", f"test {m} (best val)", f"best val {m}", "best epoch"]
        if self.baseline_row is not None:
            columns += [f"diff vs baseline ({self.select}) [95% CI]", "pairs"]
        if self._has_published():
            columns += ["published", "gap"]
        return columns

    def figure_cells(self) -> list[list[str]]:
        """The cells of :meth:`figure_columns`, row by row."""
        out = []
        for row in self.rows:
            cells = [str(len(row.runs)), _fmt(row.column("last")), _fmt(row.column("best")),
                      _num(finite_mean(row.column("best_val"))), _num(finite_mean(row.column("best_epoch")), 1)]
            if self.baseline_row is not None:
                cells += (["baseline", ""] if row is self.baseline_row else
                          [fmt_interval(row.diff) if row.diff else "-", str(row.pairs)])
            if self._has_published():
                cells += [_num(row.published.value) if row.published else "",
                          f"{row.gap(self.select):+.2f}" if row.published else ""]
            out.append(cells)
        return out

    def key_layout(self) -> tuple[list[str], list[str], dict[str, str]]:
        """The report keys split for the Markdown table: those equal on every row (an ``all runs:`` line), those
        shown as columns, and, beyond :data:`MAX_KEY_COLUMNS`, the usual (most common) value of each key, the
        ``settings`` column listing a row's other values instead of one column per key."""
        values = {k: [hashable(row.values[k]) for row in self.rows] for k in self.by}
        constant = [k for k in self.by if len(set(values[k])) == 1]
        varying = [k for k in self.by if k not in constant]
        if len(varying) <= MAX_KEY_COLUMNS:
            return constant, varying, {}
        usual = {}
        for k in varying:
            common = Counter(values[k]).most_common(1)[0][0]
            usual[k] = next(cell(row.values[k]) for row in self.rows if hashable(row.values[k]) == common)
        return constant, [], usual

    def _settings(self, row: ReportRow, usual: dict[str, str]) -> str:
        return ", ".join(f"{k}={cell(row.values[k])}" for k in usual if cell(row.values[k]) != usual[k]) or "usual"

    def markdown_table(self) -> str:
        """The table, after an ``all runs:`` line naming the keys equal on every row (and, with many varying keys,
        a ``usual values:`` line the ``settings`` column departs from); the CSV keeps one column per key."""
        constant, columns, usual = self.key_layout()
        first = self.rows[0].values if self.rows else {}
        lines = [f"all runs: {', '.join(f'{k}={cell(first[k])}' for k in constant)}", ""] if constant else []
        if usual:
            lines += ["usual values (the settings column lists a row's others): "
                      + ", ".join(f"{k}={v}" for k, v in usual.items()), ""]
        header = (["run"] if self.named else []) + columns + (["settings"] if usual else [])
        header = (header or ["rows"]) + self.figure_columns()
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row, figures in zip(self.rows, self.figure_cells(), strict=True):
            cells = ([_run_names(row, self.root)] if self.named else []) + [cell(row.values[k]) for k in columns]
            cells += [self._settings(row, usual)] if usual else []
            lines.append("| " + " | ".join((cells or ["all runs"]) + figures) + " |")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """Title, what the figures cover, the table, unfinished/failed runs, teachers, published footnote."""
        unit = " (%)" if self.percent else ""
        by = ", ".join(self.by) if self.by else "nothing (one row)"
        pairing = ", ".join(self.pairing_keys) if self.pairing_keys else "nothing (every baseline run)"
        text = [f"# teachkit report: {self.root}", "",
                f"{len(self.runs)} finished runs in {len(self.rows)} rows, grouped by {by}; metric: test "
                f"{self.metric}{unit}.", "",
                f"mean ± sample std over the runs of a row (seeds); paired 95% t intervals over runs paired by "
                f"{pairing}."]
        if self.baseline_row is not None:
            text += ["", f"The difference is to the baseline row ({self.baseline}) on the `{self.select}` column "
                         f"({SELECT_TEXT[self.select]}); runs without a partner are left out (pairs column)."]
        text += ["", self.markdown_table(), "",
                 f"Teacher forwards saved by cached teacher outputs: {self.teacher_forwards_saved}. "
                 f"Total wall time: {self.wall_time_s:.1f} s (runs, plus their teachers' own folders)."]
        if self.unfinished:
            text += ["", "## Unfinished runs", ""]
            text += [f"- {_where(r, self.root)}: {_epochs_done(r)}" for r in self.unfinished]
        if self.failed:
            text += ["", "## Failed runs", ""]
            text += [f"- {j.get('name')} ({j.get('state')}): {j.get('error') or 'no reason recorded'}"
                     for j in self.failed]
        if self.teachers:
            text += ["", "## Teachers", "", "| teacher | model | loss | seed | test " + f"{self.metric} (last) |",
                     "|---|---|---|---|---|"]
            for t in self.teachers:
                text.append(f"| {_where(t, self.root)} | {cell(dotted_value(t.config, 'model.name'))} | "
                            f"{cell(t.summary.get('loss') or dotted_value(t.config, 'train.loss'))} | "
                            f"{cell(dotted_value(t.config, 'train.seed'))} | "
                            f"{_num(as_number(t.summary.get(f'test_{self.metric}')))} |")
        if self._has_published():
            text += ["", "## Published numbers", "",
                     "Protocols differ: teachkit selects on a validation split carved from the training data and "
                     "reports the last epoch and the test figure at the best-validation epoch; papers often report "
                     "the maximum test accuracy over epochs (optimistic by construction), on the full training "
                     f"set. The gap is ours minus published on the `{self.select}` column.", ""]
            seen = []
            for row in self.rows:
                if row.published is not None and row.published not in seen:
                    seen.append(row.published)
                    p = row.published
                    text.append(f"- {row.label()}: {p.value:g} from {p.source}; protocol: {p.protocol}.")
        return "\n".join(text) + "\n"

    def to_csv(self) -> str:
        """One line per row, plain numbers (empty where there is none), with a header: every report key a column
        (``run``, the row's folders joined by ``;``, first when the keys were not chosen)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*(["run"] if self.named else []), *self.by, "n", "test_last_mean", "test_last_std",
                         "test_best_mean", "test_best_std", "best_val_mean", "best_epoch_mean", "diff", "diff_low",
                         "diff_high", "pairs", "published", "gap", "wall_time_s_mean"])
        for row in self.rows:
            last, best = mean_std(row.column("last")), mean_std(row.column("best"))
            diff = row.diff or (float("nan"),) * 3
            names = [";".join(_where(r, self.root) for r in row.runs)] if self.named else []
            writer.writerow([*names, *(cell(row.values[k]) if row.values[k] is not None else "" for k in self.by),
                             len(row.runs), *map(_plain, (*last, *best, finite_mean(row.column("best_val")),
                                                          finite_mean(row.column("best_epoch")), *diff)),
                             row.pairs if row.diff else "",
                             _plain(row.published.value if row.published else float("nan")),
                             _plain(row.gap(self.select)), _plain(finite_mean(row.column("wall_time_s")))])
        return buffer.getvalue()


def _fmt(values: list[float]) -> str:
    return fmt_mean_std(values) if values else "-"


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _plain(value: float) -> str:
    return "" if not math.isfinite(value) else repr(round(value, 6))


def _where(record: RunRecord, root: Path) -> str:
    try:
        return str(record.folder.relative_to(root)) or "."
    except ValueError:
        return str(record.folder)


def _run_names(row: ReportRow, root: Path) -> str:
    """The row's run folders relative to ``root``: the first :data:`MAX_RUN_NAMES`, then ``+N more``."""
    names = [_where(r, root) for r in row.runs]
    extra = len(names) - MAX_RUN_NAMES
    return ", ".join(names[:MAX_RUN_NAMES]) + (f" +{extra} more" if extra > 0 else "")


def _epochs_done(record: RunRecord) -> str:
    try:
        done = sum(1 for line in (record.folder / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        done = 0
    return f"unfinished (no summary.json), {done}/{cell(dotted_value(record.config, 'train.epochs'))} epochs logged"


__all__ = ["Report", "SELECTS", "SELECT_TEXT", "MAX_KEY_COLUMNS", "MAX_RUN_NAMES"]
