"""Shared test helpers: comparisons that report max and mean difference, the FlashAttention rule,
and random attention inputs."""

from __future__ import annotations

import numpy as np
import torch

from attnlab import reference

# slack added to the FlashAttention rule so float64 (error ~1e-16) doesn't compare noise to noise
SLACK = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 1e-4}


def diff_report(actual, expected) -> str:
    a = torch.as_tensor(np.asarray(actual, dtype=np.float64)) if not torch.is_tensor(actual) \
        else actual.detach().double()
    e = torch.as_tensor(np.asarray(expected, dtype=np.float64)) if not torch.is_tensor(expected) \
        else expected.detach().double()
    d = (a - e).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return f"max diff {d.max().item() if d.numel() else 0:.3e}, mean diff " \
           f"{d.mean().item() if d.numel() else 0:.3e}, shape {tuple(a.shape)}"


def assert_close(actual, expected, atol=1e-6, rtol=1e-6, what="values"):
    """actual equals expected (tensors, arrays or lists) in shape and within atol + rtol·|expected|
    everywhere (NaN never passes); the message names `what` and reports max and mean difference."""
    a = torch.as_tensor(np.asarray(actual.detach().cpu().double() if torch.is_tensor(actual)
                                   else actual, dtype=np.float64))
    e = torch.as_tensor(np.asarray(expected.detach().cpu().double() if torch.is_tensor(expected)
                                   else expected, dtype=np.float64))
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    ok = torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=False) | (a == e)
    assert bool(ok.all()), f"{what}: {diff_report(a, e)}"


def close(a, b, atol=1e-5, what="output"):
    """`assert_close` with an absolute tolerance only: |a - b| <= atol everywhere."""
    assert_close(a, b, atol=atol, rtol=0.0, what=what)


def max_err(x, ref) -> float:
    d = (x.detach().double() - torch.as_tensor(np.asarray(ref), dtype=torch.float64)).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max()) if d.numel() else 0.0


def assert_fa_rule(out, plain, ref, factor: float, dtype, what="output"):
    """FlashAttention's rule: err(out) <= factor * err(plain same-dtype implementation)."""
    e, e_plain = max_err(out, ref), max_err(plain, ref)
    assert e <= factor * e_plain + SLACK[dtype], (
        f"{what}: error {e:.3e} vs float64 oracle exceeds {factor}x the plain {dtype} "
        f"implementation's {e_plain:.3e} ({diff_report(out, torch.as_tensor(np.asarray(ref)))})"
    )


def plain_attention(q, k, v, allowed=None, bias=None, scale=None):
    """softmax(q kᵀ · scale + mask) @ v in the inputs' dtype, nothing clever (GQA by repeat)."""
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale  # (..., H, L, D) @ (..., H, D, S) -> (..., H, L, S)
    if bias is not None:
        s = s + bias.to(s.dtype)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # (..., H, L, S) @ (..., H, S, Dv) -> (..., H, L, Dv)


def oracle(q, k, v, allowed=None, bias=None, scale=None):
    """(out, lse) from the NumPy float64 reference, as float64 tensors."""
    np_ = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
    out, lse = reference.attention(np_(q), np_(k), np_(v),
                                   mask=None if allowed is None else allowed.numpy(),
                                   scale=scale, bias=np_(bias))
    return torch.from_numpy(out), torch.from_numpy(lse)


def qkv(B, H, Hkv, L, S, D, Dv=None, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa
    q, k, v = mk(B, H, L, D), mk(B, Hkv, S, D), mk(B, Hkv, S, Dv or D)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def tiles_from_dense(dense, bq, bk):
    """int8 (B, H, ceil(L/bq), ceil(S/bk)) tile classes of a dense bool (B, H, L, S) mask, tile by
    tile: the oracle of every mask's `tiles`."""
    from attnlab.masks import EMPTY, FULL, PARTIAL

    B, H, L, S = dense.shape
    out = torch.empty(B, H, -(-L // bq), -(-S // bk), dtype=torch.int8)
    for a in range(out.shape[2]):
        for c in range(out.shape[3]):
            t = dense[:, :, a * bq:(a + 1) * bq, c * bk:(c + 1) * bk]
            out[:, :, a, c] = torch.where(t.all(-1).all(-1), FULL,
                                          torch.where(t.any(-1).any(-1), PARTIAL, EMPTY))
    return out


def load_script(name: str):
    """benchmarks/<name>.py as a module, for a fixture to `yield from`: registered in sys.modules
    while in use (its dataclasses look their module up there)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"attnlab_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def docs_hook(name: str):
    """docs/hooks/<name>.py as a module (the site's hooks are files, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrap_backends(monkeypatch, wrap) -> None:
    """Every backend's forward (and checked forward) f replaced by wrap(name, f) for one test."""
    import dataclasses

    from attnlab.ops import backends

    for name, b in list(backends.REGISTRY.items()):
        checked = None if b.checked is None else wrap(name, b.checked)
        monkeypatch.setitem(backends.REGISTRY, name,
                            dataclasses.replace(b, forward=wrap(name, b.forward), checked=checked))


def spy_backends(monkeypatch) -> list[str]:
    """The names of the backends that run, one entry per forward (or checked forward) call."""
    ran: list[str] = []

    def wrap(name, f):
        return lambda p, need_lse: ran.append(name) or f(p, need_lse)

    wrap_backends(monkeypatch, wrap)
    return ran


def backend_names(*, without: tuple[str, ...] = ("flex",)) -> list[str]:
    """The backend names from the one list (the catalogue's backends the registry has,
    `tests/catalog.py`), less `without` (default "flex": torch compiles it, so its own tests run
    it); "interval" only where the kernel runs here (a compiler or a prebuilt library, and not
    ATTNLAB_KERNEL=0)."""
    from attnlab.ops import kernels
    from catalog import backends

    names = [b.name for b in backends() if b.name not in without]
    if "interval" in names and not kernels.available():
        names.remove("interval")
    return names


def numpy_saved_hooks():
    """(saved_tensors_hooks, store): pack hooks that move every tensor autograd saves to a NumPy
    copy (a fake storage), so a test can overwrite the inputs and see the backward read nothing
    else; `store` lists what was packed."""
    store: list = []

    def pack(t):
        store.append((t.detach().numpy().copy(), t.dtype))
        return len(store) - 1

    def unpack(i):
        return torch.from_numpy(store[i][0]).to(store[i][1])

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack), store
