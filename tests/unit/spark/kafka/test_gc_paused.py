"""`kafka.source.gc_paused`: the cyclic collector is off inside the block and as it was after it (errors included);
a collector the caller had disabled stays disabled."""
from __future__ import annotations

import gc

import pytest

from handoff_spark.kafka.source import gc_paused


def test_the_collector_is_off_inside_and_back_on_after_also_after_an_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with gc_paused():
            raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
