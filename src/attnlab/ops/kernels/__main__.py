"""`python -m attnlab.ops.kernels build [--isa ISA|all]`: build the interval kernel ahead of use
(make demo / make test call it); prints one status line per build, never fails the caller."""

from __future__ import annotations

import argparse
import os


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.ops.kernels")
    ap.add_argument("command", choices=["build", "status"])
    ap.add_argument("--isa", default=None, help="avx512, avx2, scalar or all (default: chosen)")
    a = ap.parse_args(argv)
    from attnlab.ops.kernels import build

    isas = build.runnable() if a.isa == "all" else [a.isa]
    for isa in isas:
        if isa:
            os.environ["ATTNLAB_KERNEL_ISA"] = isa
        st = build.status(build=a.command == "build")
        state = "built" if st.built else "not available"
        print(f"interval kernel [{st.isa}]: {state}: {st.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
