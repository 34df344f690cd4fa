"""Reverse-mode teacher gradients through a functional momentum-SGD unroll of the student (L2T-DLF).

Part of the L2T-DLF recipe (:mod:`teachkit.recipes.l2t`): Wu et al., "Learning to Teach with Dynamic Loss
Functions" (NeurIPS 2018), Sec. 3.3 (the teacher trained by reverse-mode differentiation through the
student's plain-SGD updates), extended here to heavy-ball momentum and weight decay.

The student trains T inner steps under the teacher's loss parameters Phi_t = mu_theta(s_t):

    g_t     = grad_w L_{Phi_t}(w_t; batch_t) + lambda w_t          (weight decay lambda, as torch.optim.SGD)
    v_{t+1} = mu v_t + g_t
    w_{t+1} = w_t - eta_t v_{t+1}

and the teacher's objective is a dev-set measure M(w_T). Its gradient w.r.t. the teacher parameters
theta follows from the adjoint recursion (w_hat = dM/dw_t, v_hat = dM/dv_t):

    w_hat = dM/dw_T,  v_hat = 0
    for t = T-1, ..., 0:
        v_tilde  = v_hat - eta_t w_hat                       (= dM/dg_t)
        dPhi_t  += (dg_t/dPhi_t)^T v_tilde                   (vector-Jacobian product)
        w_hat   += H_t v_tilde                               (H_t = dg_t/dw_t, Hessian-vector product; + lambda v_tilde)
        v_hat    = mu v_tilde
    dtheta = sum_t (dPhi_t/dtheta)^T dPhi_t                 (one VJP through the teacher for all t)

With mu = 0 and lambda = 0 this is the paper's plain-SGD reverse pass. Every product is a Hessian-vector /
vector-Jacobian product from ``torch.autograd.grad``; ``create_graph`` is used only for the inner gradient
g_t whose products are taken.

The student is handled functionally (``torch.func.functional_call``): its parameters w and buffers (e.g.
BatchNorm running statistics) are threaded explicitly, so any zoo model works. The initial state
(w_0, v_0, buffers_0) and the states s_t are constants of theta (the state is the teacher's observation of
the student; no gradient flows through it), so the result is the exact gradient of M(w_T(theta)).

Inner steps run the model in train mode (BatchNorm on batch statistics, dropout on with a per-step seed,
so recomputation replays the same masks). The dev objective runs with dropout off and BatchNorm on the
dev batch's statistics, so M is a deterministic function of w_T alone (running statistics never need a
derivative); for students without BatchNorm this is plain eval mode.

Memory modes (``memory``):

- ``full``: keep every step's w_t and the graph of its g_t (built with ``create_graph`` in the forward
  pass), so the reverse pass is one double backward per step; O(T (2|w| + activations)) memory.
- ``checkpoint``: keep (w, v, buffers) every c = ceil(sqrt(T)) steps; during the reverse pass each segment's
  weights are recomputed forward from its snapshot and each step's graph is rebuilt just before its
  adjoint step (one graph alive at a time): O((2T/c + c) |w| + activations) = O(sqrt(T) |w|) memory for
  two extra forward-backward passes per step; exact (the same numbers as ``full``).
- ``truncate:K``: only the last K steps keep graphs and receive the adjoint (earlier steps' effect on
  theta is dropped); O(K) memory. **Biased** (the gradient of a truncated objective), labelled as such in
  results and logs;
  ``truncate:K`` with K >= T is ``full``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from teachkit.errors import ConfigError, TeachkitError
from teachkit.types import Batch, Inputs

#: ``inner_loss(logits, y, *phi_t) -> scalar``: the student's loss under the teacher's parameters.
InnerLoss = Callable[..., Tensor]
#: ``objective(logits, y) -> scalar``: the teacher's dev-set measure M (to minimise).
Objective = Callable[[Tensor, Tensor], Tensor]


class NonFiniteHypergradientError(TeachkitError):
    """The unroll or the teacher gradient became NaN/Inf; the teacher must not be updated."""


# ----------------------------------------------------------------------------- memory modes


@dataclass(frozen=True)
class MemoryMode:
    """How the reverse pass gets the student's past weights: ``full``, ``checkpoint`` or ``truncate:K``."""

    kind: Literal["full", "checkpoint", "truncate"]
    k: int = 0

    @property
    def biased(self) -> bool:
        """True for ``truncate:K``: the gradient ignores steps before the last K (biased)."""
        return self.kind == "truncate"

    def steps_differentiated(self, T: int) -> int:
        return min(T, self.k) if self.kind == "truncate" else T

    def __str__(self) -> str:
        return f"truncate:{self.k}" if self.kind == "truncate" else self.kind


