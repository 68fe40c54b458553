"""`bakeoff node plan` (bakeoff.node.plan) against the committed GPU records, each re-planned leave-one-out.

What is compared. Each record under runs/ whose config can be recomposed is planned again: its call logs'
``--config`` entries, ``hardware=auto`` read from its ``hardware.json``, and what its capacity search ran with
where today's defaults differ (``as_run``: the point rule, a burst start, a bisection to adjacent loads, the
search's own maximum, each read from the record's files). The rates come from the OTHER records only: the same
GPU model's first, else the other GPU's moved by the roofline, else the roofline alone. A plan whose rates came
from the record it is checked against would only read its own logs back, so the record is left out of them.

For every job of the record's call logs, the plan's seconds for the work that job did are set beside its logged
seconds: a finished serving job's server start, the cells it measured, its capacity searches as the plan runs
them, its quality; a serving job stopped by a call's limit, its start, cells and each probe it finished, against
its time up to the end of its last one (the rest was lost at the limit); a finished model, build or check job,
its rule's rate. Summed over those jobs, the plan must land within 25 % of the logs. The one record that ran its
whole config to the end (``h100-seed-2026-12-06``, its last call rc 0) is also compared whole: the plan's run
calls' Snakemake minutes against its calls' (the plan runs the models in the background prepare, the record ran
them, 1.5 minutes, in its first call).

Skipped, with why: ``h200-llamacpp-matrix-2026-12-04`` (its four calls ran different configs, and cells were
taken over from earlier bundles: no one config's plan describes it), ``h200-llamacpp-probe-2026-12-03`` and
``cpu-smoke-repeats-2026-12-03`` (no call logs: not node runs of a config).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from bakeoff.loadgen.capacity import probes_needed
from bakeoff.node.observed import PlanError, Record, load_record, load_records
from bakeoff.node.plan import CALL_S, NODE_S, PART_CALL_S, QUALITY_INSTALL_S, Plan, make_plan, quality_needs, render
from bakeoff.node.plan_check import RecordCheck, check_record, record_overrides, record_section

from conftest import ROOT

RUNS = ROOT / "runs"
REPLANNED = ["h100-seed-2026-12-06", "h100-seed-p1024-2026-12-06", "h100-capacity-2026-12-06",
             "h100-capacity-steady-2026-12-07", "h200-llamacpp-blocks-2026-12-04"]
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return load_records(RUNS)


@pytest.fixture(scope="module")
def checks(records: list[Record]) -> dict[str, RecordCheck]:
    return {name: check_record(RUNS / name, records=records) for name in REPLANNED}


def test_every_gpu_record_is_replanned_or_skipped_with_why(records: list[Record]) -> None:
    """The records with call logs and a tarball are those re-planned, but the matrix, which says why not."""
    with_logs = {r.name for r in records if r.calls}
    assert with_logs == {*REPLANNED, "h200-llamacpp-matrix-2026-12-04"}
    with pytest.raises(PlanError, match="different configs"):
        record_overrides(RUNS / "h200-llamacpp-matrix-2026-12-04")
    assert load_record(RUNS / "h200-llamacpp-probe-2026-12-03") is None  # no node tarball: a probe's notes


@pytest.mark.parametrize("name", REPLANNED)
def test_the_plan_lands_within_25_percent_of_the_logs_leave_one_out(name: str, checks: dict[str, RecordCheck]) -> None:
    chk = checks[name]
    assert name not in {r.name for r in chk.plan.rates.records}  # leave-one-out: never its own rates
    assert chk.compared and chk.logged_s > 0
    rows = "\n".join(f"  call {j.call} {j.label}: planned {j.planned_s:.0f} s, logged {j.logged_s:.0f} s"
                     for j in chk.compared)
    assert abs(chk.error) <= TOLERANCE, (
        f"{name}: planned {chk.planned_s / 60:.1f} min, logged {chk.logged_s / 60:.1f} min "
        f"({100 * chk.error:+.0f} %):\n{rows}")


# Whole, the one record run to its end is over-planned: 23.1 min against 18.2 logged (+27 %, with the default six
# parts). Job by job it lands within 25 % (above); what the whole adds is the packing into calls: the plan cuts two
# jobs at a call's limit (3.9 min lost to restarts) where the record's first call lost one job's 42 s. Held here
# at what it is, so that a change to the packing that makes it worse fails.
WHOLE_RUN_TOLERANCE = 0.30


def test_a_record_run_to_its_end_is_planned_whole_within_30_percent(checks: dict[str, RecordCheck]) -> None:
    chk = checks["h100-seed-2026-12-06"]
    assert not chk.plan.unfit
    assert chk.plan.parts is not None and chk.plan.parts[0] == 6  # never this checkout's packed manifest
    error = chk.plan.run_s / chk.logged_total_s - 1.0
    assert abs(error) <= WHOLE_RUN_TOLERANCE, (chk.plan.run_s / 60, chk.logged_total_s / 60)


def test_the_rates_say_where_they_came_from(checks: dict[str, RecordCheck]) -> None:
    """Leave-one-out, the prompt-128 record's vLLM fp16 is rated from the other H100 record of that variant (the
    steady capacity record's cells and probes, c=32 to 256); llama.cpp's comes from the H200's records."""
    plan = checks["h100-seed-2026-12-06"].plan
    text = render(plan)
    assert "vllm-fp16 p128:" in text
    fp16 = plan.rates.metric("median_tpot_ms", "vllm", "vllm", "fp16", 128, 8)
    assert "h100-capacity-steady-2026-12-07" in fp16.source and "this variant" in fp16.source
    q4 = plan.rates.metric("median_tpot_ms", "llamacpp", "llamacpp", "q4_k_m", 128, 8)
    assert "H200" in q4.source
    # the measured value there was 9.37 / 8.89 ms (blocks 0 / 1): the transferred rate is within 15 %
    assert abs(q4.value / 9.13 - 1.0) < 0.15, q4


