"""Package discovery only: `converters/` is installed as `echo_et.converters` (DESIGN.md section 9)."""

from setuptools import find_packages, setup

# the model presets are folders of JSON, not modules: listed as (namespace) packages so that
# setuptools installs their data as such, not through the deprecated path it warns about
PRESETS = ["echo_et.models.comm.presets", "echo_et.models.compute.presets"]

packages = ["echo_et", *(f"echo_et.{p}" for p in find_packages("echo_et")), *PRESETS]
packages += ["echo_et.converters", *(f"echo_et.converters.{p}" for p in find_packages("converters"))]

setup(
    packages=packages,
    package_dir={"echo_et": "echo_et", "echo_et.converters": "converters"},
    package_data={"echo_et": ["py.typed"], **{p: ["*.json"] for p in PRESETS}},
)
