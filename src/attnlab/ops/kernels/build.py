"""Building and loading the interval kernel: each ISA's flags, the cache, the status (which ISA
this CPU runs is `isa.py`; ninja and the build lock, `toolchain.py`).

Each ISA is its own build (its own compile flags, its own shared library, its own torch-op
namespace), compiled on first use by `torch.utils.cpp_extension` with ninja into

    $ATTNLAB_CACHE_DIR (default ~/.cache/attnlab) / kernels / <isa>-<source hash>-torch<version>/

The build runs in a temporary folder that is renamed into place when it is complete (its files
and folder fsynced first), under a file lock, so two processes building at once never see half a
library. Folders are created 0700. Nothing in the cache is trusted (`trust`): before a library is
loaded, it and every folder up to the cache root must be this user's and writable by no one
else, and its sha256 must be the one recorded at build time. A damaged library (truncated,
modified, no record) is rebuilt; a foreign one (another owner, a group/world-writable folder)
is left alone and attnlab runs its PyTorch path; either with one warning. A failure (no compiler, no
ninja, a compile error) is remembered for the process and warned about once; `available()` is
then False and attnlab runs its PyTorch path.

Environment: ATTNLAB_KERNEL=0 turns the kernel off; ATTNLAB_KERNEL_ISA=avx512|avx2|scalar forces
one build (a build this CPU cannot run is reported as unavailable, never run).

A wheel built by `make wheel` carries the three ISAs' libraries for the torch it was built
against (`prebuilt.py`): they are loaded, hash-checked, before anything is built, and a build
happens only for another torch or when the wheel's library is damaged.

Caution: builds need a C++17 compiler (`c++`, or $CXX) and the `ninja` package; a first build
takes about half a minute on an idle machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from attnlab.ops.kernels import trust
from attnlab.ops.kernels.isa import KernelUnavailable, chosen_isa, enabled, lacking, runnable
from attnlab.ops.kernels.toolchain import locked, ninja_on_path

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("ops.cpp", "fwd.cpp", "bwd.cpp", "weights.cpp", "decode.cpp", "decode_entry.cpp",
           "decode_serve.cpp", "probe.cpp", "serve.cpp")
HEADERS = ("decode.h", "decode_entry.h", "helpers.h", "interval.h", "plan_key.h", "pool.h",
           "probe.h", "python_entry.h", "queue.h", "tiles.h", "vec.h")
_X86 = ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"]
ISA_FLAGS = {
    "avx512": [*_X86, "-mavx2", "-mfma", "-mf16c", "-DATTNLAB_AVX512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DATTNLAB_AVX2"],
    "scalar": [],
}
#: the ops each build registers (csrc/ops.cpp)
OPS = ("fwd", "bwd", "keys_last", "keys_last_checked", "rows_padded", "weights", "simd_width",
       "math_probe", "all_finite", "row_dot", "fma_ceiling", "pool_cached_bytes", "pool_zeros",
       "decode", "decode_bf16_path", "pool_trim", "probe")
COMMON_FLAGS = ["-O3", "-fno-math-errno", "-Wno-maybe-uninitialized"]


@dataclass(frozen=True)
class KernelStatus:
    """Where the interval kernel stands in this process.

    built: the chosen ISA's library is loaded (or, from `status(build=False)`, in the cache);
    isa: the chosen build ("avx512", "avx2", "scalar"), None when the kernel is off;
    reason: why it is not available, or what was loaded from where;
    runnable: the ISA builds this CPU can run, best first.
    """

    built: bool
    isa: str | None
    reason: str
    runnable: tuple[str, ...]
    cache: str | None = None


# lazily filled per process: isa -> torch.ops namespace, or the reason it failed
_LOADED: dict[str, object] = {}
_FAILED: dict[str, str] = {}
_FROM: dict[str, str] = {}  # isa -> where its library was loaded from (a cache folder, the wheel)
_LOAD_LOCK = threading.Lock()  # one thread of a process builds or loads at a time
log = logging.getLogger("attnlab.kernels")


def cache_base() -> Path:
    """The cache root: $ATTNLAB_CACHE_DIR, else $XDG_CACHE_HOME/attnlab or ~/.cache/attnlab; the
    folders from a library up to it are the ones `trust.check_owner` checks."""
    base = os.environ.get("ATTNLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnlab")
    return Path(os.path.abspath(base))


def cache_root() -> Path:
    """Where the builds live: cache_base() / kernels."""
    return cache_base() / "kernels"


def build_key(isa: str) -> str:
    """<isa>-<hash of sources and flags>-torch<version>: a new source, flag or torch is a new
    build, never a stale library."""
    import torch

    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(" ".join(COMMON_FLAGS + ISA_FLAGS[isa]).encode())
    torch_v = re.sub(r"[^A-Za-z0-9._]", "_", torch.__version__)
    return f"{isa}-{h.hexdigest()[:12]}-torch{torch_v}"


def _names(isa: str) -> tuple[str, str]:
    """(library name, torch op namespace) of a build: unique per source hash and ISA."""
    name = "attnlab_interval_" + build_key(isa).split("-torch")[0].replace("-", "_")
    return name, name


def load(isa: str):
    """The torch.ops namespace of the `isa` build, building it first if needed. Raises
    KernelUnavailable with the reason when it cannot be had."""
    with _LOAD_LOCK:
        if isa in _LOADED:
            return _LOADED[isa]
        if isa in _FAILED:
            raise KernelUnavailable(_FAILED[isa])
        try:
            ops = _load(isa)
        except Exception as e:  # a build can fail in many ways; each leaves the PyTorch path
            _FAILED[isa] = _why(e)
            raise KernelUnavailable(_FAILED[isa]) from None
        _LOADED[isa] = ops
        return ops


def loaded():
    """The ops of a build already loaded in this process (any ISA), or None: never builds."""
    return next(iter(_LOADED.values()), None) if enabled() else None


def _why(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error:" in ln.lower()]
    text = "; ".join((errs or lines)[:3]) or type(e).__name__
    return text[:400]


def _load(isa: str):
    if isa not in runnable():
        raise KernelUnavailable(f"this CPU cannot run the {isa} build (it lacks "
                                f"{', '.join(lacking(isa))})")
    name, ns = _names(isa)
    wheel = _prebuilt(isa)
    if wheel is not None:  # the wheel's library for this torch: no compiler needed
        if not _has_ns(ns):
            _dlopen(wheel)
        _FROM[isa] = f"the wheel ({wheel})"
        return _ops(ns)
    final = cache_root() / build_key(isa)
    lib = final / f"{name}.so"
    damaged = _check_cached(lib)
    if damaged or not lib.exists():
        _build(isa, name, ns, final, damaged)
    if not _has_ns(ns):
        _trusted(lib)  # what a build (ours or another process's) left, checked once more
        _dlopen(lib)
    if damaged:
        warnings.warn(f"attnlab: rebuilt the {isa} interval kernel: the cached one was not "
                      f"loaded ({damaged})", RuntimeWarning, stacklevel=4)
    _FROM[isa] = str(final)
    return _ops(ns)


def _prebuilt(isa: str) -> Path | None:
    """The wheel's verified library of `isa` for this torch (`prebuilt.py`), or None; a damaged
    one is warned about and the kernel built as without a wheel."""
    from attnlab.ops.kernels import prebuilt

    try:
        return prebuilt.library(isa, build_key(isa))
    except trust.Untrusted as e:
        warnings.warn(f"attnlab: the wheel's {isa} interval kernel is not loaded ({e}); "
                      "building it instead", RuntimeWarning, stacklevel=5)
        return None


def library_path(isa: str) -> Path:
    """The file of the `isa` library this process loaded (building it first if needed)."""
    load(isa)
    lib = _from_path(isa)
    if not lib.exists():  # loaded from a cache folder since removed (another ATTNLAB_CACHE_DIR
        _load(isa)  # then): the current cache's file, built there if missing, not loaded again
        lib = _from_path(isa)
    return lib


def _from_path(isa: str) -> Path:
    where = _FROM[isa]
    if where.startswith("the wheel ("):
        return Path(where.removeprefix("the wheel (").removesuffix(")"))
    return Path(where) / f"{_names(isa)[0]}.so"


def _has_ns(ns: str) -> bool:
    """The build's ops are registered in this process (loaded before, or by its own build)."""
    import torch

    return hasattr(torch.ops, ns) and hasattr(getattr(torch.ops, ns), "fwd")


