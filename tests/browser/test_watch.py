"""The watcher the browser tests rely on does see requests, console errors and dialogs."""

from __future__ import annotations


def test_watch_catches_network_errors_and_dialogs(open_page, tmp_path):
    path = tmp_path / "bad.html"
    path.write_text("<img src='http://192.0.2.1/x.png'><script>console.error('boom');"
                    "alert(1)</script>", encoding="utf-8")
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.wait_for_timeout(200)
    assert "http://192.0.2.1/x.png" in watch.outside()
    assert "boom" in watch.errors and watch.dialogs == ["1"]
