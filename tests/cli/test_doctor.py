"""`attnlab doctor` reports the interval kernel's build, ISA and why-not."""

from __future__ import annotations

from attnlab.cli import main


def test_doctor_reports_the_kernel(capsys):
    assert main(["doctor", "--no-build"]) == 0
    out = capsys.readouterr().out
    assert "interval kernel" in out and "kernel builds this CPU runs" in out
    assert "scalar" in out and "ATTNLAB_KERNEL=0" in out


def test_doctor_says_why_not_when_off(capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "not available" in out and "turned off by ATTNLAB_KERNEL=0" in out
