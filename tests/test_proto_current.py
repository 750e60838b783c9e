"""The committed generated code (echo_et/_proto) is what proto/echo_et.proto generates today.

Regenerates with grpc_tools.protoc into a temporary folder and compares. The only lines
allowed to differ are the protobuf version stamps, which follow the grpcio-tools release
that ran protoc; the schema itself (the serialized descriptor and the typing stub) must be
identical.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import REPO

PROTO = REPO / "proto" / "echo_et.proto"
COMMITTED = REPO / "echo_et" / "_proto"
REGENERATE = ("python -m grpc_tools.protoc -Iproto --python_out=echo_et/_proto "
              "--pyi_out=echo_et/_proto proto/echo_et.proto")

_STAMP = re.compile(r"^# Protobuf Python Version: .*$", re.M)
_RUNTIME_CHECK = re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)", re.S)


def normalise(text: str) -> str:
    return _RUNTIME_CHECK.sub("<runtime check>", _STAMP.sub("<version>", text))


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("proto")
    proc = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={out}",
         f"--pyi_out={out}", str(PROTO)],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("name", ["echo_et_pb2.py", "echo_et_pb2.pyi"])
def test_generated_code_is_current(regenerated, name):
    fresh = (regenerated / name).read_text()
    committed = (COMMITTED / name).read_text()
    assert normalise(fresh) == normalise(committed), (
        f"echo_et/_proto/{name} is stale: regenerate with `{REGENERATE}`")


def test_descriptor_matches_the_loaded_module(regenerated):
    """The bytes protoc embeds are the descriptor the installed package really uses."""
    from echo_et._proto import echo_et_pb2

    fresh = (regenerated / "echo_et_pb2.py").read_text()
    m = re.search(r"AddSerializedFile\((b'.*?')\)\n", fresh, re.S)
    assert m, "no serialized descriptor in the generated module"
    assert ast.literal_eval(m.group(1)) == echo_et_pb2.DESCRIPTOR.serialized_pb
