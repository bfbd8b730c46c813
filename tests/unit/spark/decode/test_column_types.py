"""Declared column types: parsing (one-line refusals), and the mapping of each type to Arrow (decoding),
Iceberg and BigQuery, plus what counts as a schema change for nested columns."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from pydantic import ValidationError

from handoff_spark.bigquery.schema import declared_fields, plan_schema
from handoff_spark.decode.column_types import PATTERN, ListOf, MapOf, Primitive, Struct, StructField, canonical, parse_type
from handoff_spark.config import Column, SchemaPolicy
from handoff_spark.decode.records import arrow_type, decode_batch
from handoff_spark.iceberg.table import declared_schema, iceberg_type_of_arrow, plan_schema_changes


def test_parses_primitives_and_nested_types_to_canonical_spelling():
    assert parse_type("fixed[ 16 ]") == Primitive("fixed", length=16)
    assert parse_type("decimal(10, 2)") == Primitive("decimal", precision=10, scale=2)
    assert parse_type("struct<a: int, b: list<map<string, timestamptz>>>") == Struct((
        StructField("a", Primitive("int")),
        StructField("b", ListOf(MapOf(Primitive("string"), Primitive("timestamptz"))))))
    assert canonical("STRUCT< a : uuid >") == "struct<a:uuid>"


@pytest.mark.parametrize("text, says", [
    ("varchar", "unknown type 'varchar'"), ("struct<a:int", "'>' missing"), ("map<long,string>", "map keys must be string"),
    ("struct<a:int,A:long>", "appears twice"), ("list<int> x", "unexpected text"), ("fixed[0]", "n ≥ 1"),
    ("decimal(5,7)", "scale ≤ precision")])
def test_bad_type_is_one_line_naming_the_problem(text, says):
    with pytest.raises(ValidationError) as err:
        Column(name="c", type=text)
    message = err.value.errors()[0]["msg"]
    assert says in message and "\n" not in message


def test_arrow_iceberg_and_bigquery_mappings():
    cols = [Column(name="addr", type="struct<city:string,geo:list<double>>"), Column(name="tags", type="map<string,long>"),
            Column(name="u", type="uuid"), Column(name="t", type="time"), Column(name="ts", type="timestamptz"),
            Column(name="f", type="fixed[4]")]
    assert arrow_type("struct<city:string,geo:list<double>>") == pa.struct(
        [("city", pa.string()), ("geo", pa.list_(pa.float64()))])
    schema = declared_schema(cols)
    assert str(schema.find_field("addr").field_type) == "struct<11: city: optional string, 12: geo: optional list<double>>"
    assert [str(schema.find_field(n).field_type) for n in ("tags", "u", "t", "ts", "f")] == [
        "map<string, long>", "uuid", "time", "timestamptz", "fixed[4]"]
    bq = {f.name: f for f in declared_fields(cols)}
    assert (bq["addr"].type, [(s.name, s.type, s.mode) for s in bq["addr"].fields]) == (
        "RECORD", [("city", "STRING", "NULLABLE"), ("geo", "FLOAT64", "REPEATED")])
    assert (bq["tags"].type, bq["tags"].mode, [s.name for s in bq["tags"].fields]) == ("RECORD", "REPEATED", ["key", "value"])
    assert [bq[n].type for n in ("u", "t", "ts", "f")] == ["BYTES", "TIME", "TIMESTAMP", "BYTES"]
    with pytest.raises(ValueError, match="list of lists"):
        declared_fields([Column(name="x", type="list<list<int>>")])


def test_nested_evolution_rules():
    table = declared_schema([Column(name="addr", type="struct<city:string,zip:int>")])
    arrived = lambda t: [("addr", iceberg_type_of_arrow(arrow_type(t)))]  # noqa: E731
    # the same struct, a struct lacking a field (null there), a narrower nested field: no change
    for same in ("struct<city:string,zip:int>", "struct<city:string>"):
        plan = plan_schema_changes(table, arrived(same), "compatible")
        assert not plan.changes_table and not plan.incompatible, same
    # a nested field whose type changes: incompatible (the schema policy's onIncompatible decides)
    assert plan_schema_changes(table, arrived("struct<city:string,zip:string>"), "compatible").incompatible
    bq_table = declared_fields([Column(name="addr", type="struct<city:string,zip:int>")])
    assert plan_schema(bq_table, declared_fields([Column(name="addr", type="struct<city:string,zip:string>")])).conflicts


def _raw(values):
    n = len(values)
    return pa.table({"key": pa.array([None] * n, pa.binary()), "value": pa.array([json.dumps(v).encode() for v in values]),
                     "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()), "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC"))})


def test_decodes_nested_json_and_dead_letters_a_bad_nested_value_naming_its_path():
    policy = SchemaPolicy(columns=[
        Column(name="addr", type="struct<city:string,geo:list<double>>"), Column(name="tags", type="map<string,long>"),
        Column(name="u", type="uuid"), Column(name="t", type="time"), Column(name="f", type="fixed[2]")],
        on_incompatible="deadLetter")
    table, dead = decode_batch(_raw([
        {"addr": {"city": "Oslo", "geo": [59.9, 10]}, "tags": {"a": 1}, "u": "12345678-1234-5678-1234-567812345678",
         "t": "10:11:12.5", "f": "AAE="},
        {"addr": {"city": "Bergen", "geo": ["x"]}},
        {"addr": None, "tags": {"b": None}}]), policy)
    rows = table.to_pylist()
    assert [r["_kafka_offset"] for r in rows] == [0, 2]
    assert rows[0]["addr"] == {"city": "Oslo", "geo": [59.9, 10.0]} and rows[0]["tags"] == [("a", 1)]
    assert rows[0]["u"] == bytes.fromhex("12345678123456781234567812345678") and rows[0]["f"] == b"\x00\x01"
    assert rows[1]["addr"] is None and rows[1]["tags"] == [("b", None)]
    assert [(d.offset, d.reason, d.detail) for d in dead] == [
        (1, "type-mismatch", 'addr: geo: [0]: expected number, got string "x"')]


@pytest.mark.parametrize("text", ["string", "STRING", "Long", "decimal(10, 2)", "fixed[16]", "timestamptz",
                                  "struct<a:int, b:list<string>>", "map<string,double>",
                                  "struct<time:timestamp,status:string>", "list<struct<x:long>>"])
def test_the_crd_pattern_admits_every_type_the_parser_accepts(text: str) -> None:
    canonical(text)  # the parser accepts it ...
    assert re.fullmatch(PATTERN, text)  # ... so the API server must too


@pytest.mark.parametrize("text", ["varchar", "stringx", "interval", "text", "struct<a:varchar>", ""])
def test_the_crd_pattern_refuses_unknown_type_words(text: str) -> None:
    assert not re.fullmatch(PATTERN, text)