def _dlopen(lib: Path) -> None:
    """Load a library `trust.verify` passed (the one place attnlab dlopens a kernel)."""
    import torch

    torch.ops.load_library(str(lib))


def c_entry(symbol: str, ops=None):
    """The C function `symbol` of the build loaded in this process (of the build whose ops these
    are, given `ops`), called through ctypes with the GIL held (`ctypes.PyDLL` of the very
    library `_dlopen` loaded: the same handle, nothing loaded again), or None where no build is
    loaded or its file is gone (csrc/serve.cpp's `attnlab_cheap_entry`, csrc/decode_entry.cpp's
    `attnlab_decode_entry`, csrc/decode_serve.cpp's `attnlab_decode_serve_entry`)."""
    import ctypes

    isa = next((i for i, o in _LOADED.items() if ops is None or o is ops), None) if enabled() \
        else None
    if isa is None:
        return None
    try:  # RTLD_NOLOAD: only a library already loaded (gone from its folder since: None)
        return getattr(ctypes.PyDLL(str(_from_path(isa)), mode=os.RTLD_NOLOAD), symbol)
    except (OSError, AttributeError):
        return None


def c_functions(symbol: str, *args, ops=None) -> tuple | None:
    """The CPython functions the C entry `symbol` hands out (`c_entry`: of the loaded build, or
    of the build whose ops these are), called once with `args` (Python objects, then ints as
    C long longs), or None where no build is loaded."""
    import ctypes

    fn = c_entry(symbol, ops)
    if fn is None:
        return None
    fn.restype = ctypes.py_object
    fn.argtypes = [ctypes.c_longlong if type(a) is int else ctypes.py_object for a in args]
    return fn(*args)


