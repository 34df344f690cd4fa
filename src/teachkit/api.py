"""A short Python API for practitioners: three calls, each writing a normal run folder.

    import teachkit
    teacher = teachkit.train(MyNet, (x, y), loss="mse", epochs=30)        # the ECCV 2024 MSE teacher
    student = teachkit.distill(SmallNet, teacher, (x, y), method="kd")    # KD from it
    print(student)                     # Run('runs/kd-SmallNet', test acc 91.35%, best val 92.10% at epoch 28)
    logits = student.model(x_new)      # the trained nn.Module (last epoch; student.load("best") for the best)
    teachkit.run("prokd", student=SmallNet, teacher_trajectory=teacher, data=(x, y))

``model`` / ``student`` may be a zoo name (``"resnet20"``), ``"package.module:factory"``, a class or function
returning an ``nn.Module`` (called with ``input_shape`` / ``num_classes`` when it names them, so every seed
gets a fresh initialisation), or an ``nn.Module`` instance (copied as given for every run; a ``teacher``
instance is taken as trained and frozen as it is). ``data`` may be
``(x, y)`` arrays or tensors (integer labels: classification; float labels: regression), a mapping
``{"train": (x, y), "val": (x, y), "test": (x, y)}`` (val / test optional: carved from train, seeded and
stratified, when absent), a dataset name (``"digits"``) or a ``data`` section as a mapping. Arrays are saved
once, by content hash, under ``out_dir/_data/`` and read back through the ``arrays`` dataset, so a run folder
made from Python can be evaluated and resumed from the command line like any other.

``trust_code=True`` lets a teacher run folder or checkpoint given here (or :func:`load`) import the model factory
or plugins it names; without it only code named in the call itself is imported (see docs/security.md).

Every other setting is a dotted override (``overrides={"optim.weight_decay": 5e-4}``) on top of an optional
base ``config`` (a YAML path or a mapping); the run folder's ``config.yaml`` records the result.
"""

from __future__ import annotations

import copy
import hashlib
import io
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from teachkit.config import ModelConfig, from_dict, merge, read_yaml
from teachkit.data import DataConfig, load_splits
from teachkit.engine.callbacks import Callback, with_callbacks
from teachkit.engine.checkpoint import atomic_write, save_checkpoint
from teachkit.errors import ConfigError
from teachkit.models import MODELS
from teachkit.models.probe import check_model_on_data
from teachkit.models.zoo import call_factory
from teachkit.options import to_plain
from teachkit.predict import Predictor, load_predictor
from teachkit.recipes import RECIPES
from teachkit.recipes.common import RunResult
from teachkit.recipes.common import load_model as load_checkpoint_model
from teachkit.trust import grant, trusting

__all__ = ["Run", "distill", "load", "load_model", "run", "train"]

PYTHON_SUFFIX = "@python"  # names of models given as Python objects (registered for this process only)
_python_models: dict[str, Any] = {}


class Run(RunResult):
    """A finished run: its folder, ``summary.json`` contents, per-epoch history and trained model (last epoch)."""

    def checkpoint(self, select: str = "last") -> Path:
        """The checkpoint file ``select`` (``last`` or ``best``, the best validation epoch)."""
        return self.run_dir / "checkpoints" / f"{select}.safetensors"

    def load(self, select: str = "best", device: torch.device | str = "cpu", trust_code: bool = False) -> nn.Module:
        """The bare model of checkpoint ``select`` (default: the best validation epoch), in eval mode; it expects
        inputs normalised as in training (:meth:`predictor` takes raw ones; ``trust_code``: see :func:`load`)."""
        return load_model(self, select, device, trust_code)

    def predictor(self, select: str = "best", device: torch.device | str = "cpu",
                  trust_code: bool = False) -> Predictor:
        """The :class:`~teachkit.predict.Predictor` of checkpoint ``select``: raw inputs in, labels out."""
        return load(self, select, device, trust_code)

    def __repr__(self) -> str:
        s, m = self.summary, self.summary.get("select_metric", "acc")
        percent = s.get("select_metric_percent", m == "acc")

        def fmt(key: str) -> str:
            value = s.get(key, float("nan"))
            return f"{value:.2f}%" if percent else f"{value:.4g}"

        return (f"Run({str(self.run_dir)!r}, test {m} {fmt(f'test_{m}')}, best val {fmt(f'best_val_{m}')} "
                f"at epoch {s.get('best_epoch')})")


