"""The README model card of an export folder: task, data, metrics, teacher and method, how to load it."""

from __future__ import annotations

from typing import Any

from teachkit.predict.base import Predictor


def _fmt(value: Any, percent: bool) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a"
    return f"{value:.2f}%" if percent else f"{value:.4g}"


def metrics_lines(summary: dict[str, Any], select: str) -> list[str]:
    """The run's headline metrics for the exported checkpoint (from its summary.json)."""
    if not summary:
        return ["- no summary.json was found beside the checkpoint"]
    m = str(summary.get("select_metric", "acc"))
    percent = bool(summary.get("select_metric_percent", m == "acc"))
    test = summary.get(f"test_{m}_at_best") if select == "best" else summary.get(f"test_{m}")
    lines = [f"- test {m} of this checkpoint ({select}): {_fmt(test, percent)}",
             f"- best val {m}: {_fmt(summary.get(f'best_val_{m}'), percent)} at epoch {summary.get('best_epoch')}",
             f"- last epoch: val {m} {_fmt(summary.get(f'val_{m}'), percent)}, test {m} "
             f"{_fmt(summary.get(f'test_{m}'), percent)} ({summary.get('epochs', 'n/a')} epochs)"]
    return lines


def teacher_lines(state: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Teacher and distillation method: the checkpoint's ``teacher`` record (KD runs) and the run's config.yaml."""
    teacher = state.get("teacher")
    if not isinstance(teacher, dict):
        return [f"- no teacher recorded: trained on labels with loss `{state.get('loss', 'n/a')}`"]
    section = config.get("teacher") if isinstance(config.get("teacher"), dict) else {}
    kd = config.get("kd") if isinstance(config.get("kd"), dict) else {}
    model = section.get("model") if isinstance(section.get("model"), dict) else {}
    where = (f"checkpoint `{section['checkpoint']}`" if section.get("checkpoint") else
             f"`{model.get('name', 'n/a')}` trained in the run")
    scores = ", ".join(f"{k} {_fmt(v, k.endswith('acc'))}" for k, v in teacher.items() if k.startswith("test_"))
    return [f"- teacher: {where} (its loss `{teacher.get('loss', 'n/a')}`, epoch {teacher.get('epoch', 'n/a')}"
            + (f"; {scores}" if scores else "") + ")",
            f"- KD method: `{state.get('loss', 'n/a')}` (temperature {kd.get('temperature', 'n/a')}, alpha "
            f"{kd.get('alpha', 'n/a')})"]


def inputs_line(predictor: Predictor) -> str:
    state = predictor.state
    names = state.get("feature_names")
    if isinstance(names, list):
        shown = ", ".join(map(str, names[:12])) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        return f"- inputs: table rows with the feature columns {shown}"
    return f"- inputs: shape {state.get('input_shape')} per example ({type(predictor).__name__})"


def model_card(predictor: Predictor, summary: dict[str, Any], config: dict[str, Any], select: str,
               onnx: bool) -> str:
    """The Markdown text of README.md."""
    state = predictor.state
    model = state.get("model") if isinstance(state.get("model"), dict) else {}
    data = state.get("data") if isinstance(state.get("data"), dict) else {}
    labels = predictor.labels
    shown = ", ".join(labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "") if labels else ""
    lines = [f"# {config.get('name') or state.get('dataset', 'model')}: a teachkit model", "",
             f"A `{model.get('name')}` model trained with teachkit, exported from `{predictor.source}` "
             f"(checkpoint `{select}`, epoch {state.get('epoch', 'n/a')}).", "",
             "## Task and data", "", f"- task: {predictor.task}",
             f"- dataset: {state.get('dataset', 'n/a')} (data section: `{data.get('name')}`, root "
             f"`{data.get('root')}`)", inputs_line(predictor)]
    if shown:
        lines.append(f"- labels: {shown}")
    lines += ["", "## Metrics", "", *metrics_lines(summary, select), "", "## Teacher and method", "",
              *teacher_lines(state, config), "", "## Load it", "", "```python", "import teachkit",
              "predictor = teachkit.load(\"THIS_FOLDER\")", "labels = predictor.predict(inputs)   # raw inputs",
              "model = predictor.model                  # the bare nn.Module (normalised inputs)", "```", "",
              "or `teachkit predict THIS_FOLDER INPUT --out predictions.csv`.", ""]
    if onnx:
        lines += ["## ONNX", "", f"`model.onnx` takes {predictor.onnx_input} (input `input`) and returns the logits "
                  "(output `logits`); the normalisation is folded into the graph.", ""]
    lines += ["## Files", "", "- `model.safetensors` (+ `model.json`): weights and recorded preprocessing",
              "- `config.json`: model construction config, preprocessing, metrics", "- `README.md`: this card", ""]
    return "\n".join(lines)