PLANS = [["experiment=h100_capacity_steady", "hardware=h100"], ["experiment=h200_seed", "hardware=h100"],
         ["experiment=h200_blocks", "hardware=h200"],
         ["experiment=h200_blocks", "hardware=h200", "load.repeats=1", "experiment.variants={llamacpp:[q4_k_m]}"]]


@pytest.fixture(scope="module")
def plans(records: list[Record]) -> list[Plan]:
    return [make_plan(o, records=records) for o in PLANS]


def test_every_run_call_gives_snakemake_at_most_9_minutes(plans: list[Plan]) -> None:
    for plan in plans:
        runs = [c for c in plan.calls if c.items or c.lost_s]
        assert runs, plan.overrides
        for c in plan.calls:
            assert c.wait_s + c.snakemake_s + c.lost_s <= CALL_S + 1e-6, (plan.overrides, c.number, c.seconds)
            assert c.command.startswith(("bash .gpucarry/node.sh", "bash build/node-vllm/node.sh --part"))
        assert plan.calls[0].command.startswith("bash .gpucarry/node.sh --prepare " + plan.overrides[0])


def test_the_verdict_is_computed_from_the_minutes(plans: list[Plan]) -> None:
    """Fits 25 minutes: the node's total and every item within a call; the small cut fits, the full seed does not."""
    for plan in plans:
        assert plan.fits == (plan.total_s <= NODE_S and not plan.unfit)
        assert abs(sum(plan.terms().values()) - plan.total_s) < 1e-6
    verdicts = [p.fits for p in plans]
    assert verdicts[-1] and not verdicts[1], [round(p.total_s / 60, 1) for p in plans]
    assert f"Fits 25 minutes on one node: {'yes' if plans[-1].fits else 'no'}" in render(plans[-1])


def test_a_search_is_run_by_the_capacity_module_within_its_budget(plans: list[Plan]) -> None:
    plan = plans[0]  # h100_capacity_steady: searches from 64 users at 5 % resolution
    cap = plan.cfg.load.capacity
    assert plan.searches
    for s in plan.searches:
        assert s.probes[0][0] == min(cap.start_concurrency, s.maximum)
        assert s.budget == probes_needed(cap.start_concurrency, s.maximum, cap.resolution) + 2
        assert len(s.probes) <= s.budget


def test_the_vllm_route_counts_its_part_calls_and_the_build_runs_in_the_background(plans: list[Plan]) -> None:
    seed, blocks = plans[1], plans[2]
    assert seed.parts is not None and sum("--part" in c.command for c in seed.calls) == seed.parts[0]
    assert blocks.parts is None and not any("--part" in c.command for c in blocks.calls)
    assert any(j.rule == "build_llamacpp" for j in blocks.background)
    assert blocks.terms()["wait"] > 0  # no part calls to hide the build behind: the first run call waits


