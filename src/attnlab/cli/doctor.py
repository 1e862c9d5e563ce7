"""`attnlab doctor`: what this machine gives attnlab: versions, threads, the CPU's SIMD features,
and whether the compiled interval kernel is built, for which ISA, and if not, why."""

from __future__ import annotations

from attnlab.cli.options import command


def add_parser(sub):
    p = command(sub, "doctor", __doc__, "report the compiled kernel's build, ISA and why-not")
    p.add_argument("--no-build", action="store_true",
                   help="only look: do not build the kernel if it is not built yet")
    return p


def run(args) -> int:
    import platform

    import torch

    from attnlab import __version__
    from attnlab.ops.kernels import build
    from attnlab.ops.kernels.isa import cpu_flags

    flags = cpu_flags()
    simd = sorted(f for f in flags if f.startswith(("avx", "fma", "sse4", "amx")))
    st = build.status(build=not args.no_build)
    rows = [
        ("attnlab", __version__),
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (threads: {torch.get_num_threads()}, capability: "
                  f"{torch.backends.cpu.get_cpu_capability()})"),
        ("cpu", f"{platform.machine()}, {len(simd)} SIMD features: {' '.join(simd) or 'none'}"),
        ("kernel builds this CPU runs", ", ".join(st.runnable)),
        ("interval kernel", ("not available" if not st.built else "prebuilt, from the wheel"
                             if "the wheel" in st.reason else "built")
         + (f" [{st.isa}]" if st.isa else "")),
        ("  why", st.reason),
        ("  switches", "ATTNLAB_KERNEL=0 turns it off; ATTNLAB_KERNEL_ISA=avx512|avx2|scalar "
                       "forces a build; ATTNLAB_CACHE_DIR moves the cache"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
