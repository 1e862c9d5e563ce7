"""The preset settings `attnlab train` and `attnlab track-heads` let the command line override
(`attnlab.cli.options.PRESET_SETTINGS`): each names a field of the preset's configs with its type,
only those given reach the trainer, and a launched worker gets every one given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnlab.cli import build_parser
from attnlab.cli.options import PRESET_SETTINGS, preset_settings
from attnlab.cli.train_processes import worker_argv
from attnlab.models.config import GPTConfig, TrainConfig


def test_every_setting_is_a_config_field_of_its_type():
    fields = {f.name: f.type for c in (TrainConfig, GPTConfig) for f in dataclasses.fields(c)}
    for flag, kind in PRESET_SETTINGS.items():
        name = flag[2:].replace("-", "_")
        assert fields.get(name) == kind.__name__, flag


def test_only_the_settings_given_reach_the_trainer():
    args = build_parser().parse_args(["track-heads", "--seed", "3", "--repeat-prob", "0"])
    assert preset_settings(args) == {"seed": 3, "repeat_prob": 0.0}
    args = build_parser().parse_args(["train", "--max-steps", "7", "--lr", "1e-3"])
    assert preset_settings(args) == {"max_steps": 7, "lr": 1e-3}
    assert preset_settings(args, "--max-steps", "--seed") == {"max_steps": 7}


def test_a_worker_gets_every_setting_given_in_order():
    argv = ["train", "--dropout", "0.1", "--seed", "5", "--warmup-steps", "0", "--min-lr",
            "1e-4", "--eval-interval", "3", "--nproc", "2", "--resume"]
    args = build_parser().parse_args(argv)
    got = worker_argv(args, Path("runs/x"), 2)
    assert got[got.index("--threads") + 2:] == [
        "--seed", "5", "--eval-interval", "3", "--min-lr", "0.0001", "--warmup-steps", "0",
        "--dropout", "0.1", "--resume"]
