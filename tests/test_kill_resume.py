"""kill -9 at random moments, then ``--resume`` until the run finishes: every checkpoint of the run folder is
bit-identical to an uninterrupted run's and its logs (``metrics.jsonl``; L2T's ``phi_log.jsonl`` and
``teacher_log.jsonl``) hold the same records (timing fields aside), for plain training, distillation (CRD's
memory bank, an in-command teacher), Pro-KD (a teacher trained online, interleaved with the student),
L2T-DLF (a loss teacher trained by hypergradients, then a student driven by it), sequence-level KD for
translation (a Transformer teacher trained in the command, its beam translations, an LSTM student) and causal
language models (token-level KD, on-policy GKD with its sampled responses, Pro-KD following a teacher trained online).

The kills land densely around the run folder's writes. A watcher (inotify) sees every file the run creates,
renames into place or appends to, and each attempt is killed at a randomly chosen such event:

- ``tmp``: the n-th temporary file appears, i.e. inside an atomic write (``save_checkpoint``, a JSON file);
- ``saved``: a few random microseconds after the n-th checkpoint is renamed into place (before its sidecar,
  before the epoch's metrics line, ...);
- ``line``: the n-th line appended to a ``*.jsonl`` log (between an L2T log line and its checkpoint, ...);
- ``time``: at a random time, wherever the run is.

The runs are ``teachkit.cli.main`` in children forked from one clean process that imported torch and every
teachkit module once (a "zygote": it only imports, never computes, so each child starts as a fresh
``python -m teachkit.cli`` would, without paying ~2 s of imports each time), so a case costs its training
time rather than interpreter start-ups.
Linux only (fork, inotify).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import tiny_config, untimed

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kill soak forks and uses inotify (Linux)")

L2T = ["l2t.teacher_steps=4", "l2t.inner_steps=3", "l2t.warm_start_steps=2", "l2t.dev_batch_size=16",
       "l2t.episode_gap=1", "l2t.teacher_lr=0.01"]
#: translation: a generated corpus, an LSTM student and a Transformer teacher trained in the command
NMT = ["data.name=toy_translation", "data.options={train: 60, valid: 10, test: 10}", "data.batch_size=16",
       "model={name: lstm_attn, options: {embed_dim: 8, hidden: 8}}", "teacher.epochs=2",
       "teacher.model={name: transformer_seq2seq, options: {encoder_layers: 1, decoder_layers: 1, d_model: 8, "
       "heads: 2, ffn: 16}}", "seqkd.beam=2", "train.epochs=6"]
#: causal LM: 2-digit addition, llama-tiny student and teacher (trained in the command), AdamW
LM = ["data={name: addition, batch_size: 32, eval_batch_size: 64, options: {digits: 2, train: 160, valid: 16, "
      "test: 16}}", "model={name: hf_causal_lm, options: {preset: llama-tiny}}", "optim={name: adamw, lr: 0.003}",
      "teacher.model={name: hf_causal_lm, options: {preset: llama-tiny}}", "teacher.optim={name: adamw, lr: 0.003}",
      "teacher.epochs=3", "kd={method: kd, alpha: 0.5, temperature: 1.0}"]
CASES = {
    "train": (["train"], ["train.epochs=12"]),  # its epochs are the shortest
    "distill-crd": (["distill"], ["kd.method=[crd, kd]", "teacher.epochs=3"]),
    "prokd-online": (["run", "prokd"], ["teacher.epochs=3", "prokd.tau_max=3"]),
    "l2t": (["run", "l2t"], L2T),
    "seqkd-translation": (["run", "seqkd"], NMT),
    "lm-token-kd": (["distill"], LM),
    "lm-gkd": (["run", "gkd"], [*LM, "gkd.lmbda=0.5", "gkd.max_new_tokens=4"]),
    "lm-prokd": (["run", "prokd"], [*LM, "prokd.tau_max=3", "prokd.loss=kl"]),
}
EPOCHS = 8
#: kills per case (then the run is left to finish) and the seed of their plans; a longer soak:
#: TEACHKIT_SOAK_KILLS=40 TEACHKIT_SOAK_SEED=7 pytest tests/test_kill_resume.py -s
KILLS = int(os.environ.get("TEACHKIT_SOAK_KILLS", "10"))
SEED = os.environ.get("TEACHKIT_SOAK_SEED", "")
PLANS = ("tmp", "line", "saved", "tmp", "saved", "line", "tmp", "time")
LOGS = ("metrics.jsonl", "phi_log.jsonl", "teacher_log.jsonl")

ZYGOTE = r"""
import importlib, json, os, pkgutil, select, sys, traceback
import torch
import torch._dynamo  # noqa: F401  (what torch.optim imports on first use: most of a run's start-up)
import teachkit
import teachkit.cli as cli

