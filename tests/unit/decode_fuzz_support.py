"""Differential fuzzing of decode.py's three JSON tiers: the hypothesis strategies and the one check they feed.

Why a support module: the same generator and check run in three places — the fuzz test in the suite
(test_decode_fuzz.py, >= 100,000 values), its long run (`HANDOFF_FUZZ_VALUES=10000000`), and a child Python whose
`_json_arrow` is an ASan + UBSan build (test_c_sanitizers.py) — and they must not drift apart.

The tiers (decode.py, module docstring): (1) `_json_arrow` C (`_native_parse` + `_finish`), (2) pyarrow's JSON reader
(`_arrow_parse` + `_finish`, only when `_one_object_each`), (3) `_slow_path`, record by record, the reference. The
check asserts, for every batch: the reference never raises and accounts for each record exactly once (a row or a
dead letter); a fast tier that takes a batch gives exactly the reference's table (schema and values, floats bit for
bit, so -0.0 is not 0.0) and the reference then has no dead letter in it; `decode_batch` (and its chunked variant
for big batches) gives the reference's table and dead letters; a value Python's strict JSON parser rejects is
never a row. Values are bytes built at the JSON-text level, so spellings the Python-value level cannot express
(`1e400`, `-0`, escapes, duplicate keys, invalid UTF-8, two objects in one value) are generated too, then some are
mutated byte by byte.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import json
import math
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from handoff_spark.decode import records as decode
from handoff_spark.config import SchemaPolicy
from handoff_spark.decode.records import SchemaIncompatible
from handoff_spark.kafka.source import ARROW_SCHEMA

#: Where the seed corpus lives: one value per file, the bytes exactly as a Kafka record's value.
CORPUS = Path(__file__).resolve().parents[1] / "data" / "json_fuzz_corpus"
#: `HANDOFF_FUZZ_VALUES`: how many generated values the fuzz test checks (the suite's run: 100,000).
VALUES_ENV = "HANDOFF_FUZZ_VALUES"
DEFAULT_VALUES = 100_000
#: Values per generated batch; a round is EXAMPLES_PER_ROUND batches under one hypothesis seed. Rounds keep
#: hypothesis's memory of tried inputs bounded on the long run, and each round is reproducible from its seed.
BATCH = 100
EXAMPLES_PER_ROUND = 500
FIRST_OFFSET = 100

COLUMN_NAMES = ("id", "name", "amount", "ts", "day", "ok", "n", "f", "price")
#: Every primitive `_FAST_TYPES` holds (the fast tiers' domain); decimals at both Arrow widths, at a precision
#: where a JSON number's trip through a double matters (20,19) and at a precision the scale fills (3,3).
TYPES = ("long", "double", "boolean", "string", "timestamp", "timestamptz", "date", "float", "int",
         "decimal(10,2)", "decimal(38,10)", "decimal(3,3)", "decimal(20,19)", "decimal(40,5)", "decimal(1,0)")
#: The types `_json_arrow` reads: a policy of these only lets the C tier take whole batches.
NATIVE_TYPES = ("long", "double", "boolean", "string", "timestamp", "date")
EXTRA_NAMES = ("x", "y", "extra", "score", "", "ID", "id ", "_kafka_offset", "é", "a\\u0062c", "n\\u0061me")
LIMITS = ({},) * 10 + ({"maxDepth": 1}, {"maxDepth": 2}, {"maxDepth": 3, "maxValueBytes": 96},
                      {"maxValueBytes": 48}, {"maxDepth": 512}, {"maxDepth": 512, "maxValueBytes": 200})


# ------------------------------------------------------------------------------------------------ batches
def raw(values: list[bytes | None], cuts: tuple[int, ...] = ()) -> pa.Table:
    """A raw Kafka batch (handoff-kafka's Arrow schema) of these values, offsets from FIRST_OFFSET; `cuts` make it
    several chunks, slices of one record batch (so each chunk's value array starts at an offset into its buffers,
    as the readers' batches do)."""
    n = len(values)
    whole = pa.RecordBatch.from_arrays([
        pa.array(["t"] * n, pa.string()), pa.array([0] * n, pa.int32()),
        pa.array(range(FIRST_OFFSET, FIRST_OFFSET + n), pa.int64()),
        pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.binary()), pa.array(values, pa.binary()),
        pa.nulls(n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)
    bounds = [0, *sorted(c for c in cuts if 0 <= c <= n), n]
    return pa.Table.from_batches([whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], schema=ARROW_SCHEMA)


def policy_of(columns: list[tuple[str, str, bool]], evolution: str = "none", limits: dict[str, int] | None = None,
              halt: bool = False) -> SchemaPolicy:
    return SchemaPolicy.model_validate({
        "columns": [{"name": n, "type": t, "required": r} for n, t, r in columns], "evolution": evolution,
        "onIncompatible": "halt" if halt else "deadLetter", "limits": limits or {}})


# ----------------------------------------------------------------------------------------------- fragments
def _j(s: str, ascii_only: bool = True) -> bytes:
    return json.dumps(s, ensure_ascii=ascii_only).encode()


#: Spellings at and across each type's edges: where tiers disagree if anywhere.
EDGES: dict[str, tuple[bytes, ...]] = {
    "integer": (b"0", b"-0", b"1", b"-1", b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
                b"-9223372036854775809", b"2147483647", b"-2147483648", b"2147483648", b"-2147483649",
                b"18446744073709551616", b"123456789012345678901234567890", b"1" + b"0" * 400, b"-" + b"9" * 40,
                b"1e2", b"1E2", b"1.0", b"-0.0", b"1.5", b"01", b"+1", b"-", b"1.", b".5", b"0x10", b"1e", b"1e+"),
    "number": (b"0.0", b"-0.0", b"-0", b"0e0", b"-0e0", b"1e400", b"-1e400", b"1e-400", b"-1e-400", b"4.9e-324",
               b"5e-324", b"2.2250738585072014e-308", b"2.2250738585072011e-308", b"1.7976931348623157e308",
               b"1.7976931348623158e308", b"1.7976931348623159e308", b"3.4028234663852886e38", b"3.4028235e38",
               b"3.40282356779733661637539395458142568448e38", b"3.4028236e38", b"-3.4028235e38", b"1e39",
               b"1.00000005960464477539062500000001", b"1.0000000596046448", b"16777217", b"0.1", b"2.675",
               b"1e-7", b"1E+5", b"-1.5E-3", b"12345678901234567", b"9007199254740993", b"0.30000000000000004",
               b"0.1234567890123456789", b"0." + b"0" * 30 + b"1", b"1" + b"0" * 309, b"1" * 70, b"1e-45", b"1.4e-45",
               b"7e-46", b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"inf", b"nan", b"1e99999999999999999999"),
    "string": (b'""', b'"a"', b'"\\u0000"', b'"a\\u0000b"', b'"\\ud800"', b'"\\udc00"', b'"\\udc00\\ud800"',
               b'"\\ud83d\\ude00"', b'"\\uD83D\\uDE00"', b'"\\ud83d"', b'"\\ud83d\\u0041"', b'"\\u00e9"',
               b'"\\\\ud800"', b'"\\/\\b\\f\\n\\r\\t\\"\\\\"', b'"\x00"', b'"\x1f"', b'"\x7f"', b'"\xff"',
               b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xe2\x82"', b'"\xe2\x82\xac"',
               b'"\xf0\x9f\x98\x80"', b'"\\x41"', b'"\\U0041"', b'"\\u12"', b'"\\u12g4"', b'"tab\there"',
               b'"' + b"x" * 300 + b'"', b'"' + b"\\u0041" * 50 + b'"', b'"caf\xc3\xa9"', b"'single'", b'"open'),
    "timestamp": (b'"2024-05-01T10:00:00Z"', b'"2024-05-01T10:00:00+02:00"', b'"2024-05-01T10:00:00"',
                  b'"2024-05-01 10:00:00"', b'"2024-05-01T10:00:00.123456Z"', b'"2024-05-01T10:00:00.1234567Z"',
                  b'"2024-05-01T10:00:00.123456789Z"', b'"2024-05-01T10:00:00.1Z"', b'"2024-05-01T10"',
                  b'"2024-05-01T10:00"', b'"2024-05-01"', b'"20240501T100000"', b'"2024-05-01T10:00:00+0200"',
                  b'"2024-05-01T10:00:00+02"', b'"2024-05-01T10:00:60Z"', b'"2024-05-01T24:00:00"',
                  b'"2024-05-01T10:00:00z"', b'"2024-05-01t10:00:00"', b'"0000-01-01T00:00:00"',
                  b'"0001-01-01T00:00:00"', b'"0001-01-01T00:00:00+01:00"', b'"9999-12-31T23:59:59.999999"',
                  b'"9999-12-31T23:59:59-01:00"', b'"2024-05-01T10:00:00-00:00"', b'"2024-05-01T10:00:00+23:59"',
                  b'"2024-05-01T10:00:00+24:00"', b'"2024-05-01T10:00:00.Z"', b'"2024-05-01T10:00:00,5Z"',
                  b'" 2024-05-01T10:00:00"', b'"2024-02-30T00:00:00"', b'"2024-W18-3T10:00"', b'"+2024-05-01"',
                  b'"2024-05-01T10:00:00.000000+02:00"', b'"1970-01-01T00:00:00Z"', b'"1969-12-31T23:59:59.999999Z"',
                  b'"2024-05-01T10:00:00 +02:00"', b'"2024-05-01T10:00:00Z "', b'"yesterday"', b'""',
                  b"0", b"-1", b"1700000000000", b"253402300799999", b"253402300800000", b"-62135596800000",
                  b"-62135596800001", b"9223372036854775807", b"-9223372036854775808", b"1e3", b"1700000000000.0"),
    "date": (b'"2024-05-01"', b'"2024-5-1"', b'"20240501"', b'"2024-W18-3"', b'"2024-02-29"', b'"2023-02-29"',
             b'"2024-02-30"', b'"+2024-05-01"', b'"0000-01-01"', b'"0001-01-01"', b'"9999-12-31"',
             b'"10000-01-01"', b'"2024-05-01T00:00"', b'"2024-05-01 "', b'" 2024-05-01"', b'"2024-13-01"',
             b'"2024-05-01Z"', b'"2024-05"', b'"2024"', b'""', b"20240501", b"0"),
    "decimal": (b"1.25", b'"1.25"', b"1e2", b'"1e2"', b"-0", b'"-0"', b'"-0.00"', b"0.30000000000000000001",
                b'"0.30000000000000000001"', b"0.1234567890123456789", b'"0.1234567890123456789"', b"1e20",
                b'"123456789012345678901234567890.5"', b"123456789012345678901234567890",
                b"99999999999999999999999999999999999999", b"999.99", b"99999999.99", b"100000000.00", b"0.001",
                b"1e-40", b'"NaN"', b'"Infinity"', b'"-Infinity"', b'"sNaN"', b'" 1.5"', b'"1.5 "', b'"1_5"',
                b'"0x10"', b'"1,5"', b'""', b"0.000", b"1", b"0.999", b"-0.999", b"1e-3", b"9.5", b"0.5", b"10",
                b"1" * 45 + b".5", b"-" + b"9" * 35 + b".99999", b"1e-2147483647", b'"1e-2147483647"',
                b"1e-2147483648", b"1.1e-240", b"1e-44", b"1e10", b"12.5e-1", b"007.5", b'"007.5"', b"1" + b"0" * 29),
    "boolean": (b"true", b"false", b"True", b"FALSE", b"0", b"1", b'"true"', b"tru", b"truee", b"nul"),
    "container": (b"{}", b"[]", b'{"a":1}', b"[1,[2,[3]]]", b'{"a":{"b":{"c":{}}}}', b'[{"a":[]}]', b"[1,]",
                  b'{"a":}', b'{"a" 1}', b'{,}', b"[", b"{", b'{"a":1,"a":2}', b'{"":null}', b"[null]"),
}

#: Edges of one declared type, drawn as often as its family's (the family's list is long).
TYPE_EDGES: dict[str, tuple[bytes, ...]] = {
    "float": (b"3.4028234663852886e38", b"3.4028235e38", b"-3.4028235e38",
              b"3.40282356779733661637539395458142568448e38",
              b"3.4028236e38", b"-3.4028236e38", b"1e39", b"1e38", b"1.4e-45", b"1.401298464324817e-45", b"7e-46",
              b"1e-46", b"1.17549435e-38", b"1.00000005960464477539062500000001", b"16777217", b"-0", b"-0.0", b"0.1"),
    "int": (b"2147483647", b"-2147483648", b"2147483648", b"-2147483649", b"-0", b"1e9", b"2147483647.0"),
    "long": (b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808", b"-9223372036854775809",
             b"-0", b"1e18", b"922337203685477580.7"),
    "double": (b"-0", b"-0.0", b"1e400", b"4.9e-324", b"1.7976931348623157e308", b"1.7976931348623158e308",
               b"1.7976931348623159e308", b"2.2250738585072011e-308", b"9007199254740993", b"0." + b"0" * 30 + b"1"),
    "decimal(3,3)": (b"1", b"0.999", b"-0.999", b"0.9995", b"1.000", b'"1"', b"0", b"-0", b"0.001", b"1e-3"),
    "decimal(20,19)": (b"0.1234567890123456789", b"9.9999999999999999999", b"10", b"1e-19", b"1e-20", b"-9.99e0"),
    "decimal(38,10)": (b"1e20", b"9999999999999999999999999999.9999999999", b"10000000000000000000000000000",
                       b'"123456789012345678901234567.5"', b"1e27", b"1e28"),
    "decimal(40,5)": (b"9" * 35 + b".99999", b"1" + b"0" * 35, b"1e34", b"1e35", b"151575069351.79082"),
    "decimal(1,0)": (b"9", b"10", b"-9", b"-10", b"0.5", b"1e0", b"9.0"),
}

#: Bytes a mutation writes: JSON's structural characters, digits and signs, escapes, controls, invalid UTF-8.
INTERESTING_BYTES = tuple(b'"\\{}[],:0123456789-+.eEnulltrfa \n\t\r') + (0x00, 0x01, 0x1F, 0x7F, 0x80, 0xBF, 0xC0,
                                                                          0xC3, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF8,
                                                                          0xFF)


def _type_family(t: str) -> str:
    if t in ("long", "int"):
        return "integer"
    if t in ("double", "float"):
        return "number"
    if t in ("timestamp", "timestamptz"):
        return "timestamp"
    if t.startswith("decimal"):
        return "decimal"
    return t


def _decimal_bounds(t: str) -> tuple[int, int]:
    precision, scale = (int(x) for x in t[len("decimal("):-1].split(","))
    return precision, scale


# ------------------------------------------------------------------------------------- clean documents (fast)
_ZONES = (dt.timezone.utc, dt.timezone(dt.timedelta(hours=2)), dt.timezone(dt.timedelta(hours=-5, minutes=-30)),
          dt.timezone(dt.timedelta(hours=14)))
_TIMESPECS = ("auto", "seconds", "milliseconds", "microseconds", "minutes", "hours")
#: Code points for generated text: ASCII (controls included, JSON escapes them), Latin-1, the BMP around the
#: surrogates (never one), astral planes.
_CHAR_RANGES = ((0x00, 0x7F), (0x20, 0x7E), (0x20, 0x7E), (0x80, 0xFF), (0x100, 0xD7FF), (0xE000, 0xFFFF),
                (0x10000, 0x10FFFF))
_WS = (b"", b"", b" ", b"  ", b"\t", b"\n", b"\r\n")


@dataclass(frozen=True)
class Style:
    """How a batch's clean documents are spelled: one whitespace between tokens (a newline in it keeps pyarrow's
    newline-framed reader away), whether they carry undeclared fields (which `_json_arrow` leaves to pyarrow's
    reader under evolution=compatible; each of one JSON type through the batch, as pyarrow's reader wants), and how
    timestamps are written (one spelling, or any: pyarrow's reader takes a batch of one kind)."""

    ws: bytes = b""
    extras: bool = False
    timestamps: str = "any"


STYLES = st.builds(Style, st.sampled_from(_WS), st.booleans(), st.sampled_from(["zoned", "naive", "epoch", "any"]))


class CleanDocs:
    """Documents of a policy that the reference takes (nearly always: a zone offset can still push an instant past
    year 9999), from a PRNG seeded by hypothesis.

    Why not hypothesis strategies for these too: they are most of a batch, and drawing each through hypothesis cost
    ~3 ms a value (a few dozen draws each), 15 times the check itself; a seeded PRNG is reproducible all the same.
    The edge cases, wrong types and malformed values — what finds disagreements — are hypothesis's (`tricky`)."""

    def __init__(self, policy: SchemaPolicy, style: Style, seed_: int) -> None:
        self.policy, self.style = policy, style
        self.r = random.Random(seed_)

    def text(self) -> str:
        r = self.r
        lo, hi = _CHAR_RANGES[r.randrange(len(_CHAR_RANGES))]
        return "".join(chr(r.randint(lo, hi)) for _ in range(r.choice((0, 1, 3, 8, 12))))

    def value(self, t: str) -> bytes:
        r = self.r
        if t in ("long", "int"):
            bits = 63 if t == "long" else 31
            n = r.choice((r.randint(-1000, 1000), r.randint(-(2 ** bits), 2 ** bits - 1),
                          r.choice((-(2 ** bits), 2 ** bits - 1, 0))))
            return str(n).encode()
        if t in ("double", "float"):
            kind = r.randrange(4)
            if kind == 0:
                x = float(r.randint(-10 ** 6, 10 ** 6))
            elif kind == 1:
                x = r.uniform(-1e6, 1e6)
            else:
                fmt, size = ("<d", 64) if t == "double" else ("<f", 32)
                x = struct.unpack(fmt, r.getrandbits(size).to_bytes(size // 8, "little"))[0]
                if not math.isfinite(x):
                    x = 1.5
            return repr(x or 0.0).encode()  # -0.0 is an edge (EDGES): pyarrow's tier leaves it to the others
        if t == "boolean":
            return r.choice((b"true", b"false"))
        if t == "string":
            return _j(self.text(), r.random() < 0.5)
        if t in ("timestamp", "timestamptz"):
            spelling = self.style.timestamps
            if spelling == "any":
                spelling = r.choice(("zoned", "naive", "epoch"))
            if spelling == "epoch":
                return str(r.randint(-62135596800000, 253402300799999)).encode()
            when = dt.datetime(1, 1, 2) + dt.timedelta(microseconds=r.randrange(315_537_638_400_000_000))
            if spelling == "zoned":
                when = when.replace(tzinfo=r.choice(_ZONES))
            text = when.isoformat(sep=r.choice("T "), timespec=r.choice(_TIMESPECS))
            return _j(text[:-6] + "Z" if text.endswith("+00:00") and r.random() < 0.5 else text)
        if t == "date":
            return _j(dt.date.fromordinal(r.randint(1, dt.date.max.toordinal())).isoformat())
        precision, scale = _decimal_bounds(t)
        digits = r.randint(1, precision)
        unscaled = r.randint(0, 10 ** digits - 1) * r.choice((1, -1))
        text = str(decimal.Decimal(unscaled).scaleb(-scale))
        return _j(text) if r.random() < 0.3 else text.encode()

    def extra(self, name: str) -> bytes:
        r = self.r
        if name == "x":
            return self.value("long")
        if name == "y":
            return _j(self.text())
        if name == "extra":
            return self.value("double")
        if name == "score":
            return r.choice((b"true", b"false", b"null"))
        return r.choice((b"null", b'"2024-05-01"', b'"s"'))

    def document(self, override: tuple[str, bytes] | None = None) -> bytes:
        """A clean document; `override`: (column, value) to write in that column's place instead."""
        r, ws = self.r, self.style.ws
        members = []
        for col in self.policy.columns:
            roll = r.random()
            if override is not None and override[0] == col.name:
                members.append(_j(col.name) + ws + b":" + ws + override[1])
            elif col.required or roll < 0.8:
                members.append(_j(col.name) + ws + b":" + ws + self.value(col.type))
            elif roll < 0.9:
                members.append(_j(col.name) + ws + b":" + ws + b"null")
        if self.style.extras:
            for name in r.sample(("x", "y", "extra", "score", ""), r.randint(0, 3)):
                members.append(_j(name) + ws + b":" + ws + self.extra(name))
        return ws + b"{" + ws + (b"," + ws).join(members) + ws + b"}" + ws


# ------------------------------------------------------------------------------ tricky values (hypothesis)
@functools.lru_cache(maxsize=None)
def valid_value(t: str) -> st.SearchStrategy[bytes]:
    """A value the declared type takes, drawn by hypothesis (inside the tricky documents)."""
    family = _type_family(t)
    if t in ("long", "int"):
        bits = 63 if t == "long" else 31
        return st.integers(-(2 ** bits), 2 ** bits - 1).map(lambda i: str(i).encode())
    if family == "number":
        return st.floats(allow_nan=False, allow_infinity=False, width=64 if t == "double" else 32).map(
            lambda f: repr(f).encode())
    if t == "boolean":
        return st.sampled_from([b"true", b"false"])
    if t == "string":
        return st.builds(_j, st.text(max_size=8), st.booleans())
    if family == "timestamp":
        return st.one_of(st.builds(lambda d, z, spec: _j(d.replace(tzinfo=z).isoformat(timespec=spec)),
                                   st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
                                   st.sampled_from((None,) + _ZONES), st.sampled_from(_TIMESPECS)),
                         st.integers(-62135596800001, 253402300800000).map(lambda i: str(i).encode()))
    if t == "date":
        return st.dates().map(lambda d: _j(d.isoformat()))
    precision, scale = _decimal_bounds(t)
    top = 10 ** (precision - scale)
    number = st.decimals(min_value=-top, max_value=top, places=scale, allow_nan=False, allow_infinity=False)
    return st.builds(lambda d, quoted: _j(str(d)) if quoted else str(d).encode(), number, st.booleans())


def _signed(numbers: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return st.builds(lambda x, neg: (("-" if neg else "") + repr(x)).encode(), numbers, st.booleans())


def _near(t: str) -> st.SearchStrategy[bytes] | None:
    """Values just inside and just outside the type's range, generated (the edge lists hold a few)."""
    if t == "float":
        return _signed(st.floats(3.40280e38, 3.40284e38))
    if t == "double":  # up to DBL_MAX, and spellings past it that round to it or to infinity
        return st.one_of(_signed(st.floats(1.7976931348623e308, 1.7976931348623157e308)), st.builds(
            lambda digits, neg: (("-" if neg else "") + "1.797693134862315" + digits + "e308").encode(),
            st.sampled_from(["7", "708", "709", "8", "807", "81", "9", "99999999"]), st.booleans()))
    if t in ("int", "long"):
        top = 2 ** (31 if t == "int" else 63)
        return _signed(st.integers(top - 3, top + 2))
    if t in ("timestamp", "timestamptz"):
        return st.one_of(st.integers(253402300799990, 253402300800010).map(lambda i: str(i).encode()),
                         st.integers(-62135596800010, -62135596799990).map(lambda i: str(i).encode()),
                         st.builds(lambda d, z: _j(d.replace(tzinfo=z).isoformat()),
                                   st.sampled_from([dt.datetime(1, 1, 1), dt.datetime(1, 1, 1, 13, 59),
                                                    dt.datetime(9999, 12, 31, 23, 59, 59), dt.datetime(9999, 12, 31)]),
                                   st.sampled_from(_ZONES)))
    if t.startswith("decimal"):
        precision, scale = _decimal_bounds(t)
        top = decimal.Decimal(10) ** (precision - scale)
        ulp = decimal.Decimal(1).scaleb(-scale)
        return st.builds(lambda k, places, neg, quoted: (lambda text: _j(text) if quoted else text.encode())(
            str((-1 if neg else 1) * (top - k * ulp / 10 ** places))), st.integers(-2, 2), st.integers(0, 1),
            st.booleans(), st.booleans())
    return None


@functools.lru_cache(maxsize=None)
def edge_value(t: str) -> st.SearchStrategy[bytes]:
    """Edges of the type's family, of the type itself, and values generated just around its range."""
    options = [st.sampled_from(EDGES[_type_family(t)])]
    if t in TYPE_EDGES:
        options.append(st.sampled_from(TYPE_EDGES[t]))
    near = _near(t)
    if near is not None:
        options.append(near)
    return st.one_of(*options)


#: Any value at all: every family's edges, containers, and the literals.
ANY_EDGE = st.sampled_from(sorted({v for vs in EDGES.values() for v in vs}) + [b"null", b"true", b"false"])
_SCALARS = st.one_of(st.sampled_from([b"null", b"true", b"false", b"0", b"-1", b"2.5", b'"s"', b'"2024-05-01"']),
                     st.integers(-(2 ** 70), 2 ** 70).map(lambda i: str(i).encode()),
                     st.builds(_j, st.text(max_size=6), st.booleans()), ANY_EDGE)


def _array(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def _object(pairs: list[tuple[str, bytes]]) -> bytes:
    return b"{" + b",".join(_j(k) + b":" + v for k, v in pairs) + b"}"


NESTED = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(_array),
    st.lists(st.tuples(st.sampled_from(["a", "b", "", "é"]), inner), max_size=3).map(_object)), max_leaves=6)

WHITESPACE = st.sampled_from([b"", b"", b"", b" ", b" ", b"  ", b"\t", b"\n", b"\r\n", b" \r"])
#: How a declared column appears in a tricky document, by weight.
SHAPES = st.sampled_from(("valid",) * 6 + ("edge",) * 6 + ("null", "absent", "wrong", "nested", "twice",
                                                          "escaped-name"))
EXTRA_KEYS = st.lists(st.sampled_from(EXTRA_NAMES), max_size=3)
_EXTRA_VALUES = st.one_of(_SCALARS, NESTED)


@st.composite
def tricky_document(draw: Any, policy: SchemaPolicy) -> bytes:
    """A JSON object for the policy's columns with edge values, wrong types, nesting, duplicate or escaped keys,
    odd undeclared fields, any key order and whitespace."""
    members: list[tuple[bytes, bytes]] = []
    for col in policy.columns:
        shape = draw(SHAPES)
        if shape == "absent":
            continue
        key = _j(col.name)
        if shape == "valid":
            value = draw(valid_value(col.type))
        elif shape == "edge":
            value = draw(edge_value(col.type))
        elif shape == "null":
            value = b"null"
        elif shape == "wrong":
            value = draw(ANY_EDGE)
        elif shape == "nested":
            value = draw(NESTED)
        elif shape == "escaped-name":
            key = b'"\\u%04x' % ord(col.name[0]) + col.name[1:].encode() + b'"'
            value = draw(valid_value(col.type))
        else:  # twice: the same declared field with two values (JSON keeps the last)
            members.append((key, draw(valid_value(col.type))))
            value = draw(edge_value(col.type))
        members.append((key, value))
    for name in draw(EXTRA_KEYS):
        members.append((b'"' + name.encode() + b'"', draw(_EXTRA_VALUES)))
    if len(members) > 1 and draw(st.booleans()):
        members = draw(st.permutations(members))
    ws = draw(WHITESPACE)
    body = (b"," + ws).join(k + ws + b":" + ws + v for k, v in members)
    return draw(WHITESPACE) + b"{" + ws + body + ws + b"}" + draw(WHITESPACE)


_WHOLE_KINDS = st.sampled_from(["tombstone", "empty", "blank", "two", "array", "scalar", "deep", "deep-objects",
                                "unclosed", "bom", "trailing", "truncated", "truncated-token", "nan", "utf8", "big",
                                "nested-top"])
#: Where a value cut inside a token ends: escapes, surrogate pairs, numbers, literals, multi-byte UTF-8.
_TOKENS = st.sampled_from([b'"\\u00e9\\ud83d\\ude00x"', b'"\\n"', b"-1.5e+10", b"true", b"false", b"null",
                           '"é😀"'.encode(), b'"\\/"'])


@st.composite
def whole_value(draw: Any, policy: SchemaPolicy, docs: CleanDocs) -> bytes | None:
    """A value that is not a plain document: null, empty, more or less than one object, too deep, not UTF-8."""
    limit = policy.limits.max_depth
    kind = draw(_WHOLE_KINDS)
    doc = docs.document()
    if kind == "tombstone":
        return None
    if kind == "empty":
        return b""
    if kind == "blank":
        return draw(st.sampled_from([b" ", b"\n", b"\t\r\n ", b"\x00", b"\x0b", b"\xc2\xa0"]))
    if kind == "two":
        return doc + draw(WHITESPACE) + docs.document()
    if kind == "array":
        return b"[" + doc + b"]"
    if kind == "scalar":
        return draw(_SCALARS)
    if kind in ("deep", "deep-objects"):
        depth = max(1, draw(st.sampled_from([limit - 2, limit - 1, limit, limit + 1, 64, 65, 511, 512, 5000])))
        nest = b"[" * depth + b"]" * depth if kind == "deep" else b'{"a":' * depth + b"1" + b"}" * depth
        rest = doc.strip()[1:]  # the document's members and its closing brace
        return b'{"v":' + nest + (rest if rest.strip() == b"}" else b"," + rest)
    if kind == "unclosed":
        return b'{"v":' + b"[" * draw(st.sampled_from([10, 5000]))
    if kind == "bom":
        return b"\xef\xbb\xbf" + doc
    if kind == "trailing":
        return doc + draw(st.sampled_from([b"x", b",", b"}", b"]", b"\x00", b"null", b"{}", b"//", b"\xff"]))
    if kind == "truncated":
        return doc[:draw(st.integers(0, max(0, len(doc) - 1)))]
    if kind == "truncated-token":  # the value ends inside a token, one byte at a time
        token = draw(_TOKENS)
        return b'{"' + policy.columns[0].name.encode() + b'":' + token[:draw(st.integers(0, len(token) - 1))]
    if kind == "nan":
        name = policy.columns[0].name
        return _object([(name, draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"])))])
    if kind == "utf8":
        at = draw(st.integers(0, len(doc)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\x80", b"\xf8\x88\x80\x80\x80", b"\x80",
                                    b"\xef\xbf\xbe", b"\xf4\x90\x80\x80"]))
        return doc[:at] + bad + doc[at:]
    if kind == "big":
        size = policy.limits.max_value_bytes + draw(st.sampled_from([-1, 0, 1]))
        if size > 1 << 16:  # the default limit: a 10 MB value is a named test (test_decode_fuzz.py), not a batch's
            size = draw(st.integers(50, 300))
        name = next((c.name for c in policy.columns if c.type == "string"), "x")
        return b'{"' + name.encode() + b'":"' + b"y" * max(0, size - 6 - len(name)) + b'"}'
    return b'{"a":' + doc + b"}"


_MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "dup"]), st.integers(0, 1 << 16),
                                st.sampled_from(INTERESTING_BYTES), st.integers(0, 7)), min_size=1, max_size=3)


def mutate(value: bytes, edits: list[tuple[str, int, int, int]]) -> bytes:
    """A value with byte-level edits: flip a bit, overwrite, insert, delete, duplicate a slice."""
    data = bytearray(value)
    for op, at, byte, small in edits:
        at %= len(data) + 1
        if op == "insert":
            data[at:at] = bytes([byte])
        elif not data:
            continue
        elif op == "flip":
            data[at % len(data)] ^= 1 << small
        elif op == "set":
            data[at % len(data)] = byte
        elif op == "delete":
            del data[at % len(data):at % len(data) + small % 4 + 1]
        else:
            data[at:at] = data[at:at + small + 1]
    return bytes(data)


@st.composite
def tricky_value(draw: Any, policy: SchemaPolicy, docs: CleanDocs) -> bytes | None:
    """A clean document but for one edge value (where a fast tier that takes the rest of the batch must agree on
    it, or decline); a tricky document; a value that is not a plain document; or a mutant of a document."""
    kind = draw(st.sampled_from(["one-edge", "one-edge", "one-edge", "document", "document", "whole", "mutated",
                                 "mutated"]))
    if kind == "one-edge":
        col = draw(st.sampled_from(policy.columns))
        return docs.document((col.name, draw(st.one_of(edge_value(col.type), edge_value(col.type), ANY_EDGE))))
    if kind == "document":
        return draw(tricky_document(policy))
    if kind == "whole":
        return draw(whole_value(policy, docs))
    base = draw(tricky_document(policy)) if draw(st.booleans()) else docs.document()
    return mutate(base, draw(_MUTATIONS))


_COLUMN_NAMES = st.permutations(COLUMN_NAMES)
_LIMITS = st.sampled_from(LIMITS)


@st.composite
def policies(draw: Any) -> SchemaPolicy:
    native_only = draw(st.booleans())
    names = draw(_COLUMN_NAMES)[:draw(st.integers(1, 5))]
    types = st.sampled_from(NATIVE_TYPES if native_only else TYPES)
    columns = [(name, draw(types), draw(st.booleans())) for name in names]
    return policy_of(columns, draw(st.sampled_from(["none", "compatible"])), draw(_LIMITS),
                     halt=draw(st.integers(0, 4)) == 0)


@dataclass(frozen=True)
class Case:
    """One generated batch: its policy and values, where the raw table is cut into chunks, and the chunk size the
    chunked path is checked with."""

    policy: SchemaPolicy
    values: list[bytes | None]
    cuts: tuple[int, ...] = ()
    chunk_rows: int = 25


@st.composite
def batches(draw: Any) -> Case:
    """A batch is clean (documents of the policy: the fast tiers' ground), tricky (clean but for one to three
    values), chaotic (one value in four tricky), or small (one to four tricky values: where each edge value alone
    meets each tier)."""
    policy = draw(policies())
    docs = CleanDocs(policy, draw(STYLES), draw(st.integers(0, 2 ** 32)))
    mode = draw(st.sampled_from(["clean", "tricky", "tricky", "tricky", "chaos", "small", "small"]))
    size = draw(st.integers(1, 4)) if mode == "small" else BATCH
    values: list[bytes | None] = [docs.document() for _ in range(size)]
    tricky = tricky_value(policy, docs)
    positions = st.integers(0, size - 1)
    count = {"clean": 0, "tricky": draw(st.integers(1, 3)), "chaos": size // 4, "small": draw(st.integers(1, size))}
    for _ in range(count[mode]):
        values[draw(positions)] = draw(tricky)
    cuts = tuple(draw(st.lists(positions, max_size=3)))
    return Case(policy, values, cuts, draw(st.sampled_from([7, 25, 40])))


# -------------------------------------------------------------------------------------------------- check
def strict_json_rejects(value: bytes | None) -> bool:
    """Whether Python's strict JSON parser refuses the value's UTF-8 text (NaN and Infinity refused)."""
    if value is None:
        return True

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        json.loads(value.decode("utf-8"), parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


def _canonical(v: Any) -> Any:
    """Rows compared bit for bit: a float by its hex spelling (-0.0 is not 0.0), a datetime with its zone."""
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, dt.datetime):
        return (v.isoformat(), str(v.tzinfo))
    return v


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    return [{k: _canonical(v) for k, v in row.items()} for row in table.to_pylist()]


class Disagreement(AssertionError):
    pass


def _bits(table: pa.Table) -> pa.Table:
    """The table with each floating column as its bit patterns, so that `equals` tells -0.0 from 0.0."""
    columns = [c.combine_chunks().view(pa.int64() if c.type == pa.float64() else pa.int32())
               if pa.types.is_floating(c.type) else c for c in table.columns]
    return pa.Table.from_arrays(columns, names=table.column_names)


def assert_same(got: pa.Table, want: pa.Table, what: str, values: list[bytes | None]) -> None:
    """Same schema (names, order, types, nullability) and the same values, floats bit for bit."""
    if got.schema != want.schema:
        raise Disagreement(f"{what}: schema\n{got.schema}\n!= reference\n{want.schema}\nvalues: {values!r}"[:6000])
    if _bits(got).equals(_bits(want)):
        return
    got_rows, want_rows = rows_of(got), rows_of(want)
    diff = [(g, w) for g, w in zip(got_rows, want_rows) if g != w][:3]
    raise Disagreement(f"{what}: {len(got_rows)} rows vs the reference's {len(want_rows)}; first differences "
                           f"(got, reference): {diff!r}\nvalues: {values!r}"[:6000])


def fast_tiers(batch: pa.Table, policy: SchemaPolicy) -> dict[str, pa.Table | None]:
    """Each fast tier's table for the batch, under the conditions `_fast_path` calls it (no null value, every
    value 1..maxValueBytes long; pyarrow's reader only when each value is one object or C parsed them)."""
    values = batch.column("value")
    lengths = [len(v) for v in values.to_pylist() if v is not None]
    if values.null_count or min(lengths) == 0 or max(lengths) > policy.limits.max_value_bytes:
        return {}
    native = decode._native_parse(values, policy)
    one_each = decode._one_object_each(values, policy.limits.max_depth)
    if native is not None and not one_each:
        raise Disagreement(f"_json_arrow.decode took a batch one_object_each refuses: {values.to_pylist()!r}")
    out: dict[str, pa.Table | None] = {"_json_arrow": None if native is None else decode._finish(native, batch, policy)}
    if native is not None or one_each:
        parsed = decode._arrow_parse(values, policy)
        out["pyarrow.json"] = None if parsed is None else decode._finish(parsed, batch, policy)
    return out


@dataclass
class Tally:
    """What a fuzz run did, for its report and to prove it did it."""

    values: int = 0
    batches: int = 0
    dead: int = 0
    taken: dict[str, int] = field(default_factory=lambda: {"_json_arrow": 0, "pyarrow.json": 0})
    sub_taken: int = 0


def check(case: Case, tally: Tally | None = None) -> None:
    """Every tier agrees with the reference on this batch (module docstring); raises Disagreement otherwise
    (any exception on the way, too: a tier or a table that cannot be read is a finding like any other)."""
    try:
        _check(case, tally if tally is not None else Tally())
    except Disagreement:
        raise
    except Exception as exc:
        raise Disagreement(f"{type(exc).__name__}: {str(exc)[:300]}\nvalues: {case.values!r}"[:6000]) from exc


def check_values(values: list[bytes | None], policy: SchemaPolicy) -> None:
    """`check` of one batch of these values (a regression test's)."""
    check(Case(policy, values))


def _check(case: Case, tally: Tally) -> None:
    policy, values = case.policy, case.values
    batch = raw(values, case.cuts)
    try:
        ref, dead = decode._slow_path(batch, policy)
    except Exception as exc:
        raise Disagreement(f"_slow_path raised {type(exc).__name__}: {exc}\nvalues: {values!r}"[:6000]) from exc
    kept = ref.column("_kafka_offset").to_pylist()
    try:
        ref.to_pylist()
    except Exception as exc:
        raise Disagreement(f"the reference's table cannot be read back: {type(exc).__name__}: {exc}\n"
                           f"values: {values!r}"[:6000]) from exc
    if sorted(kept + [d.offset for d in dead]) != list(range(FIRST_OFFSET, FIRST_OFFSET + len(values))):
        raise Disagreement(f"records not accounted for exactly once: rows {kept}, dead {dead}\nvalues: {values!r}")
    indexes = [d.index for d in dead]
    if any(d.offset != FIRST_OFFSET + d.index for d in dead) or indexes != sorted(indexes):
        raise Disagreement(f"dead letters out of order or misnumbered: {dead}")
    kept_set = set(kept)
    any_size = policy.model_copy(update={"limits": policy.limits.model_copy(update={"max_value_bytes": 1 << 28})})
    for i, v in enumerate(values):
        if FIRST_OFFSET + i in kept_set and strict_json_rejects(v):
            raise Disagreement(f"a value Python's strict JSON parser rejects is a row: {v!r}")
        if v is not None and _one_object(v, policy.limits.max_depth) and not _strictly_one_object(v, any_size):
            raise Disagreement(f"_json_arrow.one_object_each takes a value that is not one JSON object nested at "
                               f"most {policy.limits.max_depth} deep: {v!r}")
    for tier, table in fast_tiers(batch, policy).items():
        if table is None:
            continue
        tally.taken[tier] += 1
        if dead:
            raise Disagreement(f"{tier} took a batch in which the reference dead-letters "
                               f"{[(d.index, d.reason, d.detail[:80]) for d in dead[:3]]}: "
                               f"{[values[d.index] for d in dead[:3]]!r}")
        assert_same(table, ref, tier, values)
    if policy.on_incompatible == "halt":
        try:
            table, got_dead = decode.decode_batch(batch, policy)
        except SchemaIncompatible:
            if not dead:
                raise Disagreement(f"decode_batch halted on a batch the reference takes whole: {values!r}") from None
        else:
            if dead:
                raise Disagreement(f"decode_batch did not halt on dead letters {dead[:3]}")
            assert_same(table, ref, "decode_batch", values)
    else:
        table, got_dead = decode.decode_batch(batch, policy)
        if got_dead != dead:
            raise Disagreement(f"decode_batch dead letters {got_dead[:3]} != reference {dead[:3]}\nvalues: {values!r}")
        assert_same(table, ref, "decode_batch", values)
    # decode_batch's path for batches over 2 * CHUNK_ROWS: the fast path per chunk, the reference for failing ones.
    with mock.patch.object(decode, "CHUNK_ROWS", case.chunk_rows):
        chunked, chunked_dead = decode._chunked(batch, policy)
    if chunked_dead != dead:
        raise Disagreement(f"_chunked dead letters {chunked_dead[:3]} != reference {dead[:3]}\nvalues: {values!r}")
    assert_same(chunked, ref, f"_chunked({case.chunk_rows} rows)", values)
    # The records the reference keeps, alone: a fast tier that takes them gives the very same rows.
    if dead and kept:
        sub = batch.take(pa.array([o - FIRST_OFFSET for o in kept]))
        for tier, table in fast_tiers(sub, policy).items():
            if table is not None:
                tally.sub_taken += 1
                assert_same(table, ref, f"{tier} on the kept records", [values[o - FIRST_OFFSET] for o in kept])
    tally.values += len(values)
    tally.batches += 1
    tally.dead += len(dead)


def _one_object(value: bytes, max_depth: int) -> bool:
    return decode._one_object_each(pa.array([value], pa.binary()), max_depth)


def _strictly_one_object(value: bytes, policy: SchemaPolicy) -> bool:
    """Whether the reference parses the value into one object within the policy's depth limit (its size is the
    fast path's to check, not `one_object_each`'s)."""
    doc, _, _ = decode._parse_record(value, policy, decode._json_decoder(policy))
    return doc is not None


def smallest_failure(case: Case) -> Disagreement:
    """The failing batch cut down (greedily: each value alone, then dropping values one at a time while it still
    fails) to the values a regression test needs; the Disagreement it raises."""
    def fails(vs: list[bytes | None]) -> Disagreement | None:
        try:
            check(dataclasses.replace(case, values=vs, cuts=()))
        except Disagreement as exc:
            return exc
        return None

    for v in case.values:
        found = fails([v])
        if found is not None:
            return Disagreement(f"{found}\nsmallest batch: [{v!r}]\npolicy: {case.policy!r}")
    current = list(case.values)
    found = fails(current)
    if found is None:  # only with these cuts
        return Disagreement(f"{_failure(case)}\ncuts: {case.cuts}\npolicy: {case.policy!r}")
    i = 0
    while i < len(current):
        trial = current[:i] + current[i + 1:]
        again = fails(trial) if trial else None
        if again is not None:
            current, found = trial, again
        else:
            i += 1
    return Disagreement(f"{found}\nsmallest batch: {current!r}\nchunk rows: {case.chunk_rows}\n"
                        f"policy: {case.policy!r}")


def _failure(case: Case) -> Disagreement | None:
    try:
        check(case)
    except Disagreement as exc:
        return exc
    return None


# ---------------------------------------------------------------------------------------------------- runs
def fuzz_values() -> int:
    return int(os.environ.get(VALUES_ENV, DEFAULT_VALUES))


def run_rounds(total_values: int, tally: Tally, first_seed: int = 0,
               progress: Callable[[int, Tally], None] | None = None) -> None:
    """Check at least `total_values` generated values (more by less than a round), in rounds of
    EXAMPLES_PER_ROUND batches, round r under hypothesis seed first_seed + r (no example database: the same values
    every run)."""
    start = tally.values
    r = 0
    while tally.values - start < total_values:
        todo = EXAMPLES_PER_ROUND

        # No shrinking: hypothesis's shrinker spends minutes on a 100-value batch whose check takes milliseconds;
        # `smallest_failure` reduces a failing batch to the values that matter instead.
        @seed(first_seed + r)
        @settings(max_examples=todo, deadline=None, database=None, derandomize=False, print_blob=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=batches())
        def one(case: Case) -> None:
            try:
                check(case, tally)
            except Disagreement as exc:
                raise smallest_failure(case) from exc

        one()
        if progress is not None:
            progress(r, tally)
        r += 1


def corpus() -> dict[str, bytes]:
    """The committed seed corpus: file name → value."""
    return {p.name: p.read_bytes() for p in sorted(CORPUS.iterdir()) if p.is_file() and p.name != "README.md"}


#: Policies every corpus value is checked under (the corpus's fields: id, name, amount, f, v, ts, day, x).
CORPUS_POLICIES = (
    policy_of([("id", "long", True), ("name", "string", False), ("amount", "double", False),
               ("ts", "timestamp", False), ("day", "date", False), ("ok", "boolean", False)]),
    policy_of([("id", "long", False), ("name", "string", False), ("v", "double", False), ("f", "double", False)],
              "compatible"),
    policy_of([("id", "int", False), ("amount", "decimal(38,10)", False), ("f", "float", False),
               ("ts", "timestamptz", False), ("day", "date", False)], "compatible"),
    policy_of([("id", "long", False), ("name", "string", False), ("amount", "decimal(20,5)", False),
               ("f", "float", False)], limits={"maxDepth": 2, "maxValueBytes": 96}),
    policy_of([("id", "long", False), ("name", "string", False)], "compatible", limits={"maxDepth": 512}),
)