# ----------------------------------------------------------------------------- models


def _register_python_model(obj: Any, label: str, builder: Callable[..., nn.Module]) -> str:
    """Register ``builder`` for a model given as a Python object under ``label@python`` (one name per object)."""
    for name, known in _python_models.items():
        if known is obj:
            return name
    for i in itertools.count(1):
        name = f"{label}{'' if i == 1 else f'-{i}'}{PYTHON_SUFFIX}"
        if name not in _python_models and name not in {e.name for e in MODELS.entries()}:
            break
    MODELS.register(name, f"{label}, given as a Python object (this process only)")(builder)
    _python_models[name] = obj
    return name


def _importable(obj: Any) -> str | None:
    """``"module:qualname"`` when ``obj`` can be imported back by that path (not ``__main__``, not a local)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = __import__(module, fromlist=["_"])
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def model_section(model: Any, role: str = "model") -> dict[str, Any]:
    """The ``model`` section for ``model``: a name, a mapping / ModelConfig, a factory or an nn.Module."""
    if isinstance(model, str):
        return {"name": model}
    if isinstance(model, ModelConfig):
        return to_plain(model)
    if isinstance(model, Mapping):
        return dict(model)
    if isinstance(model, nn.Module):
        check_materialised(model, role)
        instance = model
        name = _register_python_model(instance, type(instance).__qualname__,
                                      lambda input_shape, num_classes: copy.deepcopy(instance))
        return {"name": name}
    if callable(model):
        path = _importable(model)
        if path is not None:
            grant(path)  # the user's own object: its run folders may name it in this process
            return {"name": path}
        factory = model
        label = getattr(factory, "__qualname__", type(factory).__name__).replace("<", "").replace(">", "")

        def build(input_shape: Any, num_classes: int, **options: Any) -> nn.Module:
            return call_factory(factory, label, input_shape, num_classes, options)

        return {"name": _register_python_model(factory, label, build)}
    raise ConfigError(f"{role} must be a model name, a class or function returning an nn.Module, or an nn.Module; "
                      f"got {type(model).__name__}")


# ----------------------------------------------------------------------------- data


def check_materialised(module: nn.Module, role: str) -> None:
    """A ConfigError when ``module`` holds meta-device tensors (shapes without values): nothing to copy or train."""
    if any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers())):
        raise ConfigError(f"{role} {type(module).__name__} has parameters on the meta device (shapes without values); "
                          "give a class or function that builds it, or materialise it first (module.to_empty("
                          "device='cpu') and initialise its weights)")


def _array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise ConfigError(f"data {what} is a meta-device tensor (a shape without values); give real data")
        return value.detach().cpu().numpy()
    try:
        out = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"data {what} must be an array or tensor: {e}") from None
    if out.dtype == object:
        raise ConfigError(f"data {what} must be a numeric (or string label) array, not objects")
    return out


def _pair(value: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigError(f"data {split} must be a pair (x, y) of arrays or tensors")
    x, y = _array(value[0], f"{split} x"), _array(value[1], f"{split} y")
    if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
        raise ConfigError(f"data {split}: x and y must have the same number of rows, got {x.shape} and {y.shape}")
    return x, y


def _save_arrays(x: np.ndarray, y: np.ndarray, folder: Path) -> Path:
    """``x, y`` as ``folder/<sha256[:16]>.npz`` (written once, atomically; the name is its content hash)."""
    digest = hashlib.sha256()
    for a in (x, y):
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.tobytes())
    path = folder / f"{digest.hexdigest()[:16]}.npz"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))
    return path


def data_section(data: Any, out_dir: str | Path) -> dict[str, Any]:
    """The ``data`` section for ``data``: a dataset name, a mapping / DataConfig, ``(x, y)`` or a mapping of
    splits ``{"train": (x, y), "val": ..., "test": ...}`` (arrays are saved under ``out_dir/_data``)."""
    if isinstance(data, str):
        return {"name": data}
    if isinstance(data, DataConfig):
        return to_plain(data)
    if isinstance(data, Mapping) and set(data) and set(data) <= {"train", "val", "test"}:
        parts = {split: _pair(value, split) for split, value in data.items()}
    elif isinstance(data, Mapping):
        return dict(data)
    elif isinstance(data, (tuple, list)):
        parts = {"train": _pair(data, "train")}
    else:
        raise ConfigError(f"data must be (x, y), a mapping of splits, a dataset name or a data section; "
                          f"got {type(data).__name__}")
    if "train" not in parts:
        raise ConfigError("data given as a mapping of splits needs a 'train' split")
    folder = Path(out_dir).expanduser() / "_data"
    files = {split: _save_arrays(x, y, folder).name for split, (x, y) in parts.items()}
    regression = parts["train"][1].dtype.kind == "f"
    return {"name": "arrays", "root": str(folder), "options": {**files, **({"task": "regression"} if regression
                                                                           else {})}}


# ----------------------------------------------------------------------------- runs


def _teacher_path(teacher: Any) -> str | None:
    """A teacher given as a finished run or a checkpoint path (file or run folder); None for a model spec."""
    if isinstance(teacher, RunResult):
        return str(teacher.run_dir)
    if isinstance(teacher, Path) or (isinstance(teacher, str) and Path(teacher).expanduser().exists()):
        return str(Path(teacher).expanduser())
    return None


def _free_name(out_dir: Path, wanted: str) -> str:
    """``wanted``, or ``wanted-2``, ``wanted-3``... : the first name with no run folder under ``out_dir``."""
    for i in itertools.count(1):
        name = wanted if i == 1 else f"{wanted}-{i}"
        if not (out_dir / name).exists():
            return name
    raise AssertionError  # pragma: no cover


def _label(section: Mapping[str, Any]) -> str:
    """A run-name part for a model section: ``resnet20``, ``Net`` (of ``pkg.nets:Net``), ``model`` for lambdas."""
    name = str(section.get("name", "model"))
    name = name.rpartition(":")[2] if ":" in name else name
    if name.endswith(PYTHON_SUFFIX):
        name = re.sub(r"-\d+$", "", name.removesuffix(PYTHON_SUFFIX))
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", name.rpartition(".")[2]).strip("-")
    return "model" if name in ("", "lambda") else name


def _run(recipe: str, tree: dict[str, Any], *, name: str | None, out_dir: str | Path, config: Any,
         overrides: Mapping[str, Any] | None, resume: bool, quiet: bool, trust_code: bool,
         callbacks: Sequence[Callback] = ()) -> Run:
    with trusting(trust_code), with_callbacks(callbacks):
        return _run_trusted(recipe, tree, name=name, out_dir=out_dir, config=config, overrides=overrides,
                            resume=resume, quiet=quiet)


def _run_trusted(recipe: str, tree: dict[str, Any], *, name: str | None, out_dir: str | Path, config: Any,
                 overrides: Mapping[str, Any] | None, resume: bool, quiet: bool) -> Run:
    base: dict[str, Any] = {}
    if isinstance(config, (str, Path)):
        base = read_yaml(config)
    elif isinstance(config, Mapping):
        base = dict(config)
    elif config is not None:
        raise ConfigError(f"config must be a YAML file path or a mapping, got {type(config).__name__}")
    out = Path(out_dir).expanduser()
    wanted = name or f"{recipe}-{_label(tree.get('model', {}))}"
    run_name = wanted if (name is not None or resume) else _free_name(out, wanted)
    tree = merge(base, {**tree, "name": run_name, "out_dir": str(out)})
    if quiet:
        tree = merge(tree, {"train": {"progress": False}})
    tree = merge(tree, dotted_tree(overrides or {}))
    cfg = from_dict(tree)
    result = RECIPES.get(recipe)(cfg, resume=resume)
    return Run(Path(result.run_dir), result.summary, result.model, result.history)


def dotted_tree(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 0.1}`` as ``{"optim": {"lr": 0.1}}`` (Python values as given; a mapping value replaces)."""
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"override key {key!r} must be dotted names such as 'optim.lr'")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {part!r} is given both as a value and as a section")
        node[parts[-1]] = to_plain(value) if not isinstance(value, (str, int, float, bool, list, dict)) else value
    return tree