def parse_memory(spec: str | MemoryMode, key: str = "l2t.memory") -> MemoryMode:
    """``"full"``, ``"checkpoint"`` or ``"truncate:K"`` (K >= 1) as a :class:`MemoryMode`; else a ConfigError."""
    if isinstance(spec, MemoryMode):
        return spec
    bad = ConfigError(f"{key}={spec!r} is not allowed; choose full, checkpoint or truncate:K with an integer K >= 1 "
                      "(or auto in the l2t section)")
    if not isinstance(spec, str):
        raise bad
    text = spec.strip()
    if text in ("full", "checkpoint"):
        return MemoryMode(text)  # type: ignore[arg-type]
    if text.startswith("truncate:"):
        num = text.split(":", 1)[1].strip()
        if num.isdigit() and int(num) >= 1:
            return MemoryMode("truncate", int(num))
    raise bad


def checkpoint_interval(T: int) -> int:
    """c = ceil(sqrt(T)): segment length of the ``checkpoint`` mode (T = 9 -> 3)."""
    return max(1, math.ceil(math.sqrt(T)))


# ----------------------------------------------------------------------------- the functional student


@contextlib.contextmanager
def differentiable_kernels() -> Iterator[None]:
    """Kernels whose backward is itself differentiable, for the double backward of the adjoint steps: cuDNN's
    fused RNN has no double backward (PyTorch's own LSTM decomposition has), and the fused attention kernels
    neither (the math kernel has). No effect on CPU tensors."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        except ImportError:  # torch < 2.3
            pass
        yield


@dataclass
class InnerState:
    """The student's optimisation state: weights w, momentum buffer v, module buffers, global step."""

    params: list[Tensor]
    velocity: list[Tensor]
    buffers: dict[str, Tensor]
    step: int = 0

    def detached(self) -> InnerState:
        return InnerState([p.detach() for p in self.params], [v.detach() for v in self.velocity],
                          dict(self.buffers), self.step)

    def clone(self) -> InnerState:
        return InnerState([p.detach().clone() for p in self.params], [v.detach().clone() for v in self.velocity],
                          {k: b.clone() for k, b in self.buffers.items()}, self.step)


class FunctionalStudent:
    """A model called as a pure function of (w, buffers) via ``torch.func.functional_call``.

    ``w`` lists the trainable parameters in ``named_parameters`` order (frozen ones are read from the
    module); buffers are cloned before every call, so BatchNorm's in-place running-statistics update lands
    on the copy that becomes the next step's buffers. Raises a ConfigError when the model has no trainable
    parameter (nothing to differentiate).
    """

    def __init__(self, model: nn.Module, what: str = "student") -> None:
        self.model = model
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        if not self.names:
            raise ConfigError(f"l2t: the {what} ({type(model).__name__}) has no differentiable parameters; "
                              "the teacher gradient flows through the student's updates, so it needs trainable weights")
        self.buffer_names = [n for n, _ in model.named_buffers()]
        self.batch_norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.stochastic = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
        self._mode: str | None = None

    def initial_state(self, step: int = 0) -> InnerState:
        """The module's current weights and buffers (copied) with a zero momentum buffer."""
        named = dict(self.model.named_parameters())
        params = [named[n].detach().clone() for n in self.names]
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        return InnerState(params, [torch.zeros_like(p) for p in params], buffers, step)

    def set_mode(self, mode: Literal["train", "dev"]) -> None:
        """``train``: module train mode. ``dev``: eval mode (dropout off) but BatchNorm on batch statistics."""
        if mode == self._mode:
            return
        self.model.train(mode == "train")
        if mode == "dev":
            for m in self.batch_norms:
                m.train(True)
        self._mode = mode

    @contextlib.contextmanager
    def modes(self) -> Iterator[None]:
        """Restore every submodule's train/eval flag on exit."""
        flags = [(m, m.training) for m in self.model.modules()]
        try:
            yield
        finally:
            for m, flag in flags:
                m.training = flag
            self._mode = None

    def _rng(self, seed: int | None) -> contextlib.AbstractContextManager:
        if seed is None or not self.stochastic:
            return contextlib.nullcontext()
        device = self.device
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        ctx = torch.random.fork_rng(devices=devices)

        @contextlib.contextmanager
        def seeded() -> Iterator[None]:
            with ctx:  # only this device's generators are reseeded, and restored on exit
                torch.random.default_generator.manual_seed(seed)
                if device.type == "cuda":
                    with torch.cuda.device(device):
                        torch.cuda.manual_seed(seed)
                yield

        return seeded()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, params: Sequence[Tensor], buffers: dict[str, Tensor], x: Inputs,
                 mode: Literal["train", "dev"] = "train", seed: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits of the model at weights ``params`` and the buffers after this forward (``x``: a tensor, or a
        mapping of named inputs such as parallel text's ``src_ids`` / ``tgt_in``)."""
        self.set_mode(mode)
        new_buffers = {k: b.clone() for k, b in buffers.items()}
        weights = {**dict(zip(self.names, params, strict=True)), **new_buffers}
        args, kwargs = ((), dict(x)) if isinstance(x, Mapping) else ((x,), None)
        with self._rng(seed), differentiable_kernels():
            logits = functional_call(self.model, weights, args, kwargs)
        return logits, new_buffers


@dataclass(frozen=True)
class InnerOptimizer:
    """Heavy-ball momentum SGD as ``torch.optim.SGD`` (dampening 0, no Nesterov): lr per global step."""

    lr: float | Callable[[int], float]
    momentum: float = 0.0
    weight_decay: float = 0.0

    def lr_at(self, step: int) -> float:
        return float(self.lr(step)) if callable(self.lr) else float(self.lr)


# ----------------------------------------------------------------------------- results


@dataclass
class UnrollResult:
    """End state of an unroll and per-step training statistics (detached floats)."""

    end: InnerState
    losses: list[float] = field(default_factory=list)
    train_ce: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)


