"""The declared column types (`spec.schema.columns[].type`): one small grammar, parsed once into plain data that
each backend maps to its own types (decode.py → Arrow, iceberg/table.py → Iceberg, bigquery/schema.py →
BigQuery).

Grammar (Iceberg's spelling, which users of these tables already know):

* primitives: `string`, `int`, `long`, `float`, `double`, `boolean`, `date`, `time`, `timestamp`,
  `timestamptz`, `uuid`, `binary`, `decimal(p,s)`, `fixed[n]`. `timestamp` and `timestamptz` are both
  UTC instants (Handoff has always stored `timestamp` as Iceberg timestamptz / BigQuery TIMESTAMP).
* `struct<name:type, ...>`: a nested record (JSON object; Iceberg struct; BigQuery RECORD). Its fields are
  optional; names follow the column-name rule.
* `list<type>`: a JSON array (Iceberg list; BigQuery REPEATED).
* `map<keytype,valuetype>`: a JSON object with arbitrary keys (Iceberg map; BigQuery REPEATED RECORD of
  `key`, `value`). JSON object keys are strings, so the key type must be `string`.

Why our own parser: the type is a CR field, and a bad one must be refused with one line naming what is wrong,
before any backend library is imported (the operator validates without pyiceberg or google-cloud).
Another reader (Avro records from a Schema Registry) can build the same plain data directly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PRIMITIVES = ("string", "int", "long", "float", "double", "boolean", "date", "time", "timestamp", "timestamptz",
              "uuid", "binary")
#: The words a type is made of (the parameterised and nested ones take `(…)`, `[…]` or `<…>`).
KEYWORDS = PRIMITIVES + ("decimal", "fixed", "struct", "list", "map")


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


_KEYWORD = "(?:" + "|".join(_any_case(k) for k in sorted(KEYWORDS, key=len, reverse=True)) + ")"
#: A regular over-approximation of the grammar for the CRD (a structural schema cannot express nesting): a type
#: starts with a known type word, and every later word is a type word or a struct field name followed by `:`.
#: So `varchar` or `stringx` is refused by the API server; what it lets through (unbalanced brackets, a
#: misplaced word) the parser refuses with one line naming the position.
PATTERN = (r"^ *" + _KEYWORD + r"(?:[<>,()\[\] ]|[0-9]+|[A-Za-z_][A-Za-z0-9_]* *:|" + _KEYWORD + r")*$")


_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_FIXED = re.compile(r"fixed\[\s*(\d+)\s*\]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_DECIMAL_PRECISION = 76  # BigQuery BIGNUMERIC; Iceberg stops at 38 (its mapping says so)


@dataclass(frozen=True)
class Primitive:
    """`name` is one of PRIMITIVES, or `decimal` (with precision/scale) or `fixed` (with length)."""

    name: str
    precision: int = 0
    scale: int = 0
    length: int = 0

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "fixed":
            return f"fixed[{self.length}]"
        return self.name


@dataclass(frozen=True)
class StructField:
    name: str
    type: "ColumnType"

    def __str__(self) -> str:
        return f"{self.name}:{self.type}"


@dataclass(frozen=True)
class Struct:
    fields: tuple[StructField, ...]

    def __str__(self) -> str:
        return f"struct<{','.join(str(f) for f in self.fields)}>"


@dataclass(frozen=True)
class ListOf:
    element: "ColumnType"

    def __str__(self) -> str:
        return f"list<{self.element}>"


@dataclass(frozen=True)
class MapOf:
    key: "ColumnType"
    value: "ColumnType"

    def __str__(self) -> str:
        return f"map<{self.key},{self.value}>"


ColumnType = Primitive | Struct | ListOf | MapOf


def is_nested(t: ColumnType) -> bool:
    return not isinstance(t, Primitive)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"column type {self.text!r}: {what} at position {self.pos} (expected e.g. long, "
                          f"timestamptz, decimal(10,2), fixed[16], struct<a:int,b:string>, list<long>, "
                          f"map<string,double>)")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expect(self, ch: str) -> None:
        self.skip()
        if not self.text.startswith(ch, self.pos):
            raise self.fail(f"{ch!r} missing")
        self.pos += 1

    def peek(self, ch: str) -> bool:
        self.skip()
        return self.text.startswith(ch, self.pos)

    def name(self) -> str:
        self.skip()
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.fail("a name is missing")
        self.pos = m.end()
        return m.group(0)

    def type(self) -> ColumnType:
        self.skip()
        start = self.pos
        for pattern, build in ((_DECIMAL, self._decimal), (_FIXED, self._fixed)):
            m = pattern.match(self.text, self.pos)
            if m:
                self.pos = m.end()
                return build(m, start)
        word = self.name().lower()
        if word == "struct":
            self.expect("<")
            fields: list[StructField] = []
            seen: set[str] = set()
            while True:
                self.skip()
                at = self.pos
                fname = self.name()
                if fname.lower() in seen:
                    self.pos = at
                    raise self.fail(f"field {fname!r} appears twice")
                seen.add(fname.lower())
                self.expect(":")
                fields.append(StructField(fname, self.type()))
                if not self.peek(","):
                    break
                self.expect(",")
            self.expect(">")
            return Struct(tuple(fields))
        if word == "list":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return ListOf(element)
        if word == "map":
            self.expect("<")
            key = self.type()
            if key != Primitive("string"):
                raise self.fail(f"map keys must be string (JSON object keys are strings), not {key}")
            self.expect(",")
            value = self.type()
            self.expect(">")
            return MapOf(key, value)
        if word in PRIMITIVES:
            return Primitive(word)
        self.pos = start
        raise self.fail(f"unknown type {word!r}")

    def _decimal(self, m: re.Match[str], start: int) -> Primitive:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or scale > precision:
            self.pos = start
            raise self.fail(f"decimal({precision},{scale}) needs 1 ≤ precision ≤ {MAX_DECIMAL_PRECISION} "
                            f"and scale ≤ precision")
        return Primitive("decimal", precision=precision, scale=scale)

    def _fixed(self, m: re.Match[str], start: int) -> Primitive:
        length = int(m.group(1))
        if length < 1:
            self.pos = start
            raise self.fail("fixed[n] needs n ≥ 1")
        return Primitive("fixed", length=length)


def parse_type(text: str) -> ColumnType:
    """Parse a declared column type; ValueError (one line, naming the position and the fix) when malformed."""
    parser = _Parser(text)
    parsed = parser.type()
    parser.skip()
    if parser.pos != len(text):
        raise parser.fail("unexpected text")
    return parsed


def canonical(text: str) -> str:
    """The type in its canonical spelling (lower-case keywords, no spaces): what the config carries."""
    return str(parse_type(text))


def walk(t: ColumnType, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], ColumnType]]:
    """Every (path, type) inside `t`, `t` itself first; list elements are `element`, map parts `key`/`value`
    (the names Iceberg gives them)."""
    out: list[tuple[tuple[str, ...], ColumnType]] = [(path, t)]
    if isinstance(t, Struct):
        for f in t.fields:
            out += walk(f.type, path + (f.name,))
    elif isinstance(t, ListOf):
        out += walk(t.element, path + ("element",))
    elif isinstance(t, MapOf):
        out += walk(t.key, path + ("key",)) + walk(t.value, path + ("value",))
    return out
