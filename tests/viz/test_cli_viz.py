"""`attnlab plot`, `view`, `serve` wired to the model runner (a fake one here; the browser tests
run the real default model)."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from viz.fakes import FakeModels


@pytest.fixture
def fake_model(monkeypatch):
    fakes = FakeModels()
    calls = []

    def run_model(text, model=None):
        calls.append((text, model))
        return fakes.run(text, {"name": "fake"})

    monkeypatch.setattr("attnlab.explain.model.run_model", run_model)
    monkeypatch.setattr("attnlab.explain.model.load_model", fakes.load)
    return calls


def test_plot_writes_each_kind(tmp_path, fake_model, capsys):
    assert main(["plot", "the cat sat", "-o", str(tmp_path / "m.png")]) == 0
    assert main(["plot", "the cat sat", "-o", str(tmp_path / "l.svg"), "--layer", "1"]) == 0
    assert main(["plot", "the cat sat", "-o", str(tmp_path / "h.png"), "--layer", "-1",
                 "--head", "2"]) == 0
    out = capsys.readouterr().out
    assert "all layers and heads" in out and "layer 1, all heads" in out
    assert "layer -1, head 2" in out
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    assert fake_model[0] == ("the cat sat", None)


@pytest.mark.parametrize("args, message", [
    (["-o", "x.jpg"], "-o: expected a file ending in .png or .svg"),
    (["-o", "x.png", "--head", "1"], "--head 1: needs --layer too"),
    (["-o", "no/such/dir/x.png"], "-o: no such directory"),
])
def test_plot_refuses_before_running_the_model(args, message, fake_model, capsys, tmp_path,
                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "the cat", *args]) == 2
    assert message in capsys.readouterr().err
    assert fake_model == []


def test_plot_layer_out_of_range(tmp_path, fake_model, capsys):
    assert main(["plot", "the cat", "-o", str(tmp_path / "x.png"), "--layer", "5"]) == 2
    assert "layer: expected 0..1 (there are 2 layers), got 5" in capsys.readouterr().err


def test_view_writes_page(tmp_path, fake_model, capsys):
    out = tmp_path / "v.html"
    assert main(["view", "the cat sat", "-o", str(out), "--model", "/m"]) == 0
    assert 'id="attn-data"' in out.read_text(encoding="utf-8")
    assert fake_model == [("the cat sat", {"name": "/m"})]  # loaded once, then run
    assert "no network needed" in capsys.readouterr().out
    assert main(["view", "x", "-o", str(tmp_path / "v.txt")]) == 2


def test_serve_checks_port_and_runs_until_interrupted(fake_model, monkeypatch, capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port: expected 0..65535" in capsys.readouterr().err

    def interrupted():
        raise KeyboardInterrupt

    import attnlab.viz.app as app

    made = {}
    real = app.make_server

    def make_server(models, host, port, **kw):
        made["server"] = server = real(models, host, port, **kw)
        made["models"] = models
        server.serve_forever = interrupted
        return server

    monkeypatch.setattr(app, "make_server", make_server)
    assert main(["serve", "--port", "0", "--model", "/models/tiny"]) == 0
    out = capsys.readouterr()
    assert f"http://127.0.0.1:{made['server'].server_port}/" in out.out
    assert made["models"].names == ["all-MiniLM-L6-v2", "tiny"]
    assert made["models"].loads == 1  # the default is loaded before the first request
    assert "warning" not in out.err