@dataclass
class HypergradResult(UnrollResult):
    """The teacher gradient (aligned with ``teacher_params``), the dev objective at w_T and bookkeeping."""

    grads: list[Tensor] = field(default_factory=list)
    objective: float = float("nan")
    dev_acc: float = float("nan")
    dev_ce: float = float("nan")
    phi_grads: tuple[Tensor, ...] = ()
    memory: MemoryMode = MemoryMode("full")
    steps_differentiated: int = 0
    #: most w-sized tensors held at once (w_t and g_t per kept step, w and v per snapshot)
    peak_stored_weights: int = 0

    @property
    def biased(self) -> bool:
        return self.memory.biased and self.steps_differentiated < len(self.losses)


def teacher_params(teacher: nn.Module | None) -> list[nn.Parameter]:
    return [] if teacher is None else [p for p in teacher.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- one step forward / backward


@dataclass
class _Saved:
    """What the adjoint step t needs: the leaves w_t and Phi_t and the graph of g_t built on them."""

    params: list[Tensor]
    phi: list[Tensor]
    grads: tuple[Tensor | None, ...]


class _Stepper:
    """Shared machinery of one unroll: the forward step and the adjoint step."""

    def __init__(self, student: FunctionalStudent, inner_loss: InnerLoss, opt: InnerOptimizer,
                 phis: tuple[Tensor, ...], batches: Sequence[Batch], t0: int, seed: int) -> None:
        self.student, self.inner_loss, self.opt = student, inner_loss, opt
        self.phis, self.batches, self.t0, self.seed = phis, batches, t0, seed
        self.stats: list[tuple[Tensor, Tensor, Tensor]] = []

    def phi(self, t: int) -> tuple[Tensor, ...]:
        return tuple(p[t] for p in self.phis)

    def step_seed(self, t: int) -> int:
        return (self.seed * 1_000_003 + self.t0 + t) % (2**62)

    def _grad(self, params: Sequence[Tensor], buffers: dict[str, Tensor], t: int,
              keep: bool) -> tuple[Tensor, dict[str, Tensor], Tensor, _Saved]:
        """Forward of batch t at (w_t, buffers_t) and g_t = dL/dw (with ``create_graph`` when ``keep``)."""
        batch = self.batches[t]
        w = [p.detach().requires_grad_(True) for p in params]
        phi = [q.detach().requires_grad_(keep) for q in self.phi(t)]
        with torch.enable_grad():
            logits, new_buffers = self.student(w, buffers, batch.x, "train", self.step_seed(t))
            loss = self.inner_loss(logits, batch.y, *phi)
            grads = torch.autograd.grad(loss, w, allow_unused=True, create_graph=keep)
        return logits, new_buffers, loss, _Saved(w, phi, grads)

    def graph(self, params: Sequence[Tensor], buffers: dict[str, Tensor], t: int) -> _Saved:
        """Rebuild step t's graph of g_t from stored (w_t, buffers_t) for its adjoint step."""
        return self._grad(params, buffers, t, keep=True)[3]

    def forward(self, state: InnerState, t: int, record: bool = False,
                keep: bool = False) -> tuple[InnerState, _Saved | None]:
        """(w_{t+1}, v_{t+1}, buffers_{t+1}) from (w_t, v_t, buffers_t) and batch t.

        ``keep=True`` builds g_t with ``create_graph`` (Phi_t as a leaf) and returns that graph, so that the
        adjoint step needs only the double backward; otherwise no graph outlives the step.
        """
        logits, buffers, loss, saved = self._grad(state.params, state.buffers, t, keep)
        with torch.no_grad():
            g = [torch.zeros_like(p) if gi is None else gi.detach()
                 for p, gi in zip(state.params, saved.grads, strict=True)]
            mu, wd, lr = self.opt.momentum, self.opt.weight_decay, self.opt.lr_at(state.step)
            v = torch._foreach_mul(state.velocity, mu) if mu else [torch.zeros_like(p) for p in g]
            torch._foreach_add_(v, g)
            if wd:
                torch._foreach_add_(v, state.params, alpha=wd)
            params = torch._foreach_add([p.detach() for p in state.params], v, alpha=-lr)
            if record:
                batch = self.batches[t]
                lg = logits.detach().float()
                self.stats.append((loss.detach(), torch.nn.functional.cross_entropy(lg, batch.y),
                                   (lg.argmax(1) == batch.y).float().mean()))
        return InnerState(params, v, buffers, state.step + 1), (saved if keep else None)

    def adjoint(self, saved: _Saved, v_tilde: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """(H_t v_tilde + lambda v_tilde, (dg_t/dPhi_t)^T v_tilde): one backward through the kept graph of g_t."""
        w, phi, g = saved.params, saved.phi, saved.grads
        n = len(w)
        pairs = [(gi, vi) for gi, vi in zip(g, v_tilde, strict=True) if gi is not None and gi.requires_grad]
        if pairs:  # the VJP of g_t with v_tilde: d<g_t, v_tilde>/d(w_t, Phi_t) without forming the product
            out = torch.autograd.grad([gi for gi, _ in pairs], w + phi, grad_outputs=[vi for _, vi in pairs],
                                      allow_unused=True)
        else:
            out = (None,) * (n + len(phi))
        wd = self.opt.weight_decay
        hv = [torch.zeros_like(p) if o is None else o for p, o in zip(w, out[:n], strict=True)]
        if wd:
            torch._foreach_add_(hv, list(v_tilde), alpha=wd)
        dphi = [torch.zeros_like(q) if o is None else o for q, o in zip(phi, out[n:], strict=True)]
        return hv, dphi

    def summaries(self) -> tuple[list[float], list[float], list[float]]:
        if not self.stats:
            return [], [], []
        stacked = torch.stack([torch.stack(s) for s in self.stats]).float().cpu()
        return stacked[:, 0].tolist(), stacked[:, 1].tolist(), stacked[:, 2].tolist()


def _phis(teacher: nn.Module | None, states: Tensor | None, T: int) -> tuple[Tensor, ...]:
    """Phi_t for every step (no graph): the teacher evaluated on the stacked states (T, S)."""
    if teacher is None:
        return ()
    if states is None or states.shape[0] != T:
        got = None if states is None else tuple(states.shape)
        raise ConfigError(f"l2t: need one teacher state per inner step ({T}), got states of shape {got}")
    with torch.no_grad():
        out = teacher(states)
    return tuple(o.detach() for o in (out if isinstance(out, tuple | list) else (out,)))


def _check_batches(batches: Sequence[Batch]) -> int:
    T = len(batches)
    if T < 1:
        raise ConfigError("l2t.inner_steps must be >= 1: the teacher gradient needs at least one inner step")
    return T


def unroll(student: FunctionalStudent, start: InnerState, batches: Sequence[Batch], inner_loss: InnerLoss,
           opt: InnerOptimizer, teacher: nn.Module | None = None, states: Tensor | None = None,
           seed: int = 0) -> UnrollResult:
    """The plain forward unroll (no storage, no gradient to the teacher): ``len(batches)`` momentum-SGD steps.

    Used between teacher episodes, for the warm start (``teacher=None``: ``inner_loss(logits, y)``) and as the
    baseline of the teacher-step cost. Raises :class:`NonFiniteHypergradientError` if the weights blow up.
    """
    T = _check_batches(batches)
    stepper = _Stepper(student, inner_loss, opt, _phis(teacher, states, T), batches, start.step, seed)
    state = start.detached()
    with student.modes():
        for t in range(T):
            state, _ = stepper.forward(state, t, record=True)
    losses, ce, acc = stepper.summaries()
    if not all(math.isfinite(v) for v in losses):
        bad = next(i for i, v in enumerate(losses) if not math.isfinite(v))
        raise NonFiniteHypergradientError(f"student loss became {losses[bad]} at inner step {start.step + bad + 1}")
    return UnrollResult(state, losses, ce, acc)


@dataclass
class _Forward:
    """The forward pass of :func:`hypergradient`: the end state and what the memory mode kept for the reverse."""

    end: InnerState
    snapshots: dict[int, InnerState]  #: checkpoint mode: (w, v, buffers) every ``interval`` steps
    graphs: dict[int, _Saved]  #: the steps whose g_t graph is kept for the adjoint
    interval: int
    peak: int  #: most w-sized tensors held at once so far


def _forward_pass(stepper: _Stepper, start: InnerState, T: int, K: int, mode: MemoryMode) -> _Forward:
    """T steps from ``start``, keeping the graphs of the last K (``full``/``truncated``) or a snapshot every
    :func:`checkpoint_interval` steps (``checkpoint``)."""
    state = start.detached()
    snapshots: dict[int, InnerState] = {}
    graphs: dict[int, _Saved] = {}
    peak = 0
    c = checkpoint_interval(T)
    for t in range(T):
        if mode.kind == "checkpoint" and t % c == 0:
            snapshots[t] = state
        keep = mode.kind != "checkpoint" and t >= T - K
        state, saved = stepper.forward(state, t, record=True, keep=keep)
        if saved is not None:
            graphs[t] = saved
        peak = max(peak, 2 * (len(snapshots) + len(graphs)))
    return _Forward(state, snapshots, graphs, c, peak)


def _dev_gradient(student: FunctionalStudent, end: InnerState, dev: Batch,
                  objective: Objective) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    """(dM/dw_T, M, dev accuracy, dev CE): the objective M on the dev batch at the end weights w_T."""
    w_T = [p.detach().requires_grad_(True) for p in end.params]
    with torch.enable_grad():
        logits, _ = student(w_T, end.buffers, dev.x, "dev")
        M = objective(logits, dev.y)
        w_hat = list(torch.autograd.grad(M, w_T, allow_unused=True))
    w_hat = [torch.zeros_like(p) if g is None else g for p, g in zip(w_T, w_hat, strict=True)]
    lg = logits.detach().float()
    dev_acc = (lg.argmax(1) == dev.y).float().mean()
    dev_ce = torch.nn.functional.cross_entropy(lg, dev.y)
    return w_hat, M, dev_acc, dev_ce


class _Adjoint:
    """The adjoint recursion (module docstring): the running (w_hat, v_hat) = (dM/dw_t, dM/dv_t), stepped back
    one inner step at a time, and the dM/dPhi_t of every step it passed."""

    def __init__(self, stepper: _Stepper, opt: InnerOptimizer, t0: int, w_hat: list[Tensor]) -> None:
        self.stepper, self.opt, self.t0 = stepper, opt, t0
        self.w_hat = w_hat
        self.v_hat = [torch.zeros_like(p) for p in w_hat]
        self.dphi: dict[int, list[Tensor]] = {}

    def step(self, saved: _Saved, t: int) -> None:
        """From (w_hat, v_hat) after step t to before it, through step t's kept graph."""
        lr = self.opt.lr_at(self.t0 + t)
        v_tilde = torch._foreach_add(self.v_hat, self.w_hat, alpha=-lr)  # dM/dg_t
        hv, self.dphi[t] = self.stepper.adjoint(saved, v_tilde)
        torch._foreach_add_(self.w_hat, hv)
        self.v_hat = (torch._foreach_mul(v_tilde, self.opt.momentum) if self.opt.momentum
                      else [torch.zeros_like(v) for v in v_tilde])


def _reverse_checkpointed(adjoint: _Adjoint, stepper: _Stepper, forward: _Forward, T: int) -> int:
    """The reverse over every step, segment by segment from the snapshots: a segment's weights are recomputed
    without graphs, then its steps are reversed with one graph alive at a time. Returns the peak storage."""
    c, snapshots, peak = forward.interval, forward.snapshots, forward.peak
    for seg_start in reversed(range(0, T, c)):
        seg_end = min(T, seg_start + c)
        s = snapshots.pop(seg_start)
        segment = [s]
        for t in range(seg_start, seg_end - 1):
            s, _ = stepper.forward(s, t)
            segment.append(s)
        peak = max(peak, 2 * len(snapshots) + len(segment) + 2)
        for t in reversed(range(seg_start, seg_end)):
            s = segment.pop()
            adjoint.step(stepper.graph(s.params, s.buffers, t), t)
    return peak


def _teacher_gradient(teacher: nn.Module, theta: list[nn.Parameter], states: Tensor,
                      dphi: dict[int, list[Tensor]]) -> tuple[list[Tensor], tuple[Tensor, ...]]:
    """dtheta = sum_t (dPhi_t/dtheta)^T dPhi_t: one VJP through the teacher on the stacked states; with the
    stacked dM/dPhi_t."""
    steps = sorted(dphi)
    grads: list[Tensor] = [torch.zeros_like(p) for p in theta]
    phi_grads: tuple[Tensor, ...] = ()
    if theta and steps:
        phi_grads = tuple(torch.stack([dphi[t][i] for t in steps]) for i in range(len(dphi[steps[0]])))
        with torch.enable_grad():
            out = teacher(states[steps[0]:steps[-1] + 1])
            out = out if isinstance(out, tuple | list) else (out,)
            dot = torch.stack([(o * d).sum() for o, d in zip(out, phi_grads, strict=True)]).sum()
            got = torch.autograd.grad(dot, theta, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(theta, got, strict=True)]
    return grads, phi_grads


def hypergradient(student: FunctionalStudent, start: InnerState, teacher: nn.Module, states: Tensor,
                  batches: Sequence[Batch], inner_loss: InnerLoss, opt: InnerOptimizer, dev: Batch,
                  objective: Objective, memory: str | MemoryMode = "full", seed: int = 0,
                  label: str = "teacher step") -> HypergradResult:
    """dM(w_T)/dtheta for the teacher ``teacher`` by the adjoint recursion of the module docstring.

    ``start``: (w_0, v_0, buffers_0) at global step ``start.step``; ``states`` (T, S): the teacher's input at
    each step; ``batches``: the T training batches; ``dev``: the dev batch of M; ``seed``: dropout seeds.
    Returns gradients aligned with the teacher's trainable parameters (``teacher_params(teacher)``), the
    dev objective, the end state and per-step statistics. A non-finite objective or gradient raises
    :class:`NonFiniteHypergradientError` naming ``label``; the teacher is never modified here.
    """
    mode = parse_memory(memory)
    T = _check_batches(batches)
    if len(dev.y) == 0:
        raise ConfigError("l2t: the teacher objective needs validation samples, but the dev batch is empty "
                          "(data.val_fraction carves the validation split from the training data)")
    theta = teacher_params(teacher)
    stepper = _Stepper(student, inner_loss, opt, _phis(teacher, states, T), batches, start.step, seed)
    K = mode.steps_differentiated(T)
    with student.modes():
        forward = _forward_pass(stepper, start, T, K, mode)
        w_hat, M, dev_acc, dev_ce = _dev_gradient(student, forward.end, dev, objective)
        adjoint = _Adjoint(stepper, opt, start.step, w_hat)
        peak = forward.peak
        if mode.kind == "checkpoint":
            peak = _reverse_checkpointed(adjoint, stepper, forward, T)
        else:
            for t in reversed(range(T - K, T)):
                adjoint.step(forward.graphs.pop(t), t)
        grads, phi_grads = _teacher_gradient(teacher, theta, states, adjoint.dphi)

    losses, ce, acc = stepper.summaries()
    value = float(M.detach())
    finite = math.isfinite(value) and all(bool(torch.isfinite(g).all()) for g in grads)
    if not finite:
        raise NonFiniteHypergradientError(
            f"non-finite hypergradient at {label} (dev objective {value:.4g}, last inner loss "
            f"{losses[-1] if losses else float('nan'):.4g}); the episode was stopped and the teacher not updated")
    return HypergradResult(forward.end, losses, ce, acc, grads=grads, objective=value, dev_acc=float(dev_acc),
                           dev_ce=float(dev_ce), phi_grads=phi_grads, memory=mode, steps_differentiated=K,
                           peak_stored_weights=peak)
