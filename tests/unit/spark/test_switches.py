"""The `HANDOFF_*` switches (`handoff_spark.switches`): one rule per kind of value, every value accepted before
still meaning what it meant, docs/switches.md agreeing with the code, and no module reading one on its own."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from handoff_spark import contract, switches
from handoff_spark.switches import SwitchError

from handoff_operator.runtime.settings import OperatorSettings

from package_source_support import SPARK, modules

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "switches.md"
ON_OFF = [s for s in switches.SWITCHES.values() if isinstance(s, switches.OnOff)]
SECONDS = {switches.STOP_GRACE_SECONDS: 300.0, switches.PROGRESS_PUBLISH_SECONDS: 15.0,
           switches.SCALE_POLL_SECONDS: 5.0, switches.HOLD_POLL_SECONDS: 1.0}


# -------------------------------------------------------------------------------------------- the rule

def test_every_switch_has_a_kind_and_the_on_off_ones_are_those_that_were():
    assert {s.name for s in ON_OFF} == {"HANDOFF_SESSION_WARMUP", "HANDOFF_FORK_SERVER", "HANDOFF_WORKER_PRELOAD",
                                        "HANDOFF_JVM_C1_ONLY", "HANDOFF_FUSED_READ"}
    assert len(switches.SWITCHES) == 32 and all(type(s) is not switches.Switch for s in switches.SWITCHES.values())


@pytest.mark.parametrize("switch", ON_OFF, ids=lambda s: s.name)
def test_one_on_off_rule_for_every_on_off_switch(switch):
    name = switch.name
    assert switch({}) is True and switch({name: ""}) is True and switch({name: "  "}) is True
    for value in ("1", "true", "yes", "on", "TRUE", " On "):
        assert switch({name: value}) is True, value
    for value in ("0", "false", "no", "off", "OFF", " No "):
        assert switch({name: value}) is False, value
    with pytest.raises(SwitchError, match=f"^{name}='maybe': use 1/true/yes/on or 0/false/no/off$"):
        switch({name: "maybe"})


@pytest.mark.parametrize("switch,default", SECONDS.items(), ids=lambda s: getattr(s, "name", ""))
def test_seconds_are_a_number_or_the_default(switch, default):
    name = switch.name
    assert switch({}) == default == switch({name: ""})
    assert switch({name: "2.5"}) == 2.5 and switch({name: " 0 "}) == 0.0
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(SwitchError, match=f"^{name}='{bad}': use a number of seconds ≥ 0$"):
            switch({name: bad})


def test_text_switches_are_none_when_unset_or_empty():
    for switch in (switches.SPARK_MASTER, switches.PROGRESS_CONFIGMAP, switches.PROGRESS_NAMESPACE,
                   switches.DRIVER_POD_NAME, switches.FAULT, switches.FAULT_LOG):
        assert switch({}) is None and switch({switch.name: ""}) is None and switch({switch.name: "x"}) == "x"
    level = switches.SPARK_LOG_LEVEL
    assert level({}) == "WARN" == level({level.name: ""}) and level({level.name: "ERROR"}) == "ERROR"


CHOICES = [switches.KAFKA_READER, switches.SESSION_WARMUP_AT]


@pytest.mark.parametrize("switch", CHOICES, ids=lambda s: s.name)
def test_a_choice_is_one_of_its_choices_the_first_by_default(switch):
    """The Kafka reader: native or python; the session warm-up: beside the first batch or before the query."""
    name, (first, second) = switch.name, switch.choices
    assert [switch(e) for e in ({}, {name: ""}, {name: first.upper()}, {name: f" {second} "})] == [
        first, first, first, second]
    with pytest.raises(SwitchError, match=f"^{name}='other': use {first} or {second}$"):
        switch({name: "other"})


def test_these_are_every_choice_switch_and_their_choices_default_first():
    assert {s.name for s in switches.SWITCHES.values() if isinstance(s, switches.Choice)} == {s.name for s in CHOICES}
    assert [s.choices for s in CHOICES] == [("native", "python"), ("beside", "before")]


def test_the_cds_archive_is_a_path_off_or_unset():
    archive, name = switches.SPARK_CDS_ARCHIVE, switches.SPARK_CDS_ARCHIVE.name
    assert archive({}) is None  # the machine's cache
    for off in ("", "0", "off", "none", "false", "no", "OFF"):
        assert archive({name: off}) is False, off
    assert archive({name: "/opt/handoff/spark-cds.jsa"}) == "/opt/handoff/spark-cds.jsa"


def test_values_accepted_before_keep_their_meaning():
    """What each switch took before it was read here (an empty value always meant the default, on)."""
    assert not switches.SESSION_WARMUP({switches.SESSION_WARMUP.name: "false"})
    for switch in (switches.WORKER_PRELOAD, switches.FUSED_READ, switches.JVM_C1_ONLY):  # these took only "0"
        assert switch({switch.name: "0"}) is False and switch({switch.name: "1"}) is True
        assert switch({switch.name: ""}) is True
    assert switches.SESSION_WARMUP.as_set({"HANDOFF_SESSION_WARMUP": "NO"}) == "HANDOFF_SESSION_WARMUP=NO"


def test_a_bad_switch_is_a_one_line_refusal_of_the_driver(tmp_path):
    (tmp_path / "app.json").write_text(json.dumps({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "ns.t"}, "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "ck")}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "spark_app"), switches.STOP_GRACE_SECONDS.name: "soon"}
    run = subprocess.run([sys.executable, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "handoff: HANDOFF_STOP_GRACE_SECONDS='soon': use a number of seconds ≥ 0")


# ---------------------------------------------------------------------------------- docs/switches.md

def _table_after(heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table after `heading` in docs/switches.md."""
    lines = DOC.read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_data_planes_table_is_the_codes():
    assert switches.table() in DOC.read_text()
    assert [r[0].strip("`") for r in _table_after("## Data plane")] == list(switches.SWITCHES)


