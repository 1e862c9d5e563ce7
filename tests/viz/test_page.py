"""The self-contained page and its data: round-trip of the arrays, no external references, a CSP
that allows exactly the inline script, and tokens that cannot escape into markup."""

from __future__ import annotations

import base64
import hashlib
import html
import re

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.viz.html_doc import json_for_script
from attnlab.viz.page import page_html, write_page
from attnlab.viz.payload import payload
from viz.fakes import XSS, fake_capture

TOKENS = ["The", "cat", "sat", "on", "the", "mat"]


def _f32(b64):
    return np.frombuffer(base64.b64decode(b64), dtype="<f4")


def test_payload_round_trips_arrays():
    ma = fake_capture(TOKENS, n_layers=2, n_heads=3, d=4)
    p = payload(ma, text="The cat sat on the mat")
    assert (p["n_layers"], p["n_heads"], p["L"], p["S"], p["D"], p["Dv"]) == (2, 3, 6, 6, 4, 4)
    np.testing.assert_array_equal(_f32(p["weights"]).reshape(2, 3, 6, 6), ma.weights)
    np.testing.assert_array_equal(_f32(p["queries"]).reshape(2, 3, 6, 4), ma.queries)
    np.testing.assert_array_equal(_f32(p["values"]).reshape(2, 3, 6, 4), ma.values)
    mask = np.frombuffer(base64.b64decode(p["mask"]), dtype=np.uint8).reshape(6, 6)
    np.testing.assert_array_equal(mask.astype(bool), ma.mask)
    assert p["tokens"] == TOKENS and p["causal"] is True and p["scale"] == pytest.approx(0.5)


def test_payload_carries_each_layers_mask_softcap_and_bias():
    from viz.fakes import recorded_capture

    gemma, t5 = recorded_capture("gemma2"), recorded_capture("t5")
    p = payload(gemma)
    masks = np.frombuffer(base64.b64decode(p["layer_masks"]), dtype=np.uint8).reshape(2, 8, 8)
    np.testing.assert_array_equal(masks.astype(bool), gemma.layer_masks)
    assert p["softcap"] == [1.0, 1.0] and p["bias"] is None
    p = payload(t5)
    assert p["layer_masks"] is None and p["softcap"] is None
    np.testing.assert_allclose(_f32(p["bias"]).reshape(2, 4, 8, 8), t5.bias, rtol=1e-6)
    assert payload(fake_capture(TOKENS))["bias"] is None


def test_payload_weights_only_capture():
    p = payload(fake_capture(TOKENS, qkv=False))
    assert p["queries"] is None and p["D"] is None


@pytest.mark.parametrize("change, name", [
    (lambda ma: setattr(ma, "tokens", ma.tokens[:-1]), "tokens"),
    (lambda ma: setattr(ma, "mask", ma.mask[:-1]), "mask"),
    (lambda ma: setattr(ma, "weights", ma.weights[0]), "weights"),
    (lambda ma: setattr(ma, "keys", ma.keys[:, :1]), "keys"),
])
def test_payload_rejects_inconsistent_captures(change, name):
    ma = fake_capture(TOKENS)
    change(ma)
    with pytest.raises(AttnlabError, match=f"^{name}: expected"):
        payload(ma)


def test_page_has_no_external_references_and_a_matching_csp():
    doc = page_html(fake_capture(TOKENS), text="The cat sat on the mat")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", doc, re.I)
    assert "<link" not in doc and "@import" not in doc and "url(" not in doc
    scripts = re.findall(r"<script>(.*?)</script>", doc, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    policy = html.unescape(
        re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc).group(1))
    assert f"'sha256-{digest}'" in policy
    assert "connect-src 'none'" in policy and "default-src 'none'" in policy


def test_tokens_cannot_become_markup():
    evil = [XSS, "</script><script>alert(2)</script>", "{js}", "a&amp;b"]
    doc = page_html(fake_capture(evil), text=" ".join(evil))
    assert "<img" not in doc
    assert doc.count("<script") == 2  # the data block and the app script, nothing injected
    data = re.search(r'id="attn-data">(.*?)</script>', doc, re.S).group(1)
    import json

    assert json.loads(data)["tokens"] == evil  # escaped for HTML, exact again for JS


def test_json_for_script_escapes_closing_tags():
    s = json_for_script({"t": "</script><!--&"})
    assert "<" not in s and ">" not in s and "&" not in s


def test_write_page(tmp_path):
    out = write_page(fake_capture(TOKENS), tmp_path / "v.html", text="hi")
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
