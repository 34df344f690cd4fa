"""What a run folder or checkpoint may execute (teachkit.trust): code it names is imported only with --trust-code
(``trust_code=True``) or when the user named it in the same command; the standard library is never a factory.

Each plugin module here writes a marker file when imported, so a refused import is seen not to have run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import teachkit
from teachkit.cli import main
from teachkit.engine.checkpoint import load_checkpoint, save_checkpoint
from teachkit.errors import ConfigError
from teachkit.trust import TrustError, check_import, reading_from, trusting
from tests.conftest import tiny_config

#: a user module with a factory; importing it leaves a marker file (its import is code running)
NETS = """
import math, pathlib
from torch import nn
pathlib.Path(__file__).with_name("IMPORTED-" + __name__).write_text("x")

def Net(input_shape, num_classes, hidden=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))
"""


def _setup(tmp_path: Path, monkeypatch, module: str = "trustnets") -> Path:
    """A module ``module`` on sys.path and a config naming its factory; returns the config file."""
    (tmp_path / f"{module}.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TEACHKIT_PLUGINS", raising=False)
    monkeypatch.delenv("TEACHKIT_TRUST_CODE", raising=False)
    cfg = tiny_config(tmp_path, model={"name": f"{module}:Net", "options": {}}, train={"epochs": 1, "progress": False})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _forget(tmp_path: Path, module: str) -> None:
    """A new process's view: the module not imported, no name granted, no marker."""
    sys.modules.pop(module, None)
    from teachkit import trust

    trust._named.clear()
    (tmp_path / f"IMPORTED-{module}").unlink(missing_ok=True)


def _one_line_error(capsys, fragment: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("teachkit: error:")]
    assert len(lines) == 1 and "Traceback" not in err and fragment in lines[0], err
    return lines[0]


def test_eval_of_a_handed_run_folder_imports_nothing_without_trust_code(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path, monkeypatch, "trust_eval_nets")
    assert main(["train", str(cfg)]) == 0
    run = tmp_path / "runs" / "tiny"
    _forget(tmp_path, "trust_eval_nets")
    assert main(["eval", str(run)]) == 2
    line = _one_line_error(capsys, "names model factory 'trust_eval_nets:Net'")
    assert "--trust-code" in line
    assert not (tmp_path / "IMPORTED-trust_eval_nets").exists()  # the module never ran
    assert main(["eval", str(run), "--trust-code"]) == 0
    assert json.loads(capsys.readouterr().out)["acc"] >= 0
    assert (tmp_path / "IMPORTED-trust_eval_nets").exists()


def test_same_command_may_read_back_what_it_named(tmp_path, monkeypatch, capsys):
    """distill with an in-command teacher of the user's factory: the teacher checkpoint it writes names that
    factory and is read back without --trust-code (the user named it)."""
    cfg = _setup(tmp_path, monkeypatch, "trust_same_nets")
    code = main(["distill", str(cfg), "teacher.model.name=trust_same_nets:Net",
                 "teacher.model.options={}", "teacher.epochs=1"])
    assert code == 0, capsys.readouterr().err


def test_teacher_checkpoint_naming_a_factory_needs_trust(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path, monkeypatch, "trust_teacher_nets")
    assert main(["train", str(cfg), "name=teacher"]) == 0
    _forget(tmp_path, "trust_teacher_nets")
    teacher = str(tmp_path / "runs" / "teacher")
    student = ["distill", str(cfg), "model.name=mlp", "model.options={hidden: [8]}", f"teacher.checkpoint={teacher}"]
    assert main([*student, "name=s1"]) == 2
    _one_line_error(capsys, "names model factory 'trust_teacher_nets:Net'")
    assert not (tmp_path / "IMPORTED-trust_teacher_nets").exists()
    assert main([*student, "name=s2", "--trust-code"]) == 0


def test_resume_imports_a_recorded_plugin_only_when_named_or_trusted(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path, monkeypatch, "trust_plugin_mod")
    monkeypatch.delenv("TEACHKIT_PLUGINS", raising=False)
    args = ["train", str(cfg), "model.name=mlp", "train.epochs=1"]
    assert main([*args, "--plugin", "trust_plugin_mod"]) == 0
    _forget(tmp_path, "trust_plugin_mod")
    assert main([*args[:-1], "train.epochs=2", "--resume"]) == 2
    _one_line_error(capsys, "names plugin 'trust_plugin_mod'")
    assert not (tmp_path / "IMPORTED-trust_plugin_mod").exists()
    assert main([*args[:-1], "train.epochs=2", "--resume", "--plugin", "trust_plugin_mod"]) == 0