def _quality_packed(repo: Path, parts: int) -> Path:
    (repo / "build" / "node-quality").mkdir(parents=True)
    manifest = {"packed_utc": "test", "parts": [{"name": f"part-{k:02d}"} for k in range(1, parts + 1)]}
    (repo / "build" / "node-quality" / "manifest.json").write_text(json.dumps(manifest))
    return repo


def test_the_quality_payload_goes_in_part_calls_before_the_prepare(records: list[Record], tmp_path: Path) -> None:
    """h100_quality needs the quality payload (bakeoff.node.quality) for its model's weights and its fp8, and for
    scoring unless eval=none: one call a packed part, before ``--prepare`` (whose fetch_model reads the GGUF from it),
    the last installing it. Parts before the prepare hide none of its background work: the wait does not depend on
    their count (mutant: the wait counted from the first call). A config needing none of it has none."""
    def quality(parts: int) -> Plan:
        return make_plan(["experiment=h100_quality", "hardware=h100", "eval=none"], records=records,
                         repo=_quality_packed(tmp_path / f"q{parts}", parts), conf_dir=ROOT / "conf")
    three, one = quality(3), quality(1)
    assert len(quality_needs(three.cfg)) == 2  # the weights and the fp8; eval=none scores nothing
    commands = [c.command for c in three.calls]
    assert commands[:3] == [f"bash build/node-quality/node.sh --part build/node-quality/part-0{k}" for k in (1, 2, 3)]
    assert commands[3].startswith("bash .gpucarry/node.sh --prepare experiment=h100_quality")
    assert three.quality_parts is not None and three.quality_parts[0] == 3
    assert three.terms()["quality_parts"] == 3 * PART_CALL_S + QUALITY_INSTALL_S
    assert three.terms()["wait"] == one.terms()["wait"] > 0
    assert "quality parts: 3, from build/node-quality/manifest.json" in render(three)
    seed = make_plan(["experiment=h200_seed", "hardware=h100"], records=records, repo=_quality_packed(tmp_path / "s", 3),
                     conf_dir=ROOT / "conf")
    assert seed.quality_parts is None and not any("node-quality" in c.command for c in seed.calls)


def test_the_command_prints_a_plan() -> None:
    from bakeoff.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["node", "plan", "experiment=h200_blocks", "hardware=h200", "load.repeats=1"]) == 0
    text = out.getvalue()
    assert "Minutes on the node, by term" in text and "Fits 25 minutes on one node:" in text
    assert "bash .gpucarry/node.sh experiment=h200_blocks hardware=h200 overrides=load.repeats=1\n" in text


def test_a_record_keeps_its_plan_beside_its_minutes() -> None:
    text = record_section(RUNS / "h100-seed-p1024-2026-12-06")
    assert text.startswith("### Plan and minutes")
    assert "| 2 | serve_block llamacpp-q4_k_m block 0 | finished |" in text
    assert "Jobs compared: planned" in text


def test_a_missing_rate_says_so() -> None:
    """With no record at all, the roofline alone: a lower bound, named."""
    plan = make_plan(["experiment=h200_blocks", "hardware=h200", "load.repeats=1"], records=[])
    rate = plan.rates.metric("median_tpot_ms", "llamacpp", "llamacpp", "q4_k_m", 128, 8)
    assert rate.source == "roofline alone (a lower bound)"
    assert "no record" in plan.rates.start("llamacpp", True).source


def test_a_scored_llamacpp_variant_builds_its_scorer_binding_in_the_background(records: list[Record]) -> None:
    """llama.cpp's variants are scored on llama-cpp-python over the node's own libllama (build_llamacpp_python, a
    prepare rule): the plan counts its build beside the CUDA build, and not where nothing is scored."""
    scored = make_plan(["experiment=h100_quality_llamacpp", "hardware=h100"], records=records)
    plain = make_plan(["experiment=h100_quality_llamacpp", "hardware=h100", "eval=none"], records=records)
    vllm = make_plan(["experiment=h100_quality_vllm", "hardware=h100"], records=records)
    assert [j.rule for j in scored.background].count("build_llamacpp_python") == 1
    assert not any(j.rule == "build_llamacpp_python" for j in [*plain.background, *vllm.background])
    assert scored.background_s > plain.background_s
