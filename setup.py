"""setuptools' entry for the one thing pyproject.toml cannot say: a wheel that carries the
prebuilt interval kernels (`tools/build_wheel.py` stages them in
src/attnlab/ops/kernels/prebuilt/) is a platform wheel, tagged for this Python and machine;
without them the wheel stays pure (the kernel is then built on first use)."""

from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution

PREBUILT = Path(__file__).parent / "src" / "attnlab" / "ops" / "kernels" / "prebuilt"


class Distribution_(Distribution):
    def has_ext_modules(self):
        return (PREBUILT / "manifest.json").is_file()


setup(distclass=Distribution_)
