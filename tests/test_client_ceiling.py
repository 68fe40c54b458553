"""The load client must never pass for the server's limit: where it saturated, every report says so.

Fast: rows and capacity results written here, read by the same functions that build the answer page,
the node's run record and the CSV columns.
"""

from __future__ import annotations

from bakeoff.node.correct import CELL_COLUMNS
from bakeoff.node.table import format_table
from bakeoff.report.answer import fixed_leaders, slo_leaders
from bakeoff.stages.summary import CAPACITY_COLUMNS, COLUMNS


def _row(fmt: str, block: int, tok_s: float, saturated: bool) -> dict:
    return {"experiment": "h200_seed", "engine": "vllm", "format": fmt, "prompt_len": "128", "concurrency": "32",
            "status": "ok", "output_throughput": str(tok_s), "block": str(block), "node_id": "n1", "cell": "",
            "probe_of": "", "client_saturated": str(saturated), "client_cpu_s": "3.5"}


def test_a_fixed_leader_whose_cells_saturated_the_client_says_so():
    rows = [_row("fp8-online", 0, 7000, True), _row("fp8-online", 1, 7100, False),
            _row("fp16", 0, 5000, False), _row("fp16", 1, 5050, False)]
    (lead,) = fixed_leaders(rows)
    assert lead.leader == "vllm-fp8-online"
    assert "client saturated in the cells of vllm-fp8-online (1 of 2): the client may be the ceiling" in lead.verdict
    clean = [{**r, "client_saturated": "False"} for r in rows]
    assert "client" not in fixed_leaders(clean)[0].verdict


def test_a_capacity_lead_names_the_probes_where_the_client_saturated():
    cap = [{"experiment": "h200_seed", "prompt_len": "128", "slo": "interactive", "engine": "vllm", "format": f,
            "capacity_concurrency": c, "concurrency_converged": "True", "client_saturated_probes": probes}
           for f, c, probes in (("fp8-online", "48", "cap-interactive-c64-p128"), ("fp16", "32", ""))]
    (lead,) = slo_leaders([], cap)
    assert lead.leader == "vllm-fp8-online"
    assert lead.verdict.endswith("client saturated in probes of vllm-fp8-online (cap-interactive-c64-p128)")


def test_the_client_cpu_is_a_column_beside_every_cell_and_capacity():
    assert {"client_cpu_s", "client_cpu_share", "client_saturated", "client_saturated_reason"} <= set(COLUMNS)
    assert {"client_cpu_s_at_capacity", "client_saturated_at_capacity", "client_saturated_probes"} <= set(CAPACITY_COLUMNS)
    assert {"client_cpu_s", "client_saturated", "client_saturated_reason"} <= set(CELL_COLUMNS)


def test_the_node_record_table_shows_the_client_cpu_and_its_verdict():
    cell = {"engine": "vllm", "format": "fp8-online", "concurrency": 32, "prompt_len": 128, "requests": 100,
            "status": "ok", "output_throughput": 7000.0, "weight_bytes": 7_000_000_000, "client_cpu_s": 3.456,
            "client_saturated": True, "client_saturated_reason": "client CPU 0.41 of the cell's wall time > 0.3"}
    table = format_table([cell, {**cell, "concurrency": 8, "client_saturated": False, "client_cpu_s": 0.5}], [],
                         4300.0)
    assert "| client CPU s | client saturated |" in table
    assert "| 3.46 | yes: client CPU 0.41 of the cell's wall time > 0.3 |" in table
    assert "| 0.50 | no |" in table
