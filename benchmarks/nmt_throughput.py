"""Translation throughput and L2T-DLF memory, measured in one run.

(a) Training, through the real recipes on the generated ``toy_translation`` corpus: target tokens per second of
    the student's CE epochs (``train``), of word-level KD with the teacher run on every batch
    (``teacher.cache=off``) and with the teacher's per-token distribution cached (``teacher.cache=auto``);
    median epoch time after the first (the engine's training time, evaluation excluded).
(b) Decoding: sentences per second of greedy and beam search (width 5) on the test split, student and teacher,
    batches of ``--decode-batch`` sentences sorted by length (``translate_split``).
(c) The L2T-DLF teacher step (``--inner-steps`` SGD steps of an LSTM-attention student under the per-token
    dynamic loss, then the exact hypergradient) in ``full`` and ``checkpoint`` memory modes: the peak memory the
    step adds (each mode in a fresh process; Linux: the peak resident set is reset just before the step through
    ``/proc/self/clear_refs`` and its new peak minus the resident set before it; CUDA: peak allocated memory)
    and its time.

    python benchmarks/nmt_throughput.py [--pairs 4000] [--epochs 3] [--hidden 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from teachkit.config import from_dict
from teachkit.data.parallel import DecodeOptions
from teachkit.experiments.stats import median_after_first
from teachkit.models.decoding import translate_split
from teachkit.recipes import distill, train_model
from teachkit.recipes.common import load_data


def base(args: argparse.Namespace, out: Path) -> dict:
    student = {"name": "lstm_attn", "options": {"layers": 1, "embed_dim": args.hidden, "hidden": args.hidden}}
    teacher = {"name": "transformer_seq2seq", "options": {"encoder_layers": args.teacher_layers,
                                                          "decoder_layers": args.teacher_layers,
                                                          "d_model": args.teacher_width, "heads": 4,
                                                          "ffn": 2 * args.teacher_width}}
    optim = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "schedule": "constant"}
    return {"out_dir": str(out),
            "data": {"name": "toy_translation", "batch_size": 512, "eval_batch_size": args.decode_batch,
                     "options": {"train": args.pairs, "valid": 100, "test": args.test,
                                 "max_tokens": args.max_tokens}},
            "model": student, "optim": optim,
            "train": {"epochs": args.epochs, "progress": False, "device": args.device},
            "teacher": {"model": teacher, "optim": optim, "epochs": 1},
            "kd": {"method": "kd", "alpha": 0.5, "temperature": 1.0}}


def tokens_per_s(history: list[dict], tokens: int) -> float:
    return tokens / median_after_first([r["epoch_time_s"] for r in history])


def decode_rate(model: torch.nn.Module, x, strategy: str, batch: int) -> float:
    options = DecodeOptions(strategy=strategy, beam=5)
    t = time.perf_counter()
    translate_split(model, x, options, batch)
    return x.num_rows / (time.perf_counter() - t)


def _proc_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def l2t_step(mode: str, hidden: int, steps: int, device: str) -> dict:
    """One L2T-DLF teacher step on an LSTM student (run in its own process) and the peak memory it adds."""
    from teachkit.data.parallel import TokenBatchLoader
    from teachkit.models import build_model
    from teachkit.recipes.l2t import FunctionalStudent, InnerOptimizer, build_teacher, hypergradient
    from teachkit.recipes.l2t.loss import dev_cross_entropy, l2t_student_loss

    cfg = from_dict({"data": {"name": "toy_translation", "options": {"train": 40 * steps, "valid": 64, "test": 16}}})
    splits = load_data(cfg.data, device)
    torch.manual_seed(0)
    model = build_model("lstm_attn", splits.input_shape, splits.num_classes, embed_dim=hidden, hidden=hidden,
                        dropout=0.0).to(device)
    batches = list(TokenBatchLoader(splits.train.x, 32, seed=0).batches(0))[:steps]
    dev = next(iter(TokenBatchLoader(splits.val.x, 64, shuffle=False).batches(0)))
    student = FunctionalStudent(model)
    teacher = build_teacher("gated", splits.num_classes, 5, diagonal=True).to(device)
    states = torch.rand(steps, 5, device=device)
    out = {"mode": mode, "params": sum(p.numel() for p in model.parameters()), "steps": steps}
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set (VmHWM) starts again from now
        before = _proc_kib("VmRSS") * 1024
    t = time.perf_counter()
    res = hypergradient(student, student.initial_state(), teacher, states, batches,
                        lambda z, y, W, b: l2t_student_loss(z, y, W, b), InnerOptimizer(0.1, 0.0), dev,
                        dev_cross_entropy, mode)
    out["time_s"] = time.perf_counter() - t
    out["stored_weights"] = res.peak_stored_weights
    peak = torch.cuda.max_memory_allocated() if cuda else _proc_kib("VmHWM") * 1024
    out["peak_added_bytes"] = peak - before
    return out


def l2t_memory(args: argparse.Namespace) -> list[dict]:
    rows = []
    for mode in ("full", "checkpoint"):
        proc = subprocess.run([sys.executable, __file__, "--l2t-child", mode, "--hidden", str(args.hidden),
                               "--inner-steps", str(args.inner_steps), "--device", args.device],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=4000, help="training pairs of toy_translation")
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256, help="LSTM student width (the L2T-DLF seed: 256)")
    ap.add_argument("--teacher-layers", type=int, default=2)
    ap.add_argument("--teacher-width", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--decode-batch", type=int, default=128)
    ap.add_argument("--inner-steps", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-l2t", action="store_true")
    ap.add_argument("--l2t-child", choices=["full", "checkpoint"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.l2t_child:
        print(json.dumps(l2t_step(args.l2t_child, args.hidden, args.inner_steps, args.device)))
        return
    out = Path(tempfile.mkdtemp(prefix="teachkit-nmt-bench-"))
    cfg = base(args, out)
    teacher = train_model(from_dict({**cfg, "name": "teacher", "model": cfg["teacher"]["model"],
                                     "train": {**cfg["train"], "epochs": 1}}))
    splits = load_data(from_dict(cfg).data, args.device)
    tokens = int(splits.train.x.tgt_lengths().sum())
    runs = {"ce": train_model(from_dict({**cfg, "name": "ce"}))}
    for mode in ("off", "auto"):
        runs[f"kd-{mode}"] = distill(from_dict({**cfg, "name": f"kd-{mode}", "teacher": {
            **cfg["teacher"], "checkpoint": str(teacher.run_dir), "cache": mode}}))
    device = torch.device(args.device)
    print(f"device {device} ({torch.get_num_threads()} threads); toy_translation {len(splits.train)} training pairs "
          f"({tokens} target tokens), vocabulary {splits.num_classes}; student lstm_attn {args.hidden}/{args.hidden}, "
          f"teacher transformer {args.teacher_layers}+{args.teacher_layers} d{args.teacher_width}; "
          f"max_tokens {args.max_tokens}; {args.epochs} epochs (median epoch after the first)")
    print("\n(a) training")
    print("| run | target tokens/s | x CE |")
    print("|---|---|---|")
    ce = tokens_per_s(runs["ce"].history, tokens)
    for label, key in (("CE", "ce"), ("word-KD, teacher per batch", "kd-off"), ("word-KD, cached teacher", "kd-auto")):
        rate = tokens_per_s(runs[key].history, tokens)
        print(f"| {label} | {rate:,.0f} | {rate / ce:.2f} |")
    cache = runs["kd-auto"].summary.get("teacher_cache", {})
    print(f"cache: {cache.get('status')} {cache.get('bytes', 0) / 1e6:.1f} MB; uncached / cached tokens/s ratio "
          f"{tokens_per_s(runs['kd-off'].history, tokens) / tokens_per_s(runs['kd-auto'].history, tokens):.2f}")
    print("\n(b) decoding, test split")
    print("| model | greedy sentences/s | beam 5 sentences/s |")
    print("|---|---|---|")
    x = splits.test.x
    for label, model in (("student (lstm_attn)", runs["ce"].model), ("teacher (transformer)", teacher.model)):
        model = model.to(device)
        print(f"| {label} | {decode_rate(model, x, 'greedy', args.decode_batch):,.0f} | "
              f"{decode_rate(model, x, 'beam', args.decode_batch):,.0f} |")
    if args.skip_l2t:
        return
    print(f"\n(c) L2T-DLF teacher step: {args.inner_steps} inner steps, lstm_attn {args.hidden}/{args.hidden}, "
          "batches of 32 sentences, per-token dynamic loss (diagonal Phi)")
    modes = l2t_memory(args)
    print("| memory mode | peak memory added (MB) | w-sized tensors held at once | time s |")
    print("|---|---|---|---|")
    for r in modes:
        print(f"| {r['mode']} | {r['peak_added_bytes'] / 1e6:.1f} | {r['stored_weights']} | {r['time_s']:.2f} |")
    full, ckpt = modes
    print(f"student parameters: {full['params']:,} ({full['params'] * 4 / 1e6:.1f} MB in fp32); peak memory full / "
          f"checkpoint: {full['peak_added_bytes'] / max(1, ckpt['peak_added_bytes']):.2f}; time checkpoint / full: "
          f"{ckpt['time_s'] / full['time_s']:.2f}")


if __name__ == "__main__":
    main()
