"""``teachkit list KIND NAME``: a table of one entry's options from its typed options (or its factory's keyword
parameters); unknown names are one line with close matches; every ``--help`` names the configuration reference."""

from __future__ import annotations

import argparse

import pytest

from teachkit.cli import build_parser, main


def listed(capsys, *args: str) -> dict[str, list[str]]:
    """The table rows of ``teachkit list ARGS`` by option name, split into columns at runs of 2+ spaces."""
    assert main(["list", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("option "))
    rows = {}
    for line in out[start + 1:]:
        if not line.strip():
            break
        cells = [c for c in line.split("  ") if c.strip()]
        rows[cells[0].strip()] = [c.strip() for c in cells[1:]]
    return rows


def test_loss_options_table(capsys):
    rows = listed(capsys, "losses", "kd")
    assert list(rows) == ["temperature", "divergence", "jsd_beta", "top_k", "scale_t2", "logit_standardize"]
    assert rows["temperature"][:3] == ["float or null", "null", "> 0.0"]
    assert rows["divergence"][:3] == ["choice", "forward_kl", "forward_kl | reverse_kl | jsd | tv"]
    assert rows["jsd_beta"][:3] == ["float", "0.5", ">= 0.0 and <= 1.0"]
    assert rows["scale_t2"][:3] == ["bool", "true", "-"] and "T^2" in rows["scale_t2"][3]
    assert rows["top_k"][3].startswith("keep the teacher's k most probable classes")


def test_callback_options_table(capsys):
    rows = listed(capsys, "callbacks", "early_stop")
    assert set(rows) >= {"patience", "min_delta"}
    assert main(["list", "callbacks"]) == 0 and "early_stop" in capsys.readouterr().out


def test_recipe_model_and_dataset_tables(capsys):
    prokd = listed(capsys, "recipes", "prokd")
    assert prokd["tau_max"][:3] == ["float", "10.0", ">= 1.0"] and "tau_max" in prokd["tau_max"][3]
    assert prokd["mode"][:3] == ["choice", "auto", "auto | online | replay"]
    assert listed(capsys, "models", "lenet")["fc"][:2] == ["int", "500"]
    assert listed(capsys, "models", "resnet_cifar")["depth"][:2] == ["int", "required"]
    synthetic = listed(capsys, "datasets", "synthetic")
    assert synthetic["n_train"][:2] == ["int", "1000"] and synthetic["shape"][1] == "[3, 32, 32]"


@pytest.mark.parametrize("args, says", [
    (["losses", "l2"], "set with: train.loss=l2"),
    (["losses", "crd"], "kd.options.crd.<option>, weight kd.gamma.crd"),
    (["evaluators", "classification"], "chosen by the dataset's task"),
    (["datasets", "mnist5k"], "options: none"),
    (["callbacks", "early_stop"], "train.callbacks: [{name: early_stop, options: {<option>: ...}}]"),
])
def test_where_options_go_and_the_reference(capsys, args, says):
    assert main(["list", *args]) == 0
    out = capsys.readouterr().out
    assert says in out and out.rstrip().endswith("every config key: docs/configuration.md")


@pytest.mark.parametrize("args, says", [
    (["losses", "kdd"], "no loss named 'kdd' (close matches: kd, "),
    (["recipes", "pro-kd"], "no recipe named 'pro-kd' (close matches: prokd"),
    (["models", "zzzzzz"], "no model named 'zzzzzz' (no close match); teachkit list models shows all"),
    (["all", "kd"], "name a kind first, e.g. teachkit list losses kd"),
])
def test_unknown_name_is_one_line_exit_2(capsys, args, says):
    assert main(["list", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and says in captured.err


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_help_names_the_configuration_reference():
    commands = subparsers()
    assert {"train", "distill", "run", "eval", "list", "demo", "sweep", "report"} <= set(commands)
    for name, parser in [("teachkit", build_parser()), *commands.items()]:
        text = " ".join(parser.format_help().split())
        assert "docs/configuration.md" in text and "teachkit list KIND NAME" in text, name


def test_train_help_lists_every_label_loss():
    text = " ".join(subparsers()["train"].format_help().split())
    losses = text.split("train.loss: ", 1)[1].split(")", 1)[0].split(" / ")
    assert {"ce", "l2", "mse", "mse-logits"} <= set(losses)