def _shown(default: object) -> str:
    if isinstance(default, list):
        return "empty = all"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def test_the_operators_table_is_its_settings():
    rows = {r[0].strip("`"): r[1] for r in _table_after("## Operator")}
    fields = OperatorSettings.model_fields
    expected = {f"HANDOFF_{name.upper()}": _shown(f.get_default(call_default_factory=True))
                for name, f in fields.items()}
    assert rows == expected
    assert not set(rows) & set(switches.SWITCHES)  # the operator and the data plane share no switch


# ------------------------------------------------------------------------------- read only through here

SWITCHES_FILE = Path(switches.__file__)
CONTRACT_FILE = SWITCHES_FILE.with_name("contract.py")
VARIABLE = re.compile(r"^HANDOFF_[A-Z0-9_]+$")


def _environ_key(node: ast.AST) -> ast.AST | None:
    """The key of `os.environ[key]`, `os.environ.get(key…)`, `os.getenv(key…)` (None: not such a read)."""
    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ"
    if isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return node.slice
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) and (
            (node.func.attr in ("get", "pop") and is_environ(node.func.value)) or node.func.attr == "getenv"):
        return node.args[0]
    return None


def _contract_env_name(node: ast.AST) -> str | None:
    """`contract.ENV_X` or `from handoff_spark.contract import ENV_X`: the name, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "contract":
        return node.attr if node.attr.startswith("ENV_") else None
    if isinstance(node, ast.ImportFrom) and node.module == "handoff_spark.contract":
        return next((a.name for a in node.names if a.name.startswith("ENV_")), None)
    return None


def test_no_module_reads_a_switch_on_its_own():
    """No `HANDOFF_*` name outside switches.py (and contract.py, which names what the operator renders), no
    environment read of one, and in the data plane no use of the contract's `ENV_*` names outside switches.py."""
    found = []
    for module in modules(SWITCHES_FILE):
        if module.path != CONTRACT_FILE:
            found += [f"{module.path}:{n.lineno}: {n.value!r}" for n in module.code_strings()
                      if VARIABLE.match(n.value)]
        constants = {t.id: n.value.value for n in module.tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(module.tree):
            key = _environ_key(node)
            if key is not None:
                value = key.value if isinstance(key, ast.Constant) else (
                    constants.get(key.id) if isinstance(key, ast.Name) else None)
                if not isinstance(value, str) or value.startswith("HANDOFF_"):
                    found.append(f"{module.path}:{node.lineno}: reads the environment with {ast.unparse(key)}")
            name = _contract_env_name(node) if module.root == SPARK and module.path != CONTRACT_FILE else None
            if name:
                found.append(f"{module.path}:{node.lineno}: {name} outside switches.py")
    assert found == []


def test_every_variable_the_operator_renders_is_a_switch():
    assert contract.RENDERED_ENV <= set(switches.SWITCHES)