def _common(data: Any, out_dir: str | Path, epochs: int | None, lr: float | None, optimizer: str | None,
            batch_size: int | None, seed: int | None, device: str | None) -> dict[str, Any]:
    tree: dict[str, Any] = {"data": data_section(data, out_dir), "train": {}, "optim": {}}
    for section, key, value in (("train", "epochs", epochs), ("train", "seed", seed), ("train", "device", device),
                                ("optim", "lr", lr), ("optim", "name", optimizer),
                                ("data", "batch_size", batch_size)):
        if value is not None:
            tree[section][key] = value
    return tree


def train(model: Any, data: Any, *, loss: str = "ce", epochs: int | None = None, lr: float | None = None,
          optimizer: str | None = None, batch_size: int | None = None, seed: int | None = None,
          device: str | None = None, name: str | None = None, out_dir: str | Path = "runs", config: Any = None,
          overrides: Mapping[str, Any] | None = None, resume: bool = False, quiet: bool = False,
          trust_code: bool = False, callbacks: Sequence[Callback] = ()) -> Run:
    """Train ``model`` on ``data``'s labels with ``loss`` (``ce``; ``mse``: the ECCV 2024 teacher, Eq. 4).

    ``callbacks``: :class:`~teachkit.engine.Callback` objects given to the run's trainer (after any named in
    ``train.callbacks``; see docs/callbacks.md). Returns the finished :class:`Run` (its folder is
    ``out_dir/name``, default ``train-<model>``, numbered when taken)."""
    tree = _common(data, out_dir, epochs, lr, optimizer, batch_size, seed, device)
    tree["model"] = model_section(model)
    tree["train"]["loss"] = loss
    return _run("train", tree, name=name, out_dir=out_dir, config=config, overrides=overrides, resume=resume,
                quiet=quiet, trust_code=trust_code, callbacks=callbacks)


