"""One vocabulary across the commands: grouped help, a bare `attnlab` is a usage error, every
option says what it does and its default, `--threads` wherever a command computes, old spellings
kept as deprecated aliases, indices as in Python, and `--quick` refusing what it would ignore."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from attnlab.cli import GROUPS, build_parser, main
from attnlab.explain.token import explain_token
from viz.fakes import fake_capture


def _commands():
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_bare_attnlab_prints_the_grouped_help_and_exits_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    titles = [f"{title}:" for title, _ in GROUPS]
    assert [err.index(t) for t in titles] == sorted(err.index(t) for t in titles)
    for name in _commands():
        assert f"\n  {name} " in err


def test_help_groups_every_command_once(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "learn:" in out and "look inside a model:" in out and "build and train:" in out
    listed = [n.replace("_", "-") for _, names in GROUPS for n in names]
    assert sorted(listed) == sorted(_commands()) and len(set(listed)) == len(listed)


def test_every_option_shows_help_and_its_default():
    os.environ.setdefault("COLUMNS", "100")
    missing = []
    for name, p in _commands().items():
        fmt = p._get_formatter()
        for a in p._actions:
            if (not a.option_strings or a.help == argparse.SUPPRESS
                    or isinstance(a, (argparse._HelpAction, argparse._VersionAction))):
                continue
            text = fmt._expand_help(a) if a.help else ""
            if not text or not (a.nargs == 0 or a.required or "default" in text):
                missing.append(f"{name} {a.option_strings[-1]}")
    assert not missing


def test_every_command_that_computes_takes_threads_default_1():
    for name, p in _commands().items():
        threads = [a for a in p._actions if "--threads" in a.option_strings]
        if name in ("lesson", "doctor"):  # the lesson's few numbers; a report of the machine
            assert not threads
            continue
        assert threads and threads[0].default == 1, name


def test_threads_is_applied_and_checked(capsys):
    argv = ["plan-cp", "--L", "4096", "--num-heads", "8", "--world", "2", "--threads", "2"]
    torch.set_num_threads(1)
    assert main(argv) == 0
    assert torch.get_num_threads() == 2
    assert main([*argv[:-1], "0"]) == 2
    assert "--threads: expected a positive number, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "old", "dest", "value", "new"), [
    (["generate", "--checkpoint", "runs/x", "--prompt", "a"], "--checkpoint", "model", "runs/x",
     "--model"),
    (["plot", "--run", "runs/x", "--stat", "induction", "-o", "f.svg"], "--run", "model",
     "runs/x", "--model"),
    (["plan-cp", "--L", "8", "--heads", "4"], "--heads", "num_heads", 4, "--num-heads"),
    (["plan-cp", "--L", "8", "--num-heads", "4", "--kv-heads", "2"], "--kv-heads",
     "num_kv_heads", 2, "--num-kv-heads"),
    (["heads", "x", "--seed", "3"], "--seed", "probe_seed", 3, "--probe-seed"),
])
def test_old_spellings_still_work_with_one_warning(capsys, argv, old, dest, value, new):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "deprecated" in err and f"use {new}" in err
    p = _commands()[argv[0]]
    assert f"{old} " not in p.format_help()  # hidden from --help


def test_counts_and_indices_have_different_names():
    plan = _commands()["plan-cp"].format_help()
    assert "--num-heads" in plan and "--heads" not in plan.replace("--num-heads", "")
    assert "--heads H[,H...]" in _commands()["rollout"].format_help()  # indices


def test_negative_layer_and_head_count_from_the_last():
    att = fake_capture(["a", "b", "c", "d"], n_layers=3, n_heads=4)
    last = explain_token(att, "c", layer=-1, head=-1).detail
    same = explain_token(att, "c", layer=2, head=3).detail
    assert (last.layer, last.head) == (2, 3)
    assert last.weights == same.weights and last.scores == same.scores


def test_rollout_heads_count_from_the_last_too():
    from attnlab.explain.attention_flow import rollout

    att = fake_capture(["a", "b", "c", "d"], n_layers=2, n_heads=3, causal=False)
    assert (rollout(att, heads=[-1, 0]) == rollout(att, heads=[2, 0])).all()


def test_quick_refuses_the_flags_it_would_override(capsys):
    assert main(["bench", "--quick", "--L", "512", "--modes", "fwd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnlab bench: error: --quick sets --L, --modes itself; leave out --L, "
                   "--modes or --quick")


def test_every_command_help_keeps_its_description_as_written():
    """Each command's --help prints its module docstring as written: paragraphs and examples
    keep their line breaks (explain's once ran its two paragraphs together)."""
    os.environ.setdefault("COLUMNS", "100")
    joined = []
    for name, p in _commands().items():
        doc = (p.description or "").strip()
        if "\n\n" in doc and "\n\n" + doc.split("\n\n")[1].splitlines()[0] not in p.format_help():
            joined.append(name)
    assert not joined, f"--help runs paragraphs together: {joined}"