for mod in pkgutil.walk_packages(teachkit.__path__, "teachkit."):  # every module a run could import
    try:
        importlib.import_module(mod.name)
    except ImportError:  # an optional extra
        pass

def reply(obj):
    os.write(1, (json.dumps(obj) + "\n").encode())

children, buf = set(), b""
reply({"ready": True})
while True:
    if select.select([0], [], [], 0.002)[0]:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    null = os.open(os.devnull, os.O_RDWR)
                    err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(null, 0)
                    os.dup2(null, 1)
                    os.dup2(err, 2)
                    sys.stdin, sys.stdout = open(os.devnull), open(os.devnull, "w")
                    sys.stderr = open(2, "w", closefd=False)
                    code = cli.main(job["args"])
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stderr.flush()
                    os._exit(code)
            children.add(pid)
            reply({"started": pid})
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        children.discard(pid)
        reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
"""


class Zygote:
    """Runs ``teachkit.cli.main(args)`` in forked children of one process that imported teachkit once."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env)
        self.buf = b""
        self.started: list[int] = []
        self.exited: dict[int, int] = {}
        self.ready = False
        deadline = time.monotonic() + 120
        while not self.ready:
            assert time.monotonic() < deadline and self.proc.poll() is None, "the zygote did not start"
            self._read(0.1)

    def _read(self, timeout: float) -> None:
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return
        chunk = os.read(fd, 65536)
        assert chunk, "the zygote died"
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if "ready" in msg:
                self.ready = True
            elif "started" in msg:
                self.started.append(msg["started"])
            else:
                self.exited[msg["exited"]] = msg["code"]

    def start(self, args: list[str], stderr: Path) -> int:
        self.proc.stdin.write((json.dumps({"args": args, "stderr": str(stderr)}) + "\n").encode())
        self.proc.stdin.flush()
        while not self.started:
            self._read(1.0)
            assert self.proc.poll() is None, "the zygote died"
        return self.started.pop(0)

    def poll(self, pid: int, timeout: float = 0.0) -> int | None:
        self._read(timeout)
        return self.exited.get(pid)

    def wait(self, pid: int, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while pid not in self.exited:
            if time.monotonic() > deadline:
                kill(pid)
                pytest.fail(f"run {pid} did not finish in {timeout} s")
            self._read(0.05)
        return self.exited[pid]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


IN_MODIFY, IN_MOVED_TO, IN_CREATE, IN_ISDIR = 0x2, 0x80, 0x100, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


class Watcher:
    """The files created (``create``), renamed into place (``moved``) or written (``modify``) anywhere under
    the folder ``target`` (which may not exist yet: its parent is watched for it), via inotify; new folders
    are watched as they appear."""

    def __init__(self, target: Path) -> None:
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        assert self.fd >= 0, "inotify is not available"
        self.target = target
        self.dirs: dict[int, Path] = {}
        self._watch_tree(target.parent)

    def _watch_tree(self, folder: Path) -> None:
        if not (folder == self.target or self.target in folder.parents or folder in self.target.parents):
            return
        wd = self.libc.inotify_add_watch(self.fd, str(folder).encode(), IN_CREATE | IN_MOVED_TO | IN_MODIFY)
        if wd < 0:
            return  # gone already
        self.dirs[wd] = folder
        for sub in folder.iterdir():
            if sub.is_dir():
                self._watch_tree(sub)

    def events(self, timeout: float) -> Iterator[tuple[str, Path]]:
        if not select.select([self.fd], [], [], timeout)[0]:
            return
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        i = 0
        while i < len(data):
            wd, mask, _cookie, size = struct.unpack_from("iIII", data, i)
            name = data[i + 16:i + 16 + size].rstrip(b"\0").decode()
            i += 16 + size
            if wd not in self.dirs:
                continue
            path = self.dirs[wd] / name
            if mask & IN_ISDIR:
                if mask & IN_CREATE and path.is_dir():
                    self._watch_tree(path)
                continue
            if self.target not in path.parents:
                continue
            kind = "create" if mask & IN_CREATE else "moved" if mask & IN_MOVED_TO else "modify"
            yield kind, path

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def trigger(plan: str, rng: random.Random) -> tuple[str, int, float]:
    """(event kind, which occurrence, delay after it) for a kill plan."""
    if plan == "tmp":
        return "create", rng.randint(1, 6), 0.0
    if plan == "line":
        return "line", rng.randint(1, 2), 0.0
    if plan == "saved":
        return "moved", rng.randint(1, 2), rng.uniform(0.0, 0.003)
    return "time", 0, rng.uniform(0.0, 0.15)


def matches(kind: str, event: tuple[str, Path]) -> bool:
    what, path = event
    if kind == "create":
        return what == "create" and path.name.endswith(".tmp")
    if kind == "line":
        return what == "modify" and path.name in LOGS
    if kind == "moved":
        return what == "moved" and path.suffix == ".safetensors"
    return False


def kill(pid: int) -> None:
    """SIGKILL ``pid``; a run that has just exited by itself (the zygote reaps it) is left as it ended."""
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def attempt(zygote: Zygote, args: list[str], folder: Path, err: Path, plan: str,
            rng: random.Random) -> tuple[int, str | None]:
    """One ``--resume`` attempt killed as ``plan`` says; (exit code, where it was killed or None)."""
    kind, n, delay = trigger(plan, rng)
    watcher = Watcher(folder)
    try:
        pid = zygote.start(args, err)
        t0, seen, fire_at, where = time.monotonic(), 0, None, None
        if kind == "time":
            fire_at, where = t0 + delay, f"at {delay:.3f} s"
        while True:
            code = zygote.poll(pid)
            if code is not None:
                return code, None
            for event in watcher.events(0.002):
                if fire_at is None and matches(kind, event):
                    seen += 1
                    if seen == n:
                        fire_at, where = time.monotonic() + delay, f"{event[0]} {event[1].relative_to(folder)}"
                        where += f" +{1e6 * delay:.0f} us" if delay else ""
                        if delay == 0:
                            kill(pid)  # as soon as seen: often the writer is still inside the write
                            code = zygote.wait(pid)
                            inside = kind == "create" and event[1].exists()
                            return code, where + (" (inside the write)" if inside else "")
            if fire_at is not None and time.monotonic() >= fire_at:
                kill(pid)
                return zygote.wait(pid), where
    finally:
        watcher.close()


def assert_same_folder(a: Path, b: Path) -> None:
    """Every checkpoint bit-identical (weights, optimiser, RNG, L2T state), every log the same records."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    assert any(f.name == "last.safetensors" for f in files)
    for f in files:
        ta, tb = load_file(str(a / f)), load_file(str(b / f))
        assert ta.keys() == tb.keys(), f
        for k in ta:
            assert torch.equal(ta[k], tb[k]), f"{f}: {k}"
    logs = sorted(p.relative_to(a) for p in a.rglob("*.jsonl"))
    assert logs == sorted(p.relative_to(b) for p in b.rglob("*.jsonl"))
    for f in logs:
        ra = [untimed(json.loads(x)) for x in (a / f).read_text().splitlines()]
        rb = [untimed(json.loads(x)) for x in (b / f).read_text().splitlines()]
        assert ra == rb, f
    assert not list(b.rglob("*.tmp")), "temporary files were left behind"


@pytest.mark.parametrize("case", CASES)
def test_kill_at_random_moments_then_resume_is_exact(tmp_path, zygote, case):
    command, extra = CASES[case]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, train={"epochs": EPOCHS, "progress": False})))
    runs = tmp_path / "runs"
    runs.mkdir()
    straight = zygote.start([*command, str(cfg), "name=straight", *extra], tmp_path / "straight.err")
    rng = random.Random(f"{case}{SEED}")
    kills: list[str] = []
    for i in range(2 * KILLS + 20):
        plan = PLANS[i % len(PLANS)] if len(kills) < KILLS else "none"
        err = tmp_path / f"attempt{i}.err"
        args = [*command, str(cfg), "name=killed", *extra, "--resume"]
        if plan == "none":
            code, where = zygote.wait(zygote.start(args, err)), None
        else:
            code, where = attempt(zygote, args, runs / "killed", err, plan, rng)
        if code == 0:
            break
        assert code == -9, f"attempt {i} ({plan}) failed with {code}:\n{err.read_text()}"  # only our kills
        kills.append(f"{plan}: {where}")
    else:
        pytest.fail("the run never finished")
    assert zygote.wait(straight) == 0, (tmp_path / "straight.err").read_text()
    print(f"{case}: {len(kills)} kills: " + "; ".join(kills))
    assert len(kills) >= 5, kills
    assert_same_folder(runs / "straight", runs / "killed")
