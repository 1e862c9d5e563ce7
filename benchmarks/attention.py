"""Attention benchmark: attnlab vs PyTorch SDPA, a naive implementation and FlexAttention.

    .venv/bin/python benchmarks/attention.py --quick          # < 2 minutes
    .venv/bin/python benchmarks/attention.py --L 1024 4096 16384 --dtypes fp32

Same engine and flags as `attnlab bench` (see `attnlab bench --help`); the configs, timing and
memory method live in `attnlab.bench`.
"""

import sys

from attnlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
