"""The package's one C extension (engine/records/_kernels.c); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("engine.records._kernels", ["engine/records/_kernels.c"],
                             extra_compile_args=["-O3", "-std=c99", "-Wall"])])
