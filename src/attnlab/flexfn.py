"""Flex's functions in attnlab's convention: called on broadcast index tensors where they
broadcast, under torch.vmap where they don't.

attnlab calls a mask_mod / score_mod once per block of pairs, on broadcast index tensors
b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, R, 1), kv_idx (1, 1, 1, C) (and scores (B, H, R, C)):
one call of elementwise ops per block. torch's Flex calls the same function on scalars, nested
under torch.vmap over (b, h, q_idx, kv_idx). Most Flex functions run either way; some only on
scalars: `intervals[image_idx]; interval[0]` (attention-gym's Flamingo mask), `torch.dot(
q_rope[b, h, q_idx], k_rope[b, h, kv_idx])` (its MLA score_mod), a `torch.where` over a
row-shaped lookup. `Adapted` runs such a function in the form that gives Flex's answer:

- broadcast form: fn on the broadcast tensors (the fast form), kept when it runs, returns a
  result that broadcasts to the block, and agrees with the vmap form on a sample of the block's
  pairs (the first, second, middle, second-to-last and last of each index; on an accelerator
  the shape alone decides, as comparing values would wait for the device);
- vmap form: fn under torch.vmap over (b, h, q_idx, kv_idx), as Flex's eager path calls it
  (with Flex's getitem-as-index transform where plain indexing by a batched scalar fails),
  for the rest.

The choice is made on the first block of each shape class (which dims of each argument hold
more than one entry: sizes of 1 are where the two forms part; a growing length keeps its
decision) and kept for it, so a function pays the sample check (~1-3 ms) once per class.
`form` says which form the latest shape took (`select_backend` reports it).

Caution: the broadcast form is checked on a sample, not on every pair; a function whose
broadcast form agrees with its scalar form on the sampled positions but not elsewhere would
need `form="vmap"` (pass `attnlab.flex.vmapped(fn)`), which always takes the vmap form.
"""

from __future__ import annotations

import contextlib

import torch

from attnlab.errors import AttnlabError

BROADCAST, VMAP = "broadcast", "vmap"
#: positions of each index the broadcast form is checked at against the vmap form
SAMPLE = 5


class Adapted:
    """fn (a Flex mask_mod when `score` is False, score_mod when True) in attnlab's broadcast
    convention; `forced`: "vmap" to skip the broadcast form."""

    def __init__(self, fn, score: bool, forced: str | None = None):
        if not callable(fn):
            what = "score_mod(score, b, h, q_idx, kv_idx)" if score else \
                "mask_mod(b, h, q_idx, kv_idx)"
            raise AttnlabError(f"{'score_mod' if score else 'mask_mod'}: expected a callable "
                               f"{what}, got {type(fn).__name__}")
        self.fn, self.score, self.forced = fn, score, forced
        self._forms: dict = {}  # shape key -> BROADCAST / VMAP
        #: under vmap, `t[idx]` needs Flex's getitem-as-index transform (plain indexing by a
        #: batched scalar serves most functions and, unlike the transform, has a backward for
        #: gathered rows of a captured tensor)
        self._as_index = False
        self.form: str | None = forced
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    @property
    def flex_fn(self):
        """The function as the user wrote it: what Flex's own kernels are given."""
        return self.fn

    def __call__(self, *args):
        # the shape's class: which dims of each argument hold more than one entry (a growing
        # length, e.g. decoding, keeps its decision; a size of 1 is where forms differ)
        key = (*(tuple(n > 1 for n in a.shape) for a in args), str(args[-1].device))
        form = self._forms.get(key)
        if form is None:
            form, out = self._decide(args)
            self._forms[key] = self.form = form
            return out
        self.form = form
        return self._broadcast(args) if form == BROADCAST else self._vmapped(args)

    def _broadcast(self, args):
        return self.fn(*args)

    def _vmapped(self, args):
        """fn under four nested vmaps over (b, h, q_idx, kv_idx): (B, H, R, C)."""
        idx = [a.reshape(-1) for a in args[-4:]]  # (B,), (H,), (R,), (C,)
        fn = self.fn
        lead = (0,) if self.score else ()
        for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None),
                     (0, None, None, None)):
            fn = torch.vmap(fn, in_dims=lead + dims, out_dims=0)
        first = []
        if self.score:  # the scores as (B, H, R, C) (the kernels hand over views that broadcast)
            first = [args[0].expand(*(len(i) for i in idx))]
        if not self._as_index:
            try:
                return fn(*first, *idx)
            except Exception:
                self._as_index = True
        with _getitem_as_index():
            return fn(*first, *idx)

    def _decide(self, args):
        """(form, fn's result on args) for a new shape."""
        if self.forced == VMAP:
            return VMAP, self._vmapped(args)
        try:
            out, err = self._broadcast(args), None
        except Exception as e:
            out, err = None, e
        if err is not None or not _fits(out, args):
            try:
                return VMAP, self._vmapped(args)
            except Exception:
                if err is not None:
                    raise err from None
                return BROADCAST, out  # the caller says what is wrong with the result
        if args[-1].device.type != "cpu":  # comparing values would sync the device: shapes only
            return BROADCAST, out
        try:
            want = self._vmapped(_sample(args))
        except Exception:
            return BROADCAST, out
        got = _pick(out.expand(_block_shape(args)), args)
        if want.shape != got.shape or not _same(got, want):
            return VMAP, self._vmapped(args)
        return BROADCAST, out

    def __repr__(self):
        return f"Adapted({self.__name__}, form={self.form})"


