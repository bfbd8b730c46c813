"""What test_c_sanitizers.py runs in a child Python against an ASan + UBSan build of `_json_arrow` (tests/sanitizers.py
puts it in place as `handoff_spark.decode._json_arrow` first).

Three parts: the seed corpus and a generated set through the whole differential check (decode_fuzz_support.check:
every tier, `_json_arrow` being the sanitized one); each of those values also straight into `_json_arrow.decode` and
`one_object_each`, alone and as one batch, in buffers that end exactly where the values do (so that reading one
byte past the data is a heap-buffer-overflow ASan sees: Arrow's own buffers are padded to 64 bytes), at several
depth limits and column kinds; and calls with arguments out of range (negative, huge, inconsistent), which must be
refused with an exception, not read or computed past what is defined.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

import decode_fuzz_support as fuzz
from handoff_spark.decode import _json_arrow
from handoff_spark.config import SchemaPolicy

KINDS = {"long": _json_arrow.LONG, "int": _json_arrow.LONG, "double": _json_arrow.DOUBLE, "float": _json_arrow.DOUBLE,
         "boolean": _json_arrow.BOOL, "string": _json_arrow.STRING, "timestamp": _json_arrow.STRING,
         "timestamptz": _json_arrow.STRING, "date": _json_arrow.STRING}
#: Some values are placed after this many spaces, so that even a short one ends a buffer over 16 bytes (ctypes keeps
#: 16 bytes or fewer inside its object, where ASan has no redzone).
LEAD = 24


def exact(data: bytes) -> Any:
    """A buffer holding exactly `data`, allocated by malloc on its own (ASan's redzone right after it)."""
    return ctypes.create_string_buffer(data, len(data)) if data else b""


def columns_of(policy: SchemaPolicy) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    kinds = tuple(_json_arrow.TEXT if c.type.startswith("decimal(") else KINDS[c.type] for c in policy.columns)
    return tuple(c.name.encode() for c in policy.columns), kinds


def prefixes(value: bytes, policy: SchemaPolicy) -> int:
    """Every prefix of the value, each ending exactly where its buffer does: out-of-bounds reads happen where a token
    is cut off by the end of the data (an escape, a UTF-8 sequence, a number, a literal), and a generated value
    rarely ends just there."""
    names, kinds = columns_of(policy)
    for end in range(len(value) + 1):
        data = b" " * LEAD + value[:end]
        offsets = exact(struct.pack("<3i", 0, LEAD, len(data)))
        buf = exact(data)
        _json_arrow.decode(offsets, buf, 1, 1, names, kinds, True, policy.limits.max_depth)
        _json_arrow.one_object_each(offsets, buf, 1, 1, policy.limits.max_depth)
    return 2 * (len(value) + 1)


def direct(values: list[bytes | None], policy: SchemaPolicy, cut: bool = True) -> int:
    """Each value alone (and, if `cut`, each of its prefixes), then all as one batch, into `decode` and
    `one_object_each`; returns the calls made."""
    names, kinds = columns_of(policy)
    calls = 0
    present = [v for v in values if v is not None]
    for v in present:
        if cut and len(v) <= 512:
            calls += prefixes(v, policy)
        data = b" " * LEAD + v
        offsets = exact(struct.pack("<3i", 0, LEAD, len(data)))
        buf = exact(data)
        for depth in (1, 2, policy.limits.max_depth, 512):
            for ignore in (True, False):
                _json_arrow.decode(offsets, buf, 1, 1, names, kinds, ignore, depth)
            _json_arrow.one_object_each(offsets, buf, 1, 1, depth)
            calls += 3
    blob = b"".join(present)
    bounds = [0]
    for v in present:
        bounds.append(bounds[-1] + len(v))
    offsets = exact(struct.pack(f"<{len(bounds)}i", *bounds))
    buf = exact(blob)
    _json_arrow.decode(offsets, buf, 0, len(present), names, kinds, True, policy.limits.max_depth)
    _json_arrow.one_object_each(offsets, buf, 0, len(present), policy.limits.max_depth)
    return calls + 2


def refused(call: Any) -> bool:
    try:
        call()
    except (ValueError, TypeError, OverflowError):
        return True
    return False


def out_of_range_arguments() -> int:
    """Arguments a caller could get wrong: each refused with an exception (or declined: None/False), none read past
    a buffer or overflowing an integer."""
    data = exact(b'{"id": 1}{"id": 2}')
    offs = exact(struct.pack("<3i", 0, 9, 18))
    names, kinds = (b"id",), (_json_arrow.LONG,)
    big = 2 ** 62
    cases = [
        lambda: _json_arrow.decode(offs, data, -1, 1, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 0, -1, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, big, big, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 1, big, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 2 ** 63 - 1, 1, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 3, names, kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, kinds, True, 0),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, kinds, True, 513),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, kinds, True, 2 ** 31),
        lambda: _json_arrow.decode(offs, data, 0, 2, ("id",), kinds, True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, (99,), True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, (-1,), True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, (2 ** 40,), True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, names, (), True, 64),
        lambda: _json_arrow.decode(offs, data, 0, 2, (b"c",) * 65, (0,) * 65, True, 64),
        lambda: _json_arrow.one_object_each(offs, data, -1, 1, 64),
        lambda: _json_arrow.one_object_each(offs, data, big, big, 64),
        lambda: _json_arrow.one_object_each(offs, data, 2 ** 63 - 1, 1, 64),
        lambda: _json_arrow.one_object_each(offs, data, 0, 2, 0),
        lambda: _json_arrow.one_object_each(offs, data, 0, 3, 64),
    ]
    for n, case in enumerate(cases):
        assert refused(case), f"out-of-range call {n} was not refused"
    # Offsets that disagree with the data: declined, never read past it.
    for bounds in ([0, 9, 4, 18], [0, 9, 1_000_000, 18], [-5, 9, 18], [0, 9, -1], [18, 9, 18], [0, 0, 0]):
        offsets = exact(struct.pack(f"<{len(bounds)}i", *bounds))
        try:
            assert _json_arrow.decode(offsets, data, 0, len(bounds) - 1, names, kinds, True, 64) is None
            assert _json_arrow.one_object_each(offsets, data, 0, len(bounds) - 1, 64) is False
        except ValueError:
            pass
    return len(cases)


def main(generated_values: int) -> None:
    calls = out_of_range_arguments()
    corpus = fuzz.corpus()
    for value in corpus.values():
        for policy in fuzz.CORPUS_POLICIES:
            fuzz.check_values([value], policy)
            calls += direct([value], policy)
    tally = fuzz.Tally()
    round_ = 0
    while tally.values < generated_values:  # rounds of 50 batches, round r under hypothesis seed r
        @seed(round_)
        @settings(max_examples=50, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=fuzz.batches())
        def generated(case: fuzz.Case) -> None:
            nonlocal calls
            fuzz.check(case, tally)
            calls += direct(case.values, case.policy)

        generated()
        round_ += 1
    print(f"sanitized _json_arrow: {len(corpus)} corpus values, {tally.values} generated values, {calls} direct calls")
