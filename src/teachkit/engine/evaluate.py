"""Evaluation: top-1 (and top-5 when there are at least 20 classes) accuracy and CE loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from teachkit.data.base import TensorSplit


@torch.no_grad()
def predict(model: nn.Module, split: TensorSplit, batch_size: int = 1000) -> torch.Tensor:
    """Logits of ``model`` (in eval mode) for every sample of ``split``, in order."""
    was_training = model.training
    model.eval()
    outs = [model(split.x[i:i + batch_size]).float() for i in range(0, len(split), batch_size)]
    model.train(was_training)
    return torch.cat(outs) if outs else torch.empty(0)


def metrics_from_logits(logits: torch.Tensor, y: torch.Tensor, omitted: tuple[int, ...] = ()) -> dict[str, float]:
    """Top-1 % and CE; top-5 % for C >= 20; with ``omitted`` classes also ``acc_omitted`` / ``acc_kept``."""
    hit = logits.argmax(1) == y
    out = {"acc": hit.float().mean().item() * 100, "loss": F.cross_entropy(logits, y).item()}
    if omitted:
        mask = torch.zeros(logits.shape[1], dtype=torch.bool, device=y.device)
        mask[list(omitted)] = True
        is_omitted = mask[y]
        out["acc_omitted"] = hit[is_omitted].float().mean().item() * 100 if is_omitted.any() else float("nan")
        out["acc_kept"] = hit[~is_omitted].float().mean().item() * 100 if (~is_omitted).any() else float("nan")
    if logits.shape[1] >= 20:
        top5 = logits.topk(5, dim=1).indices
        out["top5"] = (top5 == y[:, None]).any(1).float().mean().item() * 100
    return out


def evaluate(model: nn.Module, split: TensorSplit, batch_size: int = 1000,
             omitted: tuple[int, ...] = ()) -> dict[str, float]:
    """{"acc": top-1 %, "loss": mean CE, "top5": % (C >= 20 only), "acc_omitted"/"acc_kept" (zero-/few-shot
    runs)} of ``model`` on ``split``."""
    return metrics_from_logits(predict(model, split, batch_size), split.y, omitted)
