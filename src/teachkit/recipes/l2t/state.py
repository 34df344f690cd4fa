"""The student's state s_t, the teacher model's input (L2T-DLF, Wu et al. 2018, Sec. 3.2).

s_t = [progress, train loss (EMA), train accuracy (EMA), last dev loss, last dev accuracy]:

- ``progress`` = t / T_total, the student's step over the length of its schedule (``train.epochs`` epochs
  of the final student), clipped to [0, 1], so it means the same in teacher training and in the final run;
- train loss / accuracy: exponential moving averages (``decay``) of the per-batch cross-entropy and
  accuracy of the student's training batches (cross-entropy, not the dynamic loss, so the feature does not
  depend on Phi's scale);
- dev loss / accuracy: the last measurement on the validation split (the dev batch of the previous teacher
  episode; the per-epoch validation record in the final run).

Accuracies are fractions in [0, 1]. Before any observation the features sit at chance level (loss log C,
accuracy 1/C). The state is an observation: no gradient flows through it (see
:mod:`teachkit.recipes.l2t.hypergrad`). Within one teacher episode only ``progress`` advances; the moving
averages are updated from the episode's recorded steps after it.

The tracker evolves with the student, so exact resume needs it: :class:`TrackerModule` exposes its values
as float64 buffers (Python floats are float64, so the round trip is bit-exact), checkpointed and restored by
the engine together with the student; the teacher phase stores :meth:`StudentStateTracker.state_dict` in
its own checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

FEATURES = ("progress", "train_loss", "train_acc", "dev_loss", "dev_acc")
#: the features that evolve with the student (``progress`` comes from the schedule)
STATE_KEYS = FEATURES[1:]


class StudentStateTracker:
    """Keeps the moving averages and last dev measurements; builds feature vectors s_t."""

    dim = len(FEATURES)

    def __init__(self, num_classes: int, decay: float = 0.98) -> None:
        self.num_classes = num_classes
        self.decay = decay
        chance_loss, chance_acc = math.log(num_classes), 1.0 / num_classes
        self.train_loss, self.train_acc = chance_loss, chance_acc
        self.dev_loss, self.dev_acc = chance_loss, chance_acc

    def observe_train(self, ce: float, acc: float) -> None:
        """One training batch's cross-entropy and accuracy (fraction)."""
        d = self.decay
        if math.isfinite(ce):
            self.train_loss = d * self.train_loss + (1 - d) * ce
        self.train_acc = d * self.train_acc + (1 - d) * acc

    def observe_steps(self, ces: Sequence[float], accs: Sequence[float]) -> None:
        for ce, acc in zip(ces, accs, strict=True):
            self.observe_train(ce, acc)

    def observe_dev(self, loss: float, acc: float) -> None:
        """The latest validation cross-entropy and accuracy (fraction)."""
        if math.isfinite(loss):
            self.dev_loss = loss
        self.dev_acc = acc

    def features(self, progress: float, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Tensor:
        """s_t as a (5,) tensor."""
        return torch.tensor(self.values(progress), device=device, dtype=dtype)

    def values(self, progress: float) -> list[float]:
        return [min(1.0, max(0.0, progress)), self.train_loss, self.train_acc, self.dev_loss, self.dev_acc]

    def episode(self, first_step: int, steps: int, total_steps: int, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> Tensor:
        """(steps, 5) states for inner steps ``first_step .. first_step + steps - 1`` of a schedule of
        ``total_steps``: progress advances, the other features stay at their current values."""
        rows = [self.values((first_step + t) / max(1, total_steps)) for t in range(steps)]
        return torch.tensor(rows, device=device, dtype=dtype)

    def state_dict(self) -> dict[str, Any]:
        """The evolving features (moving averages, last dev values) as floats."""
        return {k: getattr(self, k) for k in STATE_KEYS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            if k not in STATE_KEYS:
                raise KeyError(f"unknown student-state feature {k!r}")
            setattr(self, k, float(v))


class TrackerModule(nn.Module):
    """A :class:`StudentStateTracker` as a module without parameters whose float64 buffers mirror its values,
    so a :class:`~teachkit.engine.Trainer` checkpoints and resumes the state s_t with the student: the buffers
    are refreshed from the tracker whenever ``state_dict`` is taken and copied back into it on load."""

    def __init__(self, tracker: StudentStateTracker) -> None:
        super().__init__()
        self.tracker = tracker
        for k in STATE_KEYS:
            self.register_buffer(k, torch.tensor(getattr(tracker, k), dtype=torch.float64))

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        with torch.no_grad():
            for k in STATE_KEYS:
                getattr(self, k).fill_(getattr(self.tracker, k))
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        out = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.tracker.load_state_dict({k: getattr(self, k).item() for k in STATE_KEYS})
        return out