def save_trained_module(module: nn.Module, data: Mapping[str, Any], out_dir: str | Path) -> Path:
    """A trained ``nn.Module`` as a teacher checkpoint under ``out_dir/_teachers/`` (named by its content).

    Its training data is unknown, so the checkpoint records none: the run refuses it unless
    ``teacher.allow_overlap`` is set, and then says so in its summary."""
    splits = load_splits(from_dict(dict(data), DataConfig))
    name = model_section(module, "teacher")["name"]
    rows = torch.arange(min(2, len(splits.train)))
    check_model_on_data(module, splits.train.x[rows], len(rows), splits.num_classes, splits.task,
                        f"teacher {type(module).__name__}", splits.name)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    digest = hashlib.sha256(name.encode())
    for key, value in sorted(tensors.items()):
        digest.update(key.encode())
        digest.update(value.numpy().tobytes() if value.dtype != torch.bfloat16 else value.float().numpy().tobytes())
    path = Path(out_dir).expanduser() / "_teachers" / f"{digest.hexdigest()[:16]}.safetensors"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"model": {"name": name, "options": {}, "taps": {}}, "input_shape": list(splits.input_shape),
                 "num_classes": splits.num_classes, "dataset": splits.name, "loss": "unknown", "epoch": 0}
        save_checkpoint(path, tensors, state)
    return path


def _teacher_section(teacher: Any, teacher_epochs: int | None, teacher_loss: str | None,
                     data: Mapping[str, Any], out_dir: str | Path) -> dict[str, Any]:
    section: dict[str, Any] = {}
    path = _teacher_path(teacher)
    if path is not None:
        section["checkpoint"] = path
    elif isinstance(teacher, nn.Module):  # a trained teacher, used as it is (its training data is unknown)
        section["checkpoint"] = str(save_trained_module(teacher, data, out_dir))
        section["allow_overlap"] = True
    elif teacher is not None:
        section["model"] = model_section(teacher, "teacher")
    if teacher_epochs is not None:
        section["epochs"] = teacher_epochs
    if teacher_loss is not None:
        section["loss"] = teacher_loss
    return section


