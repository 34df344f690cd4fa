"""End-to-end CLI runs on tiny synthetic data, and the bad-input contract: one line, exit 2."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from teachkit.cli import main
from tests.conftest import tiny_config


def write_cfg(tmp_path, **sections):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, **sections)))
    return path


def run_cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "teachkit.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_train_distill_eval_end_to_end(tmp_path):
    cfg = write_cfg(tmp_path)
    proc = run_cli("train", str(cfg), "name=teacher", "train.loss=mse", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "train finished" in proc.stdout
    teacher = tmp_path / "runs" / "teacher"
    proc = run_cli("distill", str(cfg), "name=student", f"teacher.checkpoint={teacher}", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("eval", str(tmp_path / "runs" / "student"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    summary = json.loads((tmp_path / "runs" / "student" / "summary.json").read_text())
    assert out["acc"] == pytest.approx(summary["test_acc"], abs=0.006) and out["acc"] == round(out["acc"], 2)
    assert out["loss"] == float(f"{out['loss']:.4g}")  # 4 significant digits
    assert out["checkpoint"] == str(tmp_path / "runs" / "student" / "checkpoints" / "last.safetensors")
    assert out["epoch"] == 2 and "evaluating the model: " in proc.stderr and "teacher" not in proc.stderr


def test_user_error_has_no_traceback(tmp_path):
    cfg = write_cfg(tmp_path)
    proc = run_cli("train", str(cfg), "model.name=resnet2O")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "unknown model 'resnet2O'" in proc.stderr


@pytest.mark.parametrize("overrides, match", [
    (["model.name=resnet2O"], "unknown model 'resnet2O'"),
    (["data.name=cifar1O"], "unknown dataset 'cifar1O'"),
    (["train.loss=msee"], "unknown loss 'msee'"),
    (["kd.method=kdd"], "unknown distillation loss 'kdd'"),
    (["optim.lr=-1"], "optim.lr=-1.0 is out of range"),
    (["train.epochs=0"], "train.epochs=0 is out of range"),
    (["data.batch_size=0"], "data.batch_size=0 is out of range"),
    (["kd.temperature=-2"], "kd.temperature=-2.0 is out of range"),
    (["kd.alpha=2"], "kd.alpha=2.0 is out of range"),
    (["model.name=resnet20", "model.options={}", "data.options.shape=[1, 40]"], "model 'resnet20' needs input"),
    (["model.name=resnet20"], "model 'resnet20' has no option 'hidden'"),
    (["kd.method=crd", "kd.options.crd.nce_k=0"], "kd.options.crd.nce_k=0 is out of range: must be >= 1"),
    (["kd.method=crd", "kd.options.crd.feat_dimm=4"], "unknown config key 'kd.options.crd.feat_dimm' (did you mean"),
    (["kd.options.crd.nce_k=4"], "kd.options.crd names a method that is not in kd.method=['kd']"),
    (["kd.method=[kd, kd]"], "kd.method=['kd', 'kd'] names a method twice"),
    (["kd.gamma.kd=-1"], "kd.gamma.kd=-1 is not allowed: must be a finite number >= 0"),
    (["train.select_metric=f1"], "train.select_metric='f1' is not a metric of this task; choose one of: acc, loss"),
    (["train.select_mode=best"], "train.select_mode='best' is not allowed; choose one of: auto, max, min"),
    (["model.taps.extra.block=true"], "model.taps.extra.block must be a module path"),
    (["model.taps.extra={logits: fc}"], "model.taps.extra.logits: 'logits' is a built-in tap"),
    (["model.taps.stagez=[a]"], "unknown key model.taps.stagez"),
    (["prokdd.tau_max=3"], "unknown config key 'prokdd' (did you mean 'prokd'?)"),
    (["data.few_shot=2"], "data.few_shot=2 needs data.omit_classes"),
])
def test_bad_input_exit_2_one_line(tmp_path, capsys, overrides, match):
    cfg = write_cfg(tmp_path)
    command = "distill" if overrides[0].startswith("kd.") else "train"
    code = main([command, str(cfg), *overrides, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert match in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()  # refused before any run folder is made


def test_missing_and_broken_config_and_checkpoint(tmp_path, capsys):
    assert main(["train", str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    assert main(["train", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nothing.safetensors")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_truncated_checkpoint_and_wrong_hash(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["train", str(cfg), "name=t", "--quiet"]) == 0
    ckpt = tmp_path / "runs" / "t" / "checkpoints" / "last.safetensors"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:-10])
    capsys.readouterr()
    assert main(["eval", str(ckpt)]) == 2
    assert "sha256" in capsys.readouterr().err
    assert main(["distill", str(cfg), "name=s", f"teacher.checkpoint={ckpt}", "--quiet"]) == 2
    assert "sha256" in capsys.readouterr().err


def test_resume_into_other_config_and_existing_folder(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["train", str(cfg), "name=r", "--quiet"]) == 0
    assert main(["train", str(cfg), "name=r", "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["train", str(cfg), "name=r", "optim.lr=0.2", "--resume", "--quiet"]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert (tmp_path / "runs" / "r" / "checkpoints" / "last.safetensors").is_file()  # nothing lost


def test_list_shows_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("resnet20", "resnet110", "mlp", "lenet", "cnn1d", "digits", "mnist5k", "cifar100", "synthetic",
                 "ce", "mse", "mse-logits", "kd", "train"):
        assert f"  {name} " in out, name


def test_missing_dataset_files_one_line(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    code = main(["train", str(cfg), "data.name=cifar10", f"data.root={tmp_path}", "data.options={}",
                 "model.name=resnet8", "model.options={}", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "cifar-10" in err and "https://www.cs.toronto.edu/~kriz/cifar.html" in err


def test_eval_best_checkpoint_on_val(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["train", str(cfg), "name=e", "train.epochs=3", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "e"), "--select", "best", "--split", "val"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = json.loads((tmp_path / "runs" / "e" / "summary.json").read_text())
    assert out["split"] == "val" and out["acc"] == pytest.approx(summary["best_val_acc"], abs=0.006)
    assert out["epoch"] == summary["best_epoch"] and out["checkpoint"].endswith("best.safetensors")


def test_run_prokd_online_end_to_end(tmp_path):
    cfg = write_cfg(tmp_path)
    proc = run_cli("run", "prokd", str(cfg), "name=p", "train.epochs=3", "teacher.epochs=2", "prokd.tau_max=2",
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "runs" / "p" / "summary.json").read_text())
    assert summary["plan"]["phase1_epochs"] == 2 and summary["cost"]["teacher_epochs_trained"] == 2


@pytest.mark.parametrize("args, match", [
    (["run", "prokd", "prokd.tau_max=0.5"], "prokd.tau_max=0.5 is out of range: must be >= 1.0"),
    (["run", "prokd", "prokd.student_epochs=[1, 2]", "teacher.epochs=3"], "lists 2 entries but the teacher trains 3"),
    (["run", "nosuch"], "unknown recipe 'nosuch'"),
    (["run", "prokd", "prokd.mode=replay"], "replay mode needs teacher.checkpoint"),
    (["run", "eskd", "teacher.epochs=1"], "eskd needs eskd.epoch (the teacher checkpoint to distil from) or "
                                          "eskd.search=true"),
    (["run", "takd", "takd.assistant_epochs=0"], "takd.assistant_epochs=0 is out of range: must be >= 1"),
    (["run", "rco", "rco.anchors=0"], "rco.anchors=0 is out of range: must be >= 1"),
    (["run", "l2t", "l2t.memory=half"], "l2t.memory='half' is not allowed; choose full, checkpoint or truncate:K"),
])
def test_recipe_bad_input(tmp_path, capsys, args, match):
    cfg = write_cfg(tmp_path)
    code = main([args[0], args[1], str(cfg), *args[2:], "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and match in err and err.count("\n") == 1, err


def test_list_piped_into_a_reader_that_stops_early(tmp_path):
    proc = subprocess.run(f"{sys.executable} -m teachkit.cli list | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_list_shows_options_of_methods_and_recipes(capsys):
    assert main(["list", "recipes"]) == 0
    out = capsys.readouterr().out
    assert "options: mode=auto, tau_max=10.0" in out and "options: generations=3, ensemble=False" in out
    assert main(["list", "evaluators"]) == 0
    assert "  binary " in capsys.readouterr().out


def test_eval_finds_the_student_of_takd_and_eskd_runs(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["run", "takd", str(cfg), "name=takd", "takd.assistant={name: mlp, options: {hidden: [8]}}",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "takd")]) == 0
    out = capsys.readouterr()
    ev = json.loads(out.out)
    student = tmp_path / "runs" / "takd" / "student"
    assert ev["checkpoint"] == str(student / "checkpoints" / "last.safetensors") and ev["epoch"] == 2
    summary = json.loads((tmp_path / "runs" / "takd" / "summary.json").read_text())
    assert ev["acc"] == pytest.approx(summary["test_acc"], abs=0.006)
    assert "evaluating the student (TAKD run)" in out.err and "teacher" not in out.err
    from teachkit.predict import load_predictor, resolve_checkpoint  # a predictor finds the same student

    assert resolve_checkpoint(tmp_path / "runs" / "takd", "last")[0] == student / "checkpoints" / "last.safetensors"
    assert load_predictor(tmp_path / "runs" / "takd").source == student
    assert main(["run", "eskd", str(cfg), "name=eskd", "eskd.search=true", "teacher.epochs=2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "eskd"), "--quiet"]) == 0
    out = capsys.readouterr()
    summary = json.loads((tmp_path / "runs" / "eskd" / "summary.json").read_text())
    best = f"from-epoch-{summary['teacher_epoch']:04d}"
    assert json.loads(out.out)["checkpoint"] == str(tmp_path / "runs" / "eskd" / best / "checkpoints" /
                                                    "last.safetensors")
    assert out.err == ""  # --quiet: only the final line
    (tmp_path / "runs" / "eskd" / "summary.json").unlink()  # an unfinished search: which student is ambiguous
    assert main(["eval", str(tmp_path / "runs" / "eskd")]) == 2
    assert "holds 2 students (from-epoch-0001, from-epoch-0002)" in capsys.readouterr().err


def test_quiet_prints_only_the_summary_line(tmp_path):
    cfg = write_cfg(tmp_path)
    proc = run_cli("train", str(cfg), "train.progress=true", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("train finished: ")
    assert proc.stderr == ""


def test_os_error_that_escapes_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    import teachkit.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "runs" / ".config.yaml.x1.tmp"))

    monkeypatch.setattr(cli, "_train", full)
    assert main(["train", "cfg.yaml"]) == 2
    assert capsys.readouterr().err == (f"teachkit: error: cannot write {str(tmp_path / 'runs')!r}: "
                                       f"No space left on device\n")


def test_list_models_shows_each_models_options(capsys) -> None:
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "options: depth, width=1.0, shortcut='A'" in out  # resnet_cifar: depth has no default
    assert "options: hidden=(500,), dropout=0.0" in out


def test_overrides_may_follow_options() -> None:
    from teachkit.cli import parse

    args = parse(["train", "c.yaml", "a=1", "--plugin", "m", "b=2", "--quiet", "c=3"])
    assert args.overrides == ["a=1", "b=2", "c=3"] and args.plugin == ["m"] and args.quiet
    with pytest.raises(SystemExit):
        parse(["train", "c.yaml", "--nope"])
    with pytest.raises(SystemExit):
        parse(["list", "models", "a=1"])