def _fits(out, args) -> bool:
    """out is a tensor that broadcasts to the block (B, H, R, C) without growing it."""
    if not isinstance(out, torch.Tensor):
        return False
    try:
        return torch.broadcast_shapes(tuple(out.shape), _block_shape(args)) == _block_shape(args)
    except RuntimeError:
        return False


def _block_shape(args) -> tuple[int, ...]:
    """(B, H, R, C) of a call's broadcast index tensors."""
    return tuple(a.numel() for a in args[-4:])


def _positions(n: int) -> list[int]:
    return sorted({0, 1, n // 2, n - 2, n - 1} & set(range(n)))[:SAMPLE]


def _sample(args):
    """args restricted to a few positions of each index (scores at those pairs)."""
    idx = [a.reshape(-1) for a in args[-4:]]
    pos = [torch.tensor(_positions(len(i)), device=i.device) for i in idx]
    sub = [i[p].reshape(shape) for i, p, shape in zip(
        idx, pos, ((-1, 1, 1, 1), (1, -1, 1, 1), (1, 1, -1, 1), (1, 1, 1, -1)))]
    if len(args) == 5:
        s = args[0].expand(_block_shape(args))
        s = s[pos[0]][:, pos[1]][:, :, pos[2]][:, :, :, pos[3]]
        return (s, *sub)
    return tuple(sub)


def _pick(x: torch.Tensor, args) -> torch.Tensor:
    """x (B, H, R, C) at the sampled positions."""
    pos = [torch.tensor(_positions(a.numel()), device=x.device) for a in args[-4:]]
    return x[pos[0]][:, pos[1]][:, :, pos[2]][:, :, :, pos[3]]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return a.dtype == b.dtype and bool((a == b).all())
    a, b = a.detach(), b.detach().to(a.dtype)
    return bool(torch.isclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True).all())


@contextlib.contextmanager
def _getitem_as_index():
    """`tensor[idx]` with a batched 0-d idx as torch.ops.aten.index, as Flex's eager path does
    (plain Python indexing would ask the batched scalar for its value)."""
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    except ImportError:  # a torch without it: indexing by tensors works as it does there
        yield
        return
    with TransformGetItemToIndex():
        yield


def adapt(fn, score: bool):
    """fn as an `Adapted` (None stays None; an Adapted or an attnlab modifier with `bind`, which
    broadcasts by construction, is returned as it is)."""
    if fn is None or isinstance(fn, Adapted) or callable(getattr(fn, "bind", None)):
        return fn
    return Adapted(fn, score)


def vmapped(fn, score: bool | None = None) -> Adapted:
    """fn always called under torch.vmap, as Flex calls it (see the module's Caution); `score`:
    whether fn is a score_mod (default: 5 positional parameters, as Flex decides)."""
    if score is None:
        from torch.nn.attention.flex_attention import _get_mod_type, _ModificationType

        score = _get_mod_type(fn) == _ModificationType.SCORE_MOD
    return Adapted(fn, score, forced=VMAP)


def describe(p) -> list[str]:
    """"mask_mod NAME: FORM form" / "score_mod NAME: FORM form" for each Flex function of a
    validated call (its structured mask's functions, its score_mod), probing a function that has
    not run yet on a few pairs of the call (that probe is its first block of that shape)."""
    d, dev = p.dims, p.query.device
    ar = lambda n: torch.arange(min(n, 8), device=dev)  # noqa: E731
    said = []
    for m in _parts(p.structured):
        fn = m.__dict__.get("_adapted", m.__dict__.get("fn"))
        if not isinstance(fn, Adapted):
            continue
        if fn.form is None:
            fn(ar(m.batch_size)[:, None, None, None], ar(m.heads)[None, :, None, None],
               ar(d.L)[None, None, :, None], ar(d.S)[None, None, None, :])
        said.append(f"mask_mod {fn.__name__}: {fn.form} form")
    mod = p.score_mod
    if isinstance(mod, Adapted):
        if mod.form is None:
            B = 1
            for n in d.batch:
                B *= n
            s = torch.zeros(min(B, 8), min(d.H, 8), min(d.L, 8), min(d.S, 8),
                            dtype=p.query.dtype, device=dev)
            mod(s, ar(B)[:, None, None, None], ar(d.H)[None, :, None, None],
                ar(d.L)[None, None, :, None], ar(d.S)[None, None, None, :])
        said.append(f"score_mod {mod.__name__}: {mod.form} form")
    return said


def _parts(mask) -> list:
    """The leaves of a mask's & | ~ tree (duck-typed: no import of attnlab.masks here)."""
    if mask is None:
        return []
    kids = [getattr(mask, n) for n in ("a", "b") if hasattr(mask, n)]
    return [x for k in kids for x in _parts(k)] if kids else [mask]