def _ops(ns: str):
    import torch

    ops = getattr(torch.ops, ns)
    for op in OPS:  # each op's first lookup reads its schema (~0.2 ms): done here, once
        getattr(ops, op)
    return ops


def _check_cached(lib: Path) -> str | None:
    """None when `lib` is absent or may be loaded; why, when it is ours but damaged (rebuild
    it). Raises KernelUnavailable when it, or a folder above it, is not only ours."""
    base = cache_base()
    try:
        if os.path.lexists(lib):
            trust.verify(lib, base)
        else:  # the folders a build goes into
            for p in (lib.parent, lib.parent.parent, base):
                if os.path.lexists(p):
                    trust.check_owner(p, base)
                    break
    except trust.Untrusted as e:
        if e.foreign:
            raise KernelUnavailable(f"the kernel cache is not trusted: {e}") from None
        return str(e)
    return None


def _trusted(lib: Path) -> None:
    try:
        trust.verify(lib, cache_base())
    except trust.Untrusted as e:
        raise KernelUnavailable(f"the built kernel is not trusted: {e}") from None


def _build(isa: str, name: str, ns: str, final: Path, damaged: str | None = None) -> None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelUnavailable(_also(damaged, f"no C++ compiler: {cxx!r} is not on PATH "
                                               "(install g++ or set CXX)"))
    root = final.parent
    trust.private_dirs(root, cache_base())
    with locked(root / f"{final.name}.lock"):
        lib = final / f"{name}.so"
        if os.path.lexists(final):
            if _check_cached(lib) is None and lib.exists():
                return  # another process built it while we waited
            _discard(final)  # ours, damaged (checked by _check_cached)
        tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.", suffix=".tmp", dir=root))
        log.warning("attnlab: building the %s interval kernel into %s (once; about half a "
                    "minute)", isa, final)
        try:
            _compile(isa, name, ns, tmp)
            trust.record(tmp / f"{name}.so")
            trust.durable(tmp, final)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if damaged and isinstance(e, Exception):
                raise KernelUnavailable(_also(damaged, _why(e))) from None
            raise


def _also(damaged: str | None, why: str) -> str:
    return why if damaged is None else f"the cached kernel was damaged ({damaged}) and " \
        f"rebuilding it failed: {why}"


def _discard(final: Path) -> None:
    """Move a damaged build aside (one rename: no reader sees it half deleted), then delete it."""
    gone = Path(tempfile.mkdtemp(prefix=f"{final.name}.", suffix=".stale", dir=final.parent))
    os.rename(final, gone / "build")
    shutil.rmtree(gone, ignore_errors=True)


def _compile(isa: str, name: str, ns: str, build_dir: Path) -> None:
    """Compile and load the library in build_dir (loading it from there is what cpp_extension
    does; the folder is renamed afterwards and the loaded library stays valid)."""
    from torch.utils import cpp_extension

    with ninja_on_path(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpp_extension.load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=[*COMMON_FLAGS, *ISA_FLAGS[isa], f"-DATTNLAB_NS={ns}"],
            extra_include_paths=[str(CSRC)],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )


_WARNED: set[str] = set()


def get(isa: str | None = None):
    """The ops of `isa` (default: the chosen one), or None when the kernel is off or cannot be
    built; a failure is warned about once per process."""
    if not enabled():
        return None
    isa = isa or chosen_isa()
    try:
        return load(isa)
    except RuntimeError as e:
        if isa not in _WARNED:
            _WARNED.add(isa)
            warnings.warn(f"attnlab: the {isa} interval kernel is not available ({e}); "
                          "attention runs on the PyTorch path instead", RuntimeWarning,
                          stacklevel=3)
        return None


def status(build: bool = False) -> KernelStatus:
    """Whether the kernel is built, which ISA, and why not. build=True builds it if needed."""
    able = runnable()
    if not enabled():
        return KernelStatus(False, None, "turned off by ATTNLAB_KERNEL=0", able)
    try:
        isa = chosen_isa()
    except ValueError as e:
        return KernelStatus(False, None, str(e), able)
    final = cache_root() / build_key(isa)
    if isa in _LOADED:
        return KernelStatus(True, isa, f"loaded from {_FROM.get(isa, final)}", able, str(final))
    if isa in _FAILED:
        return KernelStatus(False, isa, _FAILED[isa], able, str(final))
    if build:
        try:
            load(isa)
        except RuntimeError as e:
            return KernelStatus(False, isa, str(e), able, str(final))
        return KernelStatus(True, isa, f"loaded from {_FROM[isa]}", able, str(final))
    if isa not in able:
        return KernelStatus(False, isa, f"this CPU cannot run the {isa} build", able, str(final))
    from attnlab.ops.kernels import prebuilt

    entry = (prebuilt.manifest() or {}).get("libraries", {}).get(isa, {})
    if entry.get("build_key") == build_key(isa):
        return KernelStatus(True, isa, f"in the wheel ({prebuilt.FOLDER / entry['file']})",
                            able, str(final))
    there = (final / f"{_names(isa)[0]}.so").exists()
    why = f"built in {final}" if there else f"not built yet: builds on first use into {final}"
    return KernelStatus(there, isa, why, able, str(final))
