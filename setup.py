"""Package discovery only: `converters/` is installed as `echo_et.converters` (DESIGN.md section 9)."""

from setuptools import find_packages, setup

packages = ["echo_et", *(f"echo_et.{p}" for p in find_packages("echo_et"))]
packages += ["echo_et.converters", *(f"echo_et.converters.{p}" for p in find_packages("converters"))]

setup(
    packages=packages,
    package_dir={"echo_et": "echo_et", "echo_et.converters": "converters"},
    package_data={"echo_et": ["py.typed", "data/*.json", "models/comm/presets/*.json",
                              "models/compute/presets/*.json"]},
)
