"""The record's ``table.md``: served speed beside llama-bench's kernel speed and the decode roofline.

Why its own module: it is the Markdown view of a record's cells, apart from how the cells were derived
(bakeoff.node.record).
"""

from __future__ import annotations

import json

from bakeoff.results.roofline import decode_ceiling


def _config(c: dict) -> str:
    settings = c.get("engine_settings") or {}
    if isinstance(settings, str):
        settings = json.loads(settings)
    return f"{c['engine']} --parallel {settings['parallel']}" if settings.get("parallel") else c["engine"]


def _saturated(c: dict) -> str:
    """``yes: <reason>`` where the client was the ceiling of the cell, ``no`` where not, blank where not recorded."""
    if c.get("client_saturated") is None:
        return ""
    return f"yes: {c.get('client_saturated_reason')}" if c["client_saturated"] else "no"


def _num(v: float | None, f: str = ".1f") -> str:
    return format(v, f) if v is not None else "not run"


def format_table(cells: list[dict], kernels: list[dict], bandwidth_gbs: float) -> str:
    """Per engine config, format and prompt length: served c=1 tok/s, llama-bench tg128, the roofline, J/token;
    then every cell with its served, server and telemetry columns.

    Rows are per engine config and format: two configs of one engine (``--parallel 32`` and ``4``) are two
    rows, told apart by their recorded settings as well as their name.
    """

    tg = {k["format"]: k["tg128_tok_s"] for k in kernels}
    lines = ["| engine | format | prompt | requests (c=1) | served tok/s (c=1) | kernel tg128 tok/s | roofline tok/s "
             f"({bandwidth_gbs:g} GB/s) | served / kernel | kernel / roofline | J/token c=1 | J/token c=8 | J/token c=32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted(dict.fromkeys((_config(c), c["format"], int(c["prompt_len"])) for c in cells),
                  key=lambda k: (k[0], k[1], k[2]))
    for eng, fmt, prompt in keys:
        by_c = {int(c["concurrency"]): c for c in cells if (_config(c), c["format"], int(c["prompt_len"])) ==
                (eng, fmt, prompt) and c.get("status") == "ok"}
        one = by_c.get(1, {})
        roof = decode_ceiling(bandwidth_gbs, one.get("weight_bytes") or next(
            c["weight_bytes"] for c in cells if c["format"] == fmt))
        served, kern = one.get("output_throughput"), tg.get(fmt)
        jt = [_num(by_c.get(c, {}).get("joules_per_output_token"), ".2f") for c in (1, 8, 32)]
        lines.append(f"| {eng} | {fmt} | {prompt} | {one.get('requests', 'not run')} | {_num(served)} | {_num(kern)} | "
                     f"{roof:.1f} | {_num(served / kern if served and kern else None, '.2f')} | "
                     f"{_num(kern / roof if kern else None, '.2f')} | {' | '.join(jt)} |")
    lines += ["", "| engine | format | c | prompt | requests | status | output tok/s | median TTFT ms | "
              "median TPOT ms (client / server) | peak waiting | KV peak % | J/token | client CPU s | client saturated |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (_config(c), c["format"], int(c["prompt_len"]), int(c["concurrency"]),
                                          str(c.get("started_utc")))):
        lines.append(f"| {_config(c)} | {c['format']} | {c['concurrency']} | {c['prompt_len']} | {c.get('requests')} | "
                     f"{c.get('status')} | {_num(c.get('output_throughput'))} | {_num(c.get('median_ttft_ms'), '.0f')} | "
                     f"{_num(c.get('median_tpot_ms'), '.3f')} / {_num(c.get('server_median_tpot_ms'), '.3f')} | "
                     f"{c.get('peak_waiting_requests', '')} | {_num(c.get('kv_cache_peak_pct'))} | "
                     f"{_num(c.get('joules_per_output_token'), '.2f')} | {_num(c.get('client_cpu_s'), '.2f')} | "
                     f"{_saturated(c)} |")
    return "\n".join(lines) + "\n"
