"""Each column's registered writer (bakeoff.results.columns, docs/columns.md's "written by") really writes it.

Why read the source: most writers run inside a serving job (a server, a load), so which module put a key in a row
cannot be seen from the row. What the writer's source shows is where a key is *stored*: a dict display's key,
a dict comprehension's key, ``row[key] = ...``, ``dict(key=...)`` or ``.update(key=...)``. A key is a literal, a
module constant, an f-string (its placeholders read as any text, or as the values of the loop it is in), or what
a module function returns. A module that only reads a column (``row["x"]``, ``row.get("x")``) or passes it along
under another name is not its writer, and fails here. The loadgen's columns are also checked by running it.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.results import columns


@cache
def stored_keys(module: str) -> frozenset[str]:
    """Regular expressions of the keys ``module``'s source stores into dicts (see the module docstring)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    consts: dict[str, list[str]] = {}
    funcs: dict[str, list[str]] = {}

    def patterns(node: ast.AST, scope: dict[str, list[str]]) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [re.escape(node.value)]
        if isinstance(node, ast.JoinedStr):
            out = [""]
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts = [re.escape(str(v.value))]
                elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in scope:
                    parts = scope[v.value.id]
                else:
                    parts = [".+"]
                out = [a + b for a in out for b in parts]
            return out
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [p for e in node.elts for p in patterns(e, scope)]
        if isinstance(node, ast.Name):
            return scope.get(node.id) or consts.get(node.id, [])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return funcs.get(node.func.id, [])
        return []

    for node in tree.body:  # module constants: NAME = "x", A, B = "x", "y", NAMES = ("x", "y")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for t in targets:
            if isinstance(t, ast.Name) and value is not None:
                consts[t.id] = patterns(value, {})
            elif isinstance(t, ast.Tuple) and isinstance(value, ast.Tuple):
                for a, b in zip(t.elts, value.elts, strict=True):
                    if isinstance(a, ast.Name):
                        consts[a.id] = patterns(b, {})
    for node in ast.walk(tree):  # what a key-making function returns: def key(stat, m): return f"{stat}_{m}_ms"
        if isinstance(node, ast.FunctionDef):
            funcs[node.name] = [p for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None
                                for p in patterns(r.value, {})]

    found: set[str] = set()

    def visit(node: ast.AST, scope: dict[str, list[str]]) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            scope = {**scope, node.target.id: patterns(node.iter, scope)}
        if isinstance(node, ast.DictComp):
            inner = {**scope, **{g.target.id: patterns(g.iter, scope) for g in node.generators
                                 if isinstance(g.target, ast.Name)}}
            found.update(patterns(node.key, inner))
        elif isinstance(node, ast.Dict):
            found.update(p for k in node.keys if k is not None for p in patterns(k, scope))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            found.update(patterns(node.slice, scope))
        elif isinstance(node, ast.Call) and ((isinstance(node.func, ast.Name) and node.func.id == "dict")
                                             or (isinstance(node.func, ast.Attribute) and node.func.attr == "update")):
            found.update(re.escape(k.arg) for k in node.keywords if k.arg)
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, {})
    return frozenset(p for p in found if p.replace(".+", ""))  # a key that is all placeholder names nothing


def writes(module: str, column: str) -> bool:
    return any(re.fullmatch(p, column) for p in stored_keys(module))


def test_every_column_is_written_by_each_module_registered_as_its_writer() -> None:
    wrong = [f"{t.name}.{c.name}: {w}" for t in columns.TABLES for c in t.columns() for w in c.writer.split(", ")
             if not writes(w, c.name)]
    assert wrong == [], wrong


@pytest.mark.parametrize(("column", "reader"), [
    ("peak_in_flight", "bakeoff.serving.capacity"),  # reads it from a probe as its concurrency
    ("over_ttft_share", "bakeoff.serving.capacity"),  # copies it into the capacity row as ..._at_capacity
    ("engine_version", "bakeoff.engines.base"),  # the plugins write it; the base class never names it
    ("status", "bakeoff.report.answer"),  # filters rows by it
])
def test_a_module_that_only_reads_a_column_is_not_its_writer(column: str, reader: str) -> None:
    assert not writes(reader, column)


def test_the_loadgens_columns_come_out_of_the_loadgen_when_it_runs() -> None:
    """The columns registered to bakeoff.loadgen.metrics, found in what its summarize() returns for real records."""
    records = [RequestRecord(index=i, prompt_len=32, output_len=8, start=0.01 * i, success=True, ttft=0.05 + 0.001 * i,
                             e2el=0.2 + 0.002 * i, itl=[0.02] * 7, prompt_tokens=32, output_tokens=8,
                             server_tpot_ms=20.0, server_prompt_ms=5.0) for i in range(8)]
    for r in records[:4]:  # a ramped cell: the first wave went out on the ramp
        r.ramp = True
    out = summarize(records, 0.5, {"ttft": 2000, "tpot": 200}, concurrency=4, start="ramp", ramp_s=0.04)
    registered = [c.name for t in columns.TABLES for c in t.columns() if "bakeoff.loadgen.metrics" in c.writer]
    assert {"peak_in_flight", "over_ttft_share", "over_tpot_share_ub95", "p99_ttft_ms_whole_cell"} <= set(registered)
    assert [c for c in registered if c not in out] == [], sorted(out)