def test_tampered_checkpoint_naming_the_standard_library_is_refused_even_trusted(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path, monkeypatch, "trust_tamper_nets")
    assert main(["train", str(cfg)]) == 0
    file = tmp_path / "runs" / "tiny" / "checkpoints" / "last.safetensors"
    tensors, state = load_checkpoint(file)  # an attacker rewrites the file with a valid digest
    assert state["model"]["name"] == "trust_tamper_nets:Net"
    state["model"] = {"name": "os:system", "options": {"command": f"touch {tmp_path}/PWNED"}, "taps": {}}
    save_checkpoint(file, tensors, state)
    for extra in ([], ["--trust-code"]):
        assert main(["eval", str(tmp_path / "runs" / "tiny"), *extra]) == 2
        capsys.readouterr()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("name", ["os:system", "subprocess:run", "builtins:exec", "shutil:rmtree"])
def test_standard_library_factories_are_refused(name):
    from teachkit.models.zoo import import_factory

    with pytest.raises(ConfigError, match="part of the Python standard library"):
        import_factory(name)


@pytest.mark.parametrize("name", ["torch:load", "torch.jit:load", "torch.hub:load", "numpy:load"])
def test_loaders_that_unpickle_are_refused(name):
    from teachkit.models.zoo import import_factory

    with pytest.raises(ConfigError, match="loader of pickled or scripted objects"):
        import_factory(name)


def test_a_plugin_re_exporting_a_standard_library_callable_is_refused(tmp_path, monkeypatch):
    (tmp_path / "sneaky_nets.py").write_text("from os import system as make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from teachkit.models.zoo import import_factory

    with pytest.raises(ConfigError, match="resolves to 'posix'|resolves to 'nt'|resolves to 'os'"):
        import_factory("sneaky_nets:make")


def test_check_import_rules():
    with reading_from("checkpoint 'x'"):
        with pytest.raises(TrustError, match="checkpoint 'x' names plugin 'never_named_mod'"):
            check_import("never_named_mod", "plugin")
        with trusting(True):
            check_import("never_named_mod", "plugin")
    check_import("named_here_mod", "plugin")  # named by the user: remembered
    with reading_from("checkpoint 'x'"):
        check_import("named_here_mod", "plugin")


def test_api_load_needs_trust_code_in_a_new_process(tmp_path, monkeypatch):
    cfg = _setup(tmp_path, monkeypatch, "trust_api_nets")
    assert main(["train", str(cfg)]) == 0
    run = tmp_path / "runs" / "tiny"
    script = ("import sys, teachkit\n"
              "try:\n    teachkit.load(sys.argv[1])\nexcept teachkit.trust.TrustError as e:\n    print('REFUSED', e)\n"
              "m = teachkit.load(sys.argv[1], trust_code=True)\nprint('LOADED', type(m.model).__name__)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    env.pop("TEACHKIT_TRUST_CODE", None)
    (tmp_path / "IMPORTED-trust_api_nets").unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert "REFUSED" in proc.stdout and "trust_api_nets:Net" in proc.stdout, proc.stdout + proc.stderr
    assert "LOADED Sequential" in proc.stdout, proc.stdout + proc.stderr


def test_api_meta_tensors_and_wrong_width_teacher(tmp_path):
    x, y = torch.randn(60, 5), torch.arange(60) % 3
    with pytest.raises(ConfigError, match="meta-device tensor"):
        teachkit.train(nn.Linear(5, 3), (x.to("meta"), y), out_dir=tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="on the meta device"):
        teachkit.train(nn.Linear(5, 3, device="meta"), (x, y), out_dir=tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="outputs 13 values per sample but dataset 'arrays' has 3 classes"):
        teachkit.distill(nn.Linear(5, 3), nn.Linear(5, 13), (x, y), out_dir=tmp_path, quiet=True, epochs=1)
    with pytest.raises(ConfigError, match="outputs 4 values per sample"):
        teachkit.train(lambda: nn.Linear(5, 4), (x, y), out_dir=tmp_path, quiet=True, epochs=1)


def test_debug_prints_the_traceback(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path, monkeypatch, "trust_debug_nets")
    (tmp_path / "raising_nets.py").write_text("def Net(input_shape, num_classes):\n    raise ValueError('no GPU')\n")
    argv = ["train", str(cfg), "model.name=raising_nets:Net"]
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: no GPU" in err
    assert err.splitlines()[-1] == ("teachkit: error: model 'raising_nets:Net' raised ValueError while being "
                                    "built: no GPU")
    monkeypatch.setenv("TEACHKIT_DEBUG", "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_in_the_first_seconds_is_one_line_and_130(tmp_path):
    """SIGINT while the command is still importing torch (the console script's entry, teachkit_cli)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for delay in (0.2, 1.0):
        proc = subprocess.Popen([sys.executable, "-c", "import sys, teachkit_cli; sys.exit(teachkit_cli.main())",
                                 "list", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=tmp_path)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:  # the command finished before the signal: nothing to check at this delay
            continue
        assert proc.returncode == 130, err
        assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("teachkit: interrupted"), err