def distill(student: Any, teacher: Any, data: Any, *, method: str | list[str] = "kd",
            temperature: float | None = None, alpha: float | None = None, epochs: int | None = None,
            lr: float | None = None, optimizer: str | None = None, batch_size: int | None = None,
            seed: int | None = None, device: str | None = None, teacher_epochs: int | None = None,
            teacher_loss: str | None = None, name: str | None = None, out_dir: str | Path = "runs",
            config: Any = None, overrides: Mapping[str, Any] | None = None, resume: bool = False,
            quiet: bool = False, trust_code: bool = False, callbacks: Sequence[Callback] = ()) -> Run:
    """Distil ``student`` from ``teacher`` with ``method`` (``teachkit list losses``; a list combines several).

    ``teacher`` is a finished :class:`Run` or a checkpoint path (file or run folder) -- its data settings are
    checked against ``data`` so it cannot have seen the student's val/test split --, a model spec (a name, a
    class or function), trained first in the run's ``teacher/`` folder on the full training split
    (``teacher_epochs``, ``teacher_loss``), or a trained ``nn.Module`` used as it is: teachkit cannot know
    what it was trained on, so the summary records ``teacher_overlap_allowed`` and a warning. ``callbacks``:
    :class:`~teachkit.engine.Callback` objects given to every trainer of the run (an in-command teacher's, a
    method's training stages, the student's)."""
    tree = _common(data, out_dir, epochs, lr, optimizer, batch_size, seed, device)
    tree["model"] = model_section(student, "student")
    tree["teacher"] = _teacher_section(teacher, teacher_epochs, teacher_loss, tree["data"], out_dir)
    kd: dict[str, Any] = {"method": method}
    if temperature is not None:
        kd["temperature"] = temperature
    if alpha is not None:
        kd["alpha"] = alpha
    tree["kd"] = kd
    return _run("kd", tree, name=name, out_dir=out_dir, config=config, overrides=overrides, resume=resume,
                quiet=quiet, trust_code=trust_code, callbacks=callbacks)


def run(recipe: str, *, student: Any, data: Any, teacher: Any = None, teacher_trajectory: Any = None,
        options: Mapping[str, Any] | None = None, epochs: int | None = None, lr: float | None = None,
        optimizer: str | None = None, batch_size: int | None = None, seed: int | None = None,
        device: str | None = None, teacher_epochs: int | None = None, teacher_loss: str | None = None,
        name: str | None = None, out_dir: str | Path = "runs", config: Any = None,
        overrides: Mapping[str, Any] | None = None, resume: bool = False, quiet: bool = False,
          trust_code: bool = False, callbacks: Sequence[Callback] = ()) -> Run:
    """Run any registered recipe (``teachkit list recipes``: prokd, annealing, rco, takd, eskd, ban, l2t...).

    ``teacher_trajectory`` is a teacher run recorded with ``train.save_every`` (Pro-KD replay, ESKD, RCO);
    ``teacher`` a finished run / checkpoint or a model spec trained in the run; ``options`` the recipe's own
    section, e.g. ``run("prokd", ..., options={"mode": "replay"})``; ``callbacks`` as in :func:`distill`."""
    if teacher is not None and teacher_trajectory is not None:
        raise ConfigError("give teacher or teacher_trajectory, not both")
    entry = RECIPES.entry(recipe)
    tree = _common(data, out_dir, epochs, lr, optimizer, batch_size, seed, device)
    tree["model"] = model_section(student, "student")
    tree["teacher"] = _teacher_section(teacher if teacher is not None else teacher_trajectory, teacher_epochs,
                                       teacher_loss, tree["data"], out_dir)
    if options:
        if entry.options is None:
            raise ConfigError(f"recipe {recipe!r} takes no options")
        tree[recipe] = dict(options)
    return _run(recipe, tree, name=name, out_dir=out_dir, config=config, overrides=overrides, resume=resume,
                quiet=quiet, trust_code=trust_code, callbacks=callbacks)


def load(run_or_path: Run | RunResult | str | Path, select: str = "best",
         device: torch.device | str = "cpu", trust_code: bool = False) -> Predictor:
    """The predictor of a run folder, export folder (``teachkit export``) or checkpoint file (``select``: ``best``
    or ``last``): ``predict(raw_inputs)`` applies the run's own preprocessing (normalisation, feature columns,
    image size, tokenizer) and returns labels in the run's label names; ``.model`` is the bare ``nn.Module``.

    A model factory the checkpoint names (``package.module:factory``) is imported only when this process named
    it or ``trust_code=True``: a run folder someone hands you is data, not code."""
    path = run_or_path.run_dir if isinstance(run_or_path, RunResult) else run_or_path
    with trusting(trust_code):
        return load_predictor(path, select, device)


def load_model(run_or_path: Run | RunResult | str | Path, select: str = "best",
               device: torch.device | str = "cpu", trust_code: bool = False) -> nn.Module:
    """The bare model saved in a run folder or checkpoint file (``select``: ``best`` or ``last``), in eval mode;
    it expects inputs preprocessed as in training (normalised with the training split's statistics)."""
    path = run_or_path.run_dir if isinstance(run_or_path, RunResult) else run_or_path
    with trusting(trust_code):
        model, _ = load_checkpoint_model(path, select, device)
    return model.eval()

