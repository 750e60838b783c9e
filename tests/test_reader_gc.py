"""Readers run without cyclic garbage collection (converters.fewer_collections) and leave the
collector as they found it, whatever happens inside."""

from __future__ import annotations

import gc

import pytest

from echo_et.converters import fewer_collections


def test_collector_off_inside_and_restored_after():
    before = gc.get_threshold()
    assert gc.isenabled()
    with fewer_collections():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("reader failed")
    assert gc.isenabled() and gc.get_threshold() == before


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with fewer_collections():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
