"""Teacher models mu_theta(s_t) -> Phi_t = (W_t, b_t) of L2T-DLF (Wu et al. 2018, Sec. 3.2).

- ``static``: a learned constant Phi = (W, b), initialised W = I, b = 0 (the loss -p_y / (1 + p_y)).
- ``gated``: W_t = W + sum_r h_r(s_t) W2_r and b_t = b + sum_r h_r(s_t) B2_r, with h a small MLP
  (Linear(S, hidden) - tanh - Linear(hidden, rank) - tanh; ``hidden=0``: Linear(S, rank) - tanh) of the student
  state; W2 and B2 start at zero, so the gated teacher starts exactly as the static one and learns how Phi should
  move with the state. With ``hidden=0, rank=1`` it is the "dynamic" loss of the authors' public demo,
  W_t = W + w2 (2 sigmoid(theta . s_t + b2) - 1) (2 sigmoid(x) - 1 = tanh(x / 2)).
- ``attention``: the paper's Phi_t = W softmax(V s_t): a bank of K loss parameters (W_k, b_k) mixed by the
  attention weights a = softmax(V s_t), W_t = sum_k a_k W_k, b_t = sum_k a_k b_k; every W_k = I, b_k = 0 at
  start (= static).

Every teacher maps stacked states (T, S) to (W (T, C, C), b (T, C)) and a single state (S,) to
(W (C, C), b (C,)). With ``diagonal=True`` W is its diagonal only: (T, C) / (C,), initialised to ones (the
per-token loss of translation, where C is the vocabulary; see :func:`~teachkit.recipes.l2t.loss.dynamic_loss`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from teachkit.engine.checkpoint import load_checkpoint, prefixed, save_checkpoint, strip
from teachkit.errors import CheckpointError, ConfigError
from teachkit.types import upcast

TEACHER_MODELS = ("static", "gated", "attention")


class LossTeacher(nn.Module):
    """Base class: ``forward(states) -> (W, b)``; ``config()`` is what rebuilds it from a checkpoint."""

    kind: ClassVar[str] = ""

    def __init__(self, num_classes: int, state_dim: int, diagonal: bool = False) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.state_dim = state_dim
        self.diagonal = diagonal
        self.W = nn.Parameter(torch.ones(num_classes) if diagonal else torch.eye(num_classes))
        self.b = nn.Parameter(torch.zeros(num_classes))

    @property
    def w_shape(self) -> tuple[int, ...]:
        """The shape of W: (C,) diagonal or (C, C)."""
        return (self.num_classes,) if self.diagonal else (self.num_classes, self.num_classes)

    def config(self) -> dict[str, Any]:
        return {"teacher_model": self.kind, "num_classes": self.num_classes, "state_dim": self.state_dim,
                "diagonal": self.diagonal}

    def forward(self, states: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class StaticTeacher(LossTeacher):
    """Phi = (W, b), the same for every state (W = I, b = 0 at start)."""

    kind = "static"

    def forward(self, states: Tensor) -> tuple[Tensor, Tensor]:
        if states.dim() == 1:
            return self.W, self.b
        n = states.shape[0]
        return self.W.expand(n, *self.w_shape), self.b.expand(n, -1)


class GatedTeacher(LossTeacher):
    """W_t = W + sum_r h_r(s_t) W2_r, b_t = b + sum_r h_r(s_t) B2_r; W2 = B2 = 0 at start (= static).

    h = tanh(Linear(tanh(Linear(s)))) with ``hidden`` units, or tanh(Linear(s)) with ``hidden=0`` (no hidden
    layer: the demo's gate 2 sigmoid(theta . s + b2) - 1 = tanh((theta . s + b2) / 2) exactly, at rank 1).
    """

    kind = "gated"

    def __init__(self, num_classes: int, state_dim: int, hidden: int = 16, rank: int = 4,
                 diagonal: bool = False) -> None:
        super().__init__(num_classes, state_dim, diagonal)
        self.hidden, self.rank = hidden, rank
        layers = [nn.Linear(state_dim, hidden), nn.Tanh(), nn.Linear(hidden, rank)] if hidden else \
            [nn.Linear(state_dim, rank)]
        self.h = nn.Sequential(*layers, nn.Tanh())
        self.W2 = nn.Parameter(torch.zeros(rank, *self.w_shape))
        self.B2 = nn.Parameter(torch.zeros(rank, num_classes))

    def config(self) -> dict[str, Any]:
        return {**super().config(), "hidden": self.hidden, "rank": self.rank}

    def forward(self, states: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast(states.device.type, enabled=False):  # the loss's parameters: fp32 under any autocast
            z = self.h(upcast(states))  # (T, rank) or (rank,)
            W = self.W + torch.tensordot(z, self.W2, dims=1)
            b = self.b + torch.tensordot(z, self.B2, dims=1)
        return W, b


class AttentionTeacher(LossTeacher):
    """Phi_t = W softmax(V s_t) (Wu et al. 2018, Sec. 3.2): W_t = sum_k a_k W_k, b_t = sum_k a_k b_k with
    a = softmax(V s_t), V = Linear(S, K); all W_k = I (ones if diagonal), b_k = 0 at start (= static).

    ``W`` and ``b`` hold the banks, (K, *w_shape) and (K, C). Since sum_k a_k = 1 the mixture is computed
    centred, W_bar + sum_k a_k (W_k - W_bar) with W_bar the bank's mean: the same function and gradients, but
    exactly (I, 0) at start (a plain sum_k a_k I is I only up to the rounding of sum_k a_k).
    While the entries are equal (as at start) the gradient w.r.t. V is zero and W_k's is sum_t a_k(s_t) dM/dPhi_t:
    they separate only as far as a(s_t) varies over the states (Adam ignores a constant factor a_k), then V learns.
    """

    kind = "attention"

    def __init__(self, num_classes: int, state_dim: int, k: int = 4, diagonal: bool = False) -> None:
        super().__init__(num_classes, state_dim, diagonal)
        self.k = k
        self.W = nn.Parameter(self.W.detach().expand(k, *self.w_shape).clone())
        self.b = nn.Parameter(torch.zeros(k, num_classes))
        self.V = nn.Linear(state_dim, k)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "attention_k": self.k}

    def attention(self, states: Tensor) -> Tensor:
        """a = softmax(V s_t): (T, K) or (K,)."""
        with torch.autocast(states.device.type, enabled=False):
            return torch.softmax(self.V(upcast(states)), dim=-1)

    def forward(self, states: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast(states.device.type, enabled=False):  # the loss's parameters: fp32 under any autocast
            a = self.attention(states)
            W_bar, b_bar = self.W.mean(0), self.b.mean(0)
            W = W_bar + torch.tensordot(a, self.W - W_bar, dims=1)
            b = b_bar + torch.tensordot(a, self.b - b_bar, dims=1)
        return W, b


def build_teacher(kind: str, num_classes: int, state_dim: int, hidden: int = 16, rank: int = 4,
                  diagonal: bool = False, attention_k: int = 4) -> LossTeacher:
    """The teacher model ``kind`` (``static`` | ``gated`` | ``attention``), full or ``diagonal`` W."""
    if kind == "static":
        return StaticTeacher(num_classes, state_dim, diagonal)
    if kind == "gated":
        return GatedTeacher(num_classes, state_dim, hidden, rank, diagonal)
    if kind == "attention":
        return AttentionTeacher(num_classes, state_dim, attention_k, diagonal)
    raise ConfigError(f"l2t.teacher_model={kind!r} is not allowed; choose one of: {', '.join(TEACHER_MODELS)}")


def save_teacher(path: str | Path, teacher: LossTeacher, state: dict[str, Any],
                 extra: dict[str, Tensor] | None = None) -> str:
    """Write the teacher's weights and config (plus ``state``, and ``extra`` tensors such as an unfinished
    teacher phase's resume state) atomically as safetensors + JSON sidecar."""
    tensors = {**(extra or {}), **prefixed("teacher/", teacher.state_dict())}
    return save_checkpoint(path, tensors, {**state, "teacher": teacher.config()})


def load_teacher(path: str | Path, device: torch.device | str = "cpu") -> tuple[LossTeacher, dict[str, Any]]:
    """Rebuild a teacher saved by :func:`save_teacher` (hash-checked); returns (teacher, state)."""
    tensors, state = load_checkpoint(path)
    try:
        c = state["teacher"]
        teacher = build_teacher(c["teacher_model"], int(c["num_classes"]), int(c["state_dim"]),
                                int(c.get("hidden", 16)), int(c.get("rank", 4)), bool(c.get("diagonal", False)),
                                int(c.get("attention_k", 4)))
        teacher.load_state_dict(strip("teacher/", tensors))
    except (KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{str(path)!r} is not an L2T-DLF teacher checkpoint "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    return teacher.to(device), state
