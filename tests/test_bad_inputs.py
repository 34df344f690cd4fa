"""The bad-input contract of the CLI, table-driven: every row is a user mistake (a file to create, a command
line) that must end with exit status 2 and ONE stderr line ``teachkit: error: ...`` holding the expected
fragment, never a traceback. Config files, overrides, plugins, output folders and escaped I/O errors."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from teachkit.cli import main
from tests.conftest import tiny_config

DIR = object()  #: a file-table value: make a folder


def bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML file: 9 ** levels strings written as a few dozen nodes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + f"\nname: *a{levels - 1}\n"


BINARY = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}" + bytes(range(256))
TINY = "tiny"  #: a file-table value: the tiny synthetic config (see conftest), written as YAML
SWEEP = "sweep: s\nbase: cfg.yaml\nout_dir: {tmp}/runs\nrecipe: train\n"  #: a sweep file's head (base: TINY)

# (id, argv ({tmp}: the test's folder, {cfg}: tiny config), files {name: text | bytes | DIR | TINY}, env, fragment)
ROWS: list[tuple[str, list[str], dict, dict, str]] = [
    # --- config files that are not YAML configs
    ("binary-config", ["train", "{tmp}/weights.npy"], {"weights.npy": BINARY}, {}, "is a binary file"),
    ("not-utf8-config", ["train", "{tmp}/l.yaml"], {"l.yaml": b"name: caf\xe9\n"}, {}, "is not UTF-8 text"),
    ("control-char-config", ["train", "{tmp}/c.yaml"], {"c.yaml": "name: a\x07b\n"}, {}, "is not YAML text"),
    ("folder-as-config", ["train", "{tmp}/conf"], {"conf": DIR}, {}, "is a folder, not a YAML file"),
    ("missing-config", ["train", "{tmp}/none.yaml"], {}, {}, "none.yaml' does not exist"),
    ("invalid-yaml", ["train", "{tmp}/b.yaml"], {"b.yaml": "optim: {lr: 0.1\n"}, {}, "is not valid YAML (line 2:"),
    ("scalar-config", ["train", "{tmp}/s.yaml"], {"s.yaml": "just words\n"}, {}, "must hold a mapping of keys"),
    ("list-config", ["train", "{tmp}/s.yaml"], {"s.yaml": "- a\n- b\n"}, {}, "not list ['a', 'b']"),
    ("section-scalar-in-file", ["train", "{tmp}/d.yaml"], {"d.yaml": "data: 5\n"}, {},
     "data must be a mapping of keys (data.name, ...), got int 5"),
    ("section-scalar-override", ["train", "{cfg}", "optim=3"], {"cfg.yaml": TINY}, {},
     "optim must be a mapping of keys (optim.name, ...), got int 3"),
    ("recipe-section-scalar", ["run", "prokd", "{tmp}/p.yaml"], {"p.yaml": "prokd: [1]\n"}, {},
     "prokd must be a mapping of keys (prokd.mode, ...), got list [1]"),
    ("duplicate-key-in-file", ["train", "{tmp}/d.yaml"], {"d.yaml": "optim:\n  lr: 0.1\n  lr: 0.2\n"}, {},
     "repeats key 'lr' (line 3; first given on line 2)"),
    ("duplicate-top-key", ["train", "{tmp}/d.yaml"], {"d.yaml": "name: a\ntrain: {}\nname: b\n"}, {},
     "repeats key 'name' (line 3; first given on line 1)"),
    ("duplicate-key-override", ["train", "{cfg}", "data.options={shape: [1, 8], shape: [2]}"], {"cfg.yaml": TINY},
     {}, "repeats key 'shape'"),
    ("alias-bomb", ["train", "{tmp}/bomb.yaml"], {"bomb.yaml": bomb()}, {},
     "has anchors and aliases that expand to 926,177,115 values from 29 written"),
    ("alias-bomb-override", ["train", "{cfg}", "name=[&a [x, x, x, x, x, x, x, x], " + ", ".join(
        ["[*a, *a, *a, *a, *a, *a, *a, *a]"] * 3) + "]"], {"cfg.yaml": TINY}, {}, "name=[['x', 'x', 'x'"),
    ("recursive-alias", ["train", "{tmp}/r.yaml"], {"r.yaml": "name: &n [*n]\n"}, {}, "alias inside its own anchor"),
    ("python-tag", ["train", "{tmp}/e.yaml"], {"e.yaml": "name: !!python/object/apply:os.system ['echo x']\n"}, {},
     "is not valid YAML (line 1: could not determine a constructor"),
    # --- overrides
    ("malformed-list-override", ["train", "{cfg}", "model.options.hidden=[8,"], {"cfg.yaml": TINY}, {},
     "override 'model.options.hidden=[8,' is malformed: '[8,' is not valid YAML"),
    ("malformed-mapping-override", ["train", "{cfg}", "model.options={hidden: [8]"], {"cfg.yaml": TINY}, {},
     "override 'model.options={hidden: [8]' is malformed"),
    ("unclosed-quote-override", ["train", "{cfg}", "name='abc"], {"cfg.yaml": TINY}, {}, "is malformed"),
    ("override-without-value", ["train", "{cfg}", "optim"], {"cfg.yaml": TINY}, {}, "not of the form key=value"),
    ("override-empty-key-part", ["train", "{cfg}", "optim..lr=1"], {"cfg.yaml": TINY}, {},
     "override key 'optim..lr' has an empty part"),
    ("override-through-a-value", ["train", "{cfg}", "name.x=1"], {"cfg.yaml": TINY}, {},
     "name={'x': 1} is not allowed: expected a string"),
    ("yaml12-float-is-a-number", ["train", "{cfg}", "optim.lr=-1e-3"], {"cfg.yaml": TINY}, {},
     "optim.lr=-0.001 is out of range: must be > 0.0"),
    ("yaml12-float-for-an-int", ["train", "{cfg}", "train.epochs=1e3"], {"cfg.yaml": TINY}, {},
     "train.epochs=1000.0 is not allowed: expected an integer (write 1000)"),
    ("long-value-is-cut", ["train", "{cfg}", "data.batch_size=[" + ", ".join(["12345"] * 5000) + "]"],
     {"cfg.yaml": TINY}, {}, "data.batch_size=[12345, 12345,"),
    ("bad-pad-mode", ["train", "{cfg}", "data.augment_options.pad_mode=mirror"], {"cfg.yaml": TINY}, {},
     "data.augment_options.pad_mode='mirror' is not allowed; choose one of: zeros, reflect"),
    ("unknown-top-key", ["train", "{cfg}", "trian.epochs=3"], {"cfg.yaml": TINY}, {},
     "unknown config key 'trian' (did you mean 'train'?)"),
    ("unknown-nested-key", ["train", "{cfg}", "optim.lrr=0.1"], {"cfg.yaml": TINY}, {},
     "unknown config key 'optim.lrr' (did you mean 'lr'?)"),
    ("bad-type", ["train", "{cfg}", "optim.lr=fast"], {"cfg.yaml": TINY}, {},
     "optim.lr='fast' is not allowed: expected a number"),
    ("not-finite", ["train", "{cfg}", "optim.lr=.nan"], {"cfg.yaml": TINY}, {}, "expected a finite number"),
    ("out-of-range", ["train", "{cfg}", "kd.alpha=1.5"], {"cfg.yaml": TINY}, {},
     "kd.alpha=1.5 is out of range: must be >= 0.0 and <= 1.0"),
    # --- method-zoo options (issue 14): out of range, wrong choice, a combination, what the models lack
    ("kd-divergence-choice", ["distill", "{cfg}", "kd.options.kd.divergence=kl"], {"cfg.yaml": TINY}, {},
     "kd.options.kd.divergence='kl' is not allowed"),
    ("kd-jsd-beta-range", ["distill", "{cfg}", "kd.options.kd.jsd_beta=1.5"], {"cfg.yaml": TINY}, {},
     "kd.options.kd.jsd_beta=1.5 is out of range: must be >= 0.0 and <= 1.0"),
    ("kd-top-k-with-tv", ["distill", "{cfg}", "kd.options.kd={divergence: tv, top_k: 2}"], {"cfg.yaml": TINY}, {},
     "kd.options.kd.top_k=2 applies to divergence forward_kl only, not kd.options.kd.divergence=tv"),
    ("kd-top-k-classes", ["distill", "{cfg}", "kd.options.kd.top_k=4"], {"cfg.yaml": TINY}, {},
     "kd.options.kd.top_k=4 must be below the number of classes (4): allowed 1..3"),
    ("nst-flat-stages", ["distill", "{cfg}", "kd.method=nst"], {"cfg.yaml": TINY}, {},
     "'nst' needs spatial stage maps (B, C, H, W) or (B, C, L); student stage 0 has shape (2, 16)"),
    ("fsp-flat-stages", ["distill", "{cfg}", "kd.method=fsp"], {"cfg.yaml": TINY}, {},
     "'fsp' compares consecutive stages, so it needs at least 2 stage maps on each side; the probed models pair 1"),
    ("fsp-init-epochs-range", ["distill", "{cfg}", "kd.method=fsp", "kd.options.fsp.init_epochs=-1"],
     {"cfg.yaml": TINY}, {}, "kd.options.fsp.init_epochs=-1 is out of range: must be >= 0"),
    ("ab-margin-range", ["distill", "{cfg}", "kd.method=ab", "kd.options.ab.margin=0"], {"cfg.yaml": TINY}, {},
     "kd.options.ab.margin=0.0 is out of range: must be > 0.0"),
    ("kdsvd-layout", ["distill", "{cfg}", "kd.method=kdsvd", "kd.options.kdsvd.layout=torchdistill"],
     {"cfg.yaml": TINY}, {}, "kd.options.kdsvd.layout='torchdistill' is not allowed (did you mean 'repdistiller'?); "
     "choose one of: repdistiller, mdistiller"),
    ("kdsvd-k-range", ["distill", "{cfg}", "kd.method=kdsvd", "kd.options.kdsvd.k=0"], {"cfg.yaml": TINY}, {},
     "kd.options.kdsvd.k=0 is out of range: must be >= 1"),
    ("ofd-teacher-without-batchnorm", ["distill", "{cfg}", "kd.method=ofd"], {"cfg.yaml": TINY}, {},
     "'ofd' needs the BatchNorm before each stage's ReLU for its margins, but teacher model MLP declares none; "
     "name them in teacher.model.taps.stages_bn"),
    ("mlkd-temperature-range", ["distill", "{cfg}", "kd.method=mlkd", "kd.options.mlkd.temperature=0"],
     {"cfg.yaml": TINY}, {}, "kd.options.mlkd.temperature=0.0 is out of range: must be > 0.0"),
    ("prokd-standardize-type", ["run", "prokd", "{cfg}", "prokd.logit_standardize=maybe"], {"cfg.yaml": TINY}, {},
     "prokd.logit_standardize='maybe' is not allowed"),
    ("bad-choice", ["train", "{cfg}", "optim.name=adam"], {"cfg.yaml": TINY}, {},
     "optim.name='adam' is not allowed (did you mean 'adamw'?); choose one of: sgd, adamw, dot"),
    ("unknown-model", ["train", "{cfg}", "model.name=resnet2O"], {"cfg.yaml": TINY}, {}, "unknown model 'resnet2O'"),
    ("unknown-recipe", ["run", "nosuch", "{cfg}"], {"cfg.yaml": TINY}, {}, "unknown recipe 'nosuch'"),
    ("callback-option-range", ["train", "{cfg}", "train.callbacks=[{name: early_stop, options: {patience: 0}}]"],
     {"cfg.yaml": TINY}, {}, "train.callbacks[0].options.patience=0 is out of range: must be >= 1"),
    ("callback-not-a-name", ["train", "{cfg}", "train.callbacks=[3]"], {"cfg.yaml": TINY}, {},
     "train.callbacks[0]=3 is not allowed: expected a string or a mapping"),
    ("unknown-callback", ["train", "{cfg}", "train.callbacks=[early_sotp]"], {"cfg.yaml": TINY}, {},
     "train.callbacks[0]: unknown callback 'early_sotp' (did you mean 'early_stop'?); choose one of: early_stop"),
    # --- optimiser values
    ("adamw-beta-1", ["train", "{cfg}", "optim.name=adamw", "optim.betas=[0.9, 1.0]"], {"cfg.yaml": TINY}, {},
     "optim.betas=[0.9, 1.0] is not allowed: expected two numbers in [0, 1)"),
    ("adamw-beta-negative", ["train", "{cfg}", "optim.betas=[-0.1, 0.999]"], {"cfg.yaml": TINY}, {},
     "optim.betas=[-0.1, 0.999] is not allowed"),
    ("adamw-one-beta", ["train", "{cfg}", "optim.betas=[0.9]"], {"cfg.yaml": TINY}, {},
     "optim.betas=[0.9] is not allowed: expected two numbers"),
    ("adamw-betas-text", ["train", "{cfg}", "optim.betas=fast"], {"cfg.yaml": TINY}, {},
     "optim.betas='fast' is not allowed: expected a list of a number"),
    ("teacher-betas", ["distill", "{cfg}", "teacher.optim.betas=[0.9, 2]"], {"cfg.yaml": TINY}, {},
     "teacher.optim.betas=[0.9, 2.0] is not allowed"),
    ("optim-implementation-bogus", ["train", "{cfg}", "optim.implementation=turbo"], {"cfg.yaml": TINY}, {},
     "optim.implementation='turbo' is not allowed; choose one of: auto, loop, foreach, fused"),
    ("teacher-inference-bogus", ["distill", "{cfg}", "teacher.inference=bogus"], {"cfg.yaml": TINY}, {},
     "teacher.inference='bogus' is not allowed; choose one of: auto, fold, plain"),
    ("gamma-zero", ["train", "{cfg}", "optim.gamma=0"], {"cfg.yaml": TINY}, {}, "optim.gamma=0.0 is out of range"),
    ("milestone-not-int", ["train", "{cfg}", "optim.milestones=[1.5]"], {"cfg.yaml": TINY}, {},
     "optim.milestones[0]=1.5 is not allowed: expected an integer"),
    ("dot-delta-range", ["distill", "{cfg}", "optim.name=dot", "optim.dot_delta=0.2"], {"cfg.yaml": TINY}, {},
     "optim.dot_delta=0.2 is out of range for optim.momentum=0.9: DOT's momenta"),
    ("dot-fp16", ["distill", "{cfg}", "optim.name=dot", "train.precision=fp16"], {"cfg.yaml": TINY}, {},
     "optim.name=dot keeps the task and distillation gradients apart, which fp16's gradient scaler does not support"),
    ("dot-grad-clip", ["distill", "{cfg}", "optim.name=dot", "optim.grad_clip=1"], {"cfg.yaml": TINY}, {},
     "optim.name=dot does not support optim.grad_clip=1.0"),
    # --- speed settings
    ("precision-unknown", ["train", "{cfg}", "train.precision=fp8"], {"cfg.yaml": TINY}, {},
     "train.precision='fp8' is not allowed; choose one of: auto, fp32, bf16, fp16"),
    ("channels-last-word", ["train", "{cfg}", "train.channels_last=nhwc"], {"cfg.yaml": TINY}, {},
     "train.channels_last='nhwc' is not allowed: expected true/false or one of 'auto'"),
    ("compile-word", ["train", "{cfg}", "train.compile=maybe"], {"cfg.yaml": TINY}, {},
     "train.compile='maybe' is not allowed: expected true/false or one of 'auto'"),
    ("sync-batchnorm-number", ["train", "{cfg}", "train.sync_batchnorm=2"], {"cfg.yaml": TINY}, {},
     "train.sync_batchnorm=2 is not allowed: expected true/false"),
    # --- plugins
    ("plugin-missing-flag", ["train", "{cfg}", "--plugin", "badin_nosuch"], {"cfg.yaml": TINY}, {},
     "plugin 'badin_nosuch' cannot be imported: ModuleNotFoundError: No module named 'badin_nosuch'"),
    ("plugin-missing-config", ["train", "{tmp}/p.yaml"], {"p.yaml": "plugins: [badin_nosuch]\n"}, {},
     "plugin 'badin_nosuch' cannot be imported"),
    ("plugin-missing-env", ["train", "{cfg}"], {"cfg.yaml": TINY}, {"TEACHKIT_PLUGINS": "json,badin_nosuch"},
     "plugin 'badin_nosuch' cannot be imported"),
    ("plugin-missing-dependency", ["train", "{cfg}", "--plugin", "badin_dep"],
     {"cfg.yaml": TINY, "badin_dep.py": "import badin_not_installed\n"}, {},
     "plugin 'badin_dep' cannot be imported: ModuleNotFoundError: No module named 'badin_not_installed'"),
    ("plugin-syntax-error", ["train", "{cfg}", "--plugin", "badin_syntax"],
     {"cfg.yaml": TINY, "badin_syntax.py": "def f(:\n"}, {}, "plugin 'badin_syntax' cannot be imported: SyntaxError"),
    ("plugin-reuses-a-name", ["train", "{cfg}", "--plugin", "badin_dup"],
     {"cfg.yaml": TINY, "badin_dup.py": "from teachkit.data import DATASETS\nDATASETS.register('synthetic')(len)\n"},
     {}, "plugin 'badin_dup': dataset 'synthetic' registered twice"),
    ("plugins-not-a-list", ["train", "{cfg}", "plugins=json"], {"cfg.yaml": TINY}, {},
     "plugins='json' is not allowed: expected a list of a string"),
    ("plugin-not-a-module-name", ["train", "{cfg}", "plugins=[my-lab/x.py]"], {"cfg.yaml": TINY}, {},
     "plugin 'my-lab/x.py' is not a module name"),
    ("plugin-missing-list", ["list", "--plugin", "badin_nosuch"], {}, {}, "plugin 'badin_nosuch' cannot be imported"),
    ("plugin-missing-eval", ["eval", "{tmp}/x.safetensors", "--plugin", "badin_nosuch"], {"x.safetensors": b"x"},
     {}, "plugin 'badin_nosuch' cannot be imported"),
    ("plugin-raises-runtime-error", ["train", "{cfg}", "--plugin", "badin_boom"],
     {"cfg.yaml": TINY, "badin_boom.py": "raise RuntimeError('CUDA driver missing')\n"}, {},
     "plugin 'badin_boom' failed while being imported (RuntimeError: CUDA driver missing)"),
    ("plugin-raises-env", ["train", "{cfg}"], {"cfg.yaml": TINY, "badin_boomenv.py": "1 / 0\n"},
     {"TEACHKIT_PLUGINS": "badin_boomenv"}, "plugin 'badin_boomenv' failed while being imported (ZeroDivisionError"),
    ("plugin-exits-eval", ["eval", "{tmp}/x.safetensors", "--plugin", "badin_exit"],
     {"x.safetensors": b"x", "badin_exit.py": "import sys\nsys.exit(3)\n"}, {},
     "plugin 'badin_exit' failed while being imported (SystemExit: 3)"),
    # --- model factories (package.module:callable)
    ("factory-os-system", ["train", "{cfg}", "model.name=os:system", "model.options={command: 'touch PWNED'}"],
     {"cfg.yaml": TINY}, {}, "model.name 'os:system' resolves to 'os', part of the Python standard library"),
    ("factory-subprocess", ["train", "{cfg}", "model.name=subprocess:Popen"], {"cfg.yaml": TINY}, {},
     "resolves to 'subprocess', part of the Python standard library"),
    ("factory-builtins", ["train", "{cfg}", "model.name=builtins:exec"], {"cfg.yaml": TINY}, {},
     "resolves to 'builtins', part of the Python standard library"),
    ("factory-not-a-module", ["train", "{cfg}", "model.name=badin_int:make", "model.options={}"],
     {"cfg.yaml": TINY, "badin_int.py": "def make(input_shape, num_classes):\n    return 5\n"}, {},
     "model 'badin_int:make' returned a int, not an nn.Module"),
    ("factory-raises", ["train", "{cfg}", "model.name=badin_raise:make", "model.options={}"],
     {"cfg.yaml": TINY, "badin_raise.py": "def make(input_shape, num_classes):\n    raise ValueError('no GPU')\n"},
     {}, "model 'badin_raise:make' raised ValueError while being built: no GPU"),
    ("factory-no-parameters", ["train", "{cfg}", "model.name=torch.nn:Flatten", "model.options={}"],
     {"cfg.yaml": TINY}, {}, "model 'torch.nn:Flatten' (Flatten) has no parameters: nothing to train"),
    ("factory-wrong-width", ["train", "{cfg}", "model.name=badin_wide:make", "model.options={}"],
     {"cfg.yaml": TINY, "badin_wide.py": "from torch import nn\ndef make(input_shape):\n"
                                         "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 13))\n"}, {},
     "model 'badin_wide:make' outputs 13 values per sample but dataset 'synthetic' has 4 classes"),
    ("factory-forward-fails", ["train", "{cfg}", "model.name=badin_shape:make", "model.options={}"],
     {"cfg.yaml": TINY, "badin_shape.py": "from torch import nn\ndef make(num_classes):\n"
                                          "    return nn.Linear(5, num_classes)\n"}, {},
     "model 'badin_shape:make' fails on a batch of the data (inputs (2, 1, 8, 8)): RuntimeError"),
    # --- output folders and escaped I/O errors
    ("demo-out-is-a-file", ["demo", "--out", "{tmp}/out.txt", "--quick"], {"out.txt": "x"}, {},
     "demo --out '{tmp}/out.txt' is a file, not a folder"),
    ("demo-out-under-a-file", ["demo", "--out", "{tmp}/out.txt/demo", "--quick"], {"out.txt": "x"}, {},
     "is under '{tmp}/out.txt', which is a file"),
    ("demo-no-seeds", ["demo", "--seeds", "0", "--quick", "--out", "{tmp}/d"], {}, {},
     "demo --seeds 0 is out of range"),
    ("out-dir-under-a-file", ["train", "{cfg}", "out_dir={tmp}/f/runs"], {"cfg.yaml": TINY, "f": "x"}, {},
     "'{tmp}/f' is a file, not a folder (check out_dir)"),
    ("run-folder-is-a-file", ["train", "{cfg}", "name=taken"], {"cfg.yaml": TINY, "runs/taken": "x"}, {},
     "'{tmp}/runs/taken' is a file, not a folder"),
    ("escaped-os-error", ["train", "{cfg}", "name=r"], {"cfg.yaml": TINY, "runs/r/config.yaml": DIR}, {},
     "cannot write '{tmp}/runs/r/config.yaml': Is a directory"),
    # --- eval
    ("eval-missing-checkpoint", ["eval", "{tmp}/none.safetensors"], {}, {}, "does not exist"),
    ("eval-config-as-checkpoint", ["eval", "{cfg}"], {"cfg.yaml": TINY}, {}, "is unreadable"),
    ("eval-empty-folder", ["eval", "{tmp}/empty"], {"empty": DIR}, {}, "checkpoints/last.safetensors' does not exist"),
    # --- sweep and report
    ("sweep-unknown-key", ["sweep", "{tmp}/s.yaml"], {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {kd.methd: [kd]}\n"},
     {}, "sweep key 'kd.methd' does not exist: no 'methd' under kd (did you mean 'method'?)"),
    ("sweep-empty-grid", ["sweep", "{tmp}/s.yaml"], {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {}\n"}, {},
     "sweep grid is empty"),
    ("sweep-empty-values", ["sweep", "{tmp}/s.yaml"], {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {train.seed: []}\n"},
     {}, "sweep grid.train.seed is an empty list"),
    ("sweep-conflicting-keys", ["sweep", "{tmp}/s.yaml"],
     {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {kd.method: [kd]}\nlist: [{kd.method: dist}]\n"}, {},
     "'kd.method' is given both in the grid and in list[0]"),
    ("sweep-bad-value", ["sweep", "{tmp}/s.yaml"], {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {optim.lr: [-1]}\n"},
     {}, "sweep run 'lr=-1': optim.lr=-1"),
    ("sweep-unknown-recipe", ["sweep", "{tmp}/s.yaml"],
     {"cfg.yaml": TINY, "s.yaml": SWEEP + "list: [{recipe: prokdd}]\n"}, {},
     "unknown recipe 'prokdd' (did you mean 'prokd'?)"),
    ("sweep-foreign-run-folder", ["sweep", "{tmp}/s.yaml"],
     {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {train.seed: [0, 1]}\n",
      "runs/s/seed=1/sweep.json": '{"sweep": "other", "run": "seed=1", "role": "student"}'}, {},
     "was made by sweep 'other' (run 'seed=1'), not by this sweep 's'"),
    ("sweep-hand-made-run-folder", ["sweep", "{tmp}/s.yaml"],
     {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid: {train.seed: [0, 1]}\n", "runs/s/seed=0/config.yaml": "name: x\n"},
     {}, "was not made by a sweep"),
    ("sweep-workers-zero", ["sweep", "{tmp}/s.yaml", "--workers", "0"], {"cfg.yaml": TINY, "s.yaml": SWEEP}, {},
     "--workers 0 is out of range: must be >= 1"),
    ("sweep-unknown-backend", ["sweep", "{tmp}/s.yaml", "--backend", "slurm"], {"cfg.yaml": TINY, "s.yaml": SWEEP},
     {}, "--backend 'slurm' is not allowed; choose local or ray"),
    ("sweep-missing-file", ["sweep", "{tmp}/none.yaml"], {}, {}, "none.yaml' does not exist"),
    ("sweep-unknown-override", ["sweep", "{tmp}/s.yaml", "data.rot=/x"], {"cfg.yaml": TINY, "s.yaml": SWEEP}, {},
     "sweep key 'data.rot' does not exist"),
    # --- mnist_full (the classic mnist.pkl.gz) and the L2T-DLF teacher options
    ("mnist-full-verify-not-bool", ["train", "{cfg}", "data.name=mnist_full", "data.options={verify: maybe}"],
     {"cfg.yaml": TINY}, {}, "dataset 'mnist_full' option 'verify' must be true or false, got 'maybe'"),
    ("mnist-full-unknown-option", ["train", "{cfg}", "data.name=mnist_full", "data.options={vrify: false}"],
     {"cfg.yaml": TINY}, {}, "unknown option 'vrify' for dataset 'mnist_full' (did you mean 'verify'?)"),
    ("mnist-full-missing-file", ["train", "{cfg}", "data.name=mnist_full", "data.options={}",
                                 "data.root={tmp}/none"], {"cfg.yaml": TINY}, {}, "no mnist.pkl.gz at"),
    ("mnist-full-pickle-runs-code", ["train", "{cfg}", "data.name=mnist_full", "data.options={verify: false}",
                                     "data.root={tmp}/d"],
     {"cfg.yaml": TINY, "d/mnist.pkl.gz": gzip.compress(b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x85R.")},
     {}, "refusing to unpickle global 'os.system'"),
    ("mnist-full-wrong-digest", ["train", "{cfg}", "data.name=mnist_full", "data.options={}", "data.root={tmp}/d"],
     {"cfg.yaml": TINY, "d/mnist.pkl.gz": gzip.compress(b"\x80\x02N.")}, {}, "not the classic mnist.pkl.gz"),
    ("l2t-attention-k-zero", ["run", "l2t", "{cfg}", "l2t.teacher_model=attention", "l2t.attention_k=0"],
     {"cfg.yaml": TINY}, {}, "l2t.attention_k=0"),
    ("l2t-gate-hidden-negative", ["run", "l2t", "{cfg}", "l2t.gate_hidden=-1"], {"cfg.yaml": TINY}, {},
     "l2t.gate_hidden=-1"),
    ("l2t-unknown-teacher-model", ["run", "l2t", "{cfg}", "l2t.teacher_model=transformer"], {"cfg.yaml": TINY}, {},
     "l2t.teacher_model"),
    ("report-missing-folder", ["report", "{tmp}/none"], {}, {}, "none"),
    ("report-no-runs", ["report", "{tmp}/empty"], {"empty": DIR}, {}, "no run folders"),
    ("report-empty-run-config", ["report", "{tmp}/runs"], {"runs/a/config.yaml": "", "runs/a/summary.json": "{}"},
     {}, "has an empty config.yaml, so its settings are unknown"),
    ("predict-missing-input", ["predict", "{tmp}/run", "{tmp}/none.csv"], {"run": DIR}, {},
     "none.csv' does not exist"),
    ("predict-not-a-run", ["predict", "{tmp}/run", "{tmp}/in.csv"], {"run": DIR, "in.csv": "a\n1\n"}, {},
     "holds no checkpoints/best.safetensors and no model.safetensors"),
    ("predict-out-folder-missing", ["predict", "{tmp}/run", "{tmp}/in.csv", "--out", "{tmp}/no/p.csv"],
     {"run": DIR, "in.csv": "a\n1\n"}, {}, "p.csv': its folder"),
    ("export-not-a-run", ["export", "{tmp}/nothing", "{tmp}/exp"], {}, {}, "does not exist (expected a run folder"),
    ("list-unknown-name", ["list", "losses", "kdd"], {}, {}, "no loss named 'kdd'"),
    ("list-name-without-kind", ["list", "all", "kd"], {}, {}, "name a kind first"),
    ("teacher-taps-unknown-key", ["distill", "{cfg}", "teacher.checkpoint={tmp}/run", "teacher.taps.embeding=fc"],
     {"cfg.yaml": TINY, "run": DIR}, {}, "teacher.taps.embeding"),
    ("text-table-missing-train", ["train", "{tmp}/t.yaml"],
     {"t.yaml": "data: {name: text_table, options: {train: none.csv}}\nmodel: {name: mlp}\n"}, {}, "none.csv"),
    ("sweep-missing-data-file", ["sweep", "{tmp}/s.yaml"],
     {"cfg.yaml": TINY, "s.yaml": SWEEP + "grid:\n  data.root: [{tmp}/none.csv]\n"}, {}, "none.csv"),
]


def make_files(tmp_path: Path, files: dict) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            path.mkdir(parents=True, exist_ok=True)
        elif content == TINY:
            path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{tmp}", str(tmp_path)))


def expand(argv: list[str], tmp_path: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp_path)).replace("{cfg}", str(tmp_path / "cfg.yaml")) for a in argv]


def test_row_count():
    assert len(ROWS) == 130 and len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("argv, files, env, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, files, env, fragment):
    make_files(tmp_path, files)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TEACHKIT_PLUGINS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        code = main(expand(argv, tmp_path))
    except BaseException as e:  # noqa: BLE001 -- any escape is the traceback this contract forbids
        pytest.fail(f"Traceback: {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and len(err) < 1000, err
    assert fragment.replace("{tmp}", str(tmp_path)) in err, err


SUBPROCESS_ROWS = ("binary-config", "alias-bomb", "malformed-list-override", "demo-out-is-a-file",
                   "plugin-missing-env", "escaped-os-error", "factory-os-system", "factory-no-parameters")


@pytest.mark.parametrize("row", SUBPROCESS_ROWS)
def test_bad_input_from_a_real_process(tmp_path, row):
    """A few rows through ``python -m teachkit.cli``: stderr is exactly one line and holds no traceback."""
    _, argv, files, env, fragment = next(r for r in ROWS if r[0] == row)
    make_files(tmp_path, files)
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    if "TEACHKIT_PLUGINS" not in env:
        full.pop("TEACHKIT_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-m", "teachkit.cli", *expand(argv, tmp_path)], capture_output=True,
                          text=True, env=full, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and fragment.replace("{tmp}", str(tmp_path)) in proc.stderr, proc.stderr
