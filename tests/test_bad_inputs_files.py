"""The bad-input contract of the CLI for run files and YAML words (see tests/test_bad_inputs.py): each row ends with
exit status 2 and ONE stderr line ``teachkit: error: ...`` holding the expected text, never a traceback."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from teachkit.cli import main
from teachkit.engine import checkpoint
from tests.conftest import tiny_config


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except BaseException as e:  # noqa: BLE001 -- any escape is the traceback this contract forbids
        pytest.fail(f"Traceback: {type(e).__name__}: {e}")
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    assert err.startswith("teachkit: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and len(err) < 1000, err
    assert expected in err, err


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished tiny run (``runs/tiny``), trained once for the module; rows work on copies."""
    root = tmp_path_factory.mktemp("finished")
    (root / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(root)))
    assert main(["train", str(root / "cfg.yaml"), "--quiet"]) == 0
    return root


@pytest.fixture
def work(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run's folder tree, with its config file pointing at the copy."""
    shutil.copytree(finished / "runs", tmp_path / "runs")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    return tmp_path


def _empty_config(tmp: Path) -> None:
    (tmp / "runs" / "tiny" / "config.yaml").write_text("")


def _comment_config(tmp: Path) -> None:
    (tmp / "runs" / "tiny" / "config.yaml").write_text("# nothing here\n")


def _array_sidecar(tmp: Path) -> None:
    (tmp / "runs" / "tiny" / "checkpoints" / "last.json").write_text('["0123"]\n')


# (id, change to the finished run, argv ({tmp}: the test's folder), expected text)
ROWS: list[tuple[str, Callable[[Path], None], list[str], str]] = [
    ("empty-config-yaml-on-resume", _empty_config, ["train", "{tmp}/cfg.yaml", "--resume"],
     "cannot resume '{tmp}/runs/tiny': its config.yaml is empty (0 bytes), so the config the run was made with is "
     "unknown; restore that file (e.g. from the config you ran it with), or delete it to resume with this "
     "command's config unchecked"),
    ("comment-only-config-yaml-on-resume", _comment_config, ["train", "{tmp}/cfg.yaml", "--resume"],
     "its config.yaml is empty (it holds no keys)"),
    ("array-sidecar-on-eval", _array_sidecar, ["eval", "{tmp}/runs/tiny"],
     "checkpoint sidecar '{tmp}/runs/tiny/checkpoints/last.json' holds a JSON array of 1 item, not a mapping with "
     "the sha256 of 'last.safetensors'; delete it and the checkpoint's own digest is checked instead"),
    ("array-sidecar-on-resume", _array_sidecar, ["train", "{tmp}/cfg.yaml", "--resume", "train.epochs=3"],
     "holds a JSON array of 1 item, not a mapping"),
]


@pytest.mark.parametrize("change, argv, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_damaged_run_file_is_one_line(work, capsys, change, argv, expected):
    change(work)
    code, err = run_cli([a.replace("{tmp}", str(work)) for a in argv], capsys)
    assert_one_line(code, err, expected.replace("{tmp}", str(work)))


def test_a_damaged_run_recovers_as_the_message_says(work, capsys):
    _empty_config(work)
    (work / "runs" / "tiny" / "config.yaml").unlink()
    assert main(["train", str(work / "cfg.yaml"), "--resume", "--quiet", "train.epochs=3"]) == 0
    _array_sidecar(work)
    (work / "runs" / "tiny" / "checkpoints" / "last.json").unlink()
    assert main(["eval", str(work / "runs" / "tiny")]) == 0


@pytest.mark.parametrize("override, expected", [
    ("name=off", "name=False is not allowed: expected a string (YAML reads off/no/false as False; quote the word, "
                 "e.g. name='off')"),
    ("teacher.cache=on", "teacher.cache=True is not allowed (YAML reads on/yes/true as True); choose one of: auto, "
                         "off"),
    ("train.progress=maybe", "train.progress='maybe' is not allowed: expected true/false"),
])
def test_yaml_words_read_as_booleans(tmp_path, capsys, override, expected):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    assert_one_line(*run_cli(["train", str(tmp_path / "cfg.yaml"), override], capsys), expected)
    assert not (tmp_path / "runs").exists()


def test_teacher_cache_off_is_accepted_on_the_command_line(tmp_path, capsys):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, train={"epochs": 1, "progress": False})))
    code, err = run_cli(["train", str(tmp_path / "cfg.yaml"), "teacher.cache=off", "--quiet"], capsys)
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "runs" / "tiny" / "config.yaml").read_text())["teacher"]["cache"] == "off"


def _fail(code: int) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code, expected", [
    (errno.EROFS, "cannot write '{tmp}/runs/tiny/config.yaml': Read-only file system (the filesystem holding it is "
                  "mounted read-only; choose out_dir on a writable disk)"),
    (errno.EACCES, "cannot write '{tmp}/runs/tiny/config.yaml': Permission denied (no permission to write in "
                   "'{tmp}/runs/tiny'; check its owner and mode, or out_dir)"),
])
def test_a_run_file_that_cannot_be_written_is_named(tmp_path, capsys, monkeypatch, code, expected):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    monkeypatch.setattr(checkpoint.os, "replace", _fail(code))
    got = run_cli(["train", str(tmp_path / "cfg.yaml")], capsys)
    assert_one_line(*got, expected.replace("{tmp}", str(tmp_path)))


def test_a_read_only_out_dir_says_so(tmp_path, capsys, monkeypatch):
    from teachkit.recipes import context

    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    (tmp_path / "runs").mkdir()
    monkeypatch.setattr(context.os, "access", lambda path, mode: False)  # root ignores modes: as on a ro mount
    real = os.statvfs

    class ReadOnly:
        def __init__(self, result: os.statvfs_result) -> None:
            self.f_flag = result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(checkpoint.os, "statvfs", lambda p: ReadOnly(real(p)))
    got = run_cli(["train", str(tmp_path / "cfg.yaml")], capsys)
    assert_one_line(*got, f"cannot write in folder {str(tmp_path / 'runs')!r}: Read-only file system (its "
                          "filesystem is mounted read-only; check out_dir)")
