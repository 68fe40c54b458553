"""The GPU records not yet run (runs/README.md, "Records planned, not yet run"): each is planned to fit one node.

Why: a comparison must come from one node, and a node is held for at most 30 minutes, 25 of them planned
(bakeoff.node.plan). Each experiment below answers an item of issue 44 or 45 and was cut or split until
`bakeoff node plan` put it within 25 minutes; a change to its YAML, to the planner or to the committed records that
pushes it over fails here. Record a (issue 45, quality with real weights) is two records, one an engine; no record
has measured an evaluation on a GPU, so each is planned as what its evaluations may take for it to fit, and that
allowance is held here.

The vLLM parts' count comes from ``build/node-vllm/manifest.json`` where vLLM is packed: each plan is made twice,
with a packed manifest of 4 parts (the payload sent from a checkout without the records' tarballs,
docs/node-route-vllm.md) and with none (the planner's default, 6 parts), so the verdict does not depend on what
this checkout has built. The quality payload's (``build/node-quality``, record a only) is the planner's default
there, 2 parts of 55 MiB, and 4 (the parts a checkout with the records' tarballs leaves room for) where said.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.node.observed import Record, load_records
from bakeoff.node.plan import DEFAULT_QUALITY_PARTS, NODE_S, Plan, make_plan, quality_needs

from conftest import ROOT

RUNS = ROOT / "runs"

# experiment -> the issue item it answers
RECORDS = {
    "h100_capacity_steady": "issue 44 item 5 (vLLM fp8-online and fp16)",
    "h100_capacity_steady_llamacpp": "issue 44 item 5 (llama.cpp q4_k_m)",
    "h100_seed_fp8_q4_p128": "issue 45 record b",
    "h100_seed_fp8_q4_p1024": "issue 45 record b",
    "h100_seed_16bit_p128": "issue 45 record b",
    "h100_seed_16bit_p1024": "issue 45 record b",
    "h100_prefix_cache": "issue 45 record c (shared_prefix)",
    "h100_multiturn": "issue 45 record c (multiturn)",
}
# issue 45 record a, split by engine (h100_quality_vllm's YAML says why) -> the least minutes each of its
# evaluations may take for it to fit (with the vLLM payload in 4 parts and in the default 6)
QUALITY = {"h100_quality_vllm": 1.5, "h100_quality_llamacpp": 3.0}


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return load_records(RUNS)


@pytest.fixture(scope="module", params=[4, None], ids=["packed-4-parts", "not-packed"])
def repo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout's root as the planner reads it for vLLM's parts: a manifest of 4 parts, or none (6)."""
    root = tmp_path_factory.mktemp("repo")
    if request.param:
        (root / "build" / "node-vllm").mkdir(parents=True)
        manifest = {"version": "0.24.0", "packed_utc": "test", "parts": [{"name": f"part-{k:02d}"} for k in range(1, 5)]}
        (root / "build" / "node-vllm" / "manifest.json").write_text(json.dumps(manifest))
    return root


def plan(overrides: list[str], records: list[Record], repo: Path) -> Plan:
    return make_plan(["hardware=h100", *overrides], records=records, repo=repo, conf_dir=ROOT / "conf")


@pytest.mark.parametrize("experiment", sorted(RECORDS))
def test_each_record_fits_one_node(experiment: str, records: list[Record], repo: Path) -> None:
    p = plan([f"experiment={experiment}"], records, repo)
    assert p.fits, (experiment, RECORDS[experiment], round(p.total_s / 60, 1), p.unfit)
    assert p.total_s <= NODE_S and not p.unfit
    assert p.cfg.experiment.name == experiment
    # every rate of its cells is the H100 records' (none is the roofline alone, a lower bound)
    assert "roofline alone" not in " ".join(i.source for j in p.jobs for i in j.items if i.term == "cells")


def test_the_workload_records_fit_with_their_prompts_rated_long(records: list[Record], repo: Path) -> None:
    """The plan rates a shared_prefix or multiturn request as a prompt of load.prompt_len (128); rated as the
    records' measured 1,024-token prompts instead (the YAMLs' stated bound), each still fits."""
    prefix = plan(["experiment=h100_prefix_cache", "load.prompt_len=[1024]", "load.workload.shared_prefix.system_prompt_len=1"],
                  records, repo)
    chat = plan(["experiment=h100_multiturn", "load.prompt_len=[1024]", "load.workload.multiturn.turns=2",
                 "engines.llamacpp.settings.ctx_size=98304", "engines.llamacpp_nocache.settings.ctx_size=98304"], records, repo)
    for p in (prefix, chat):
        think_s = 60.0 if p is chat else 0.0  # multiturn's think time, which the plan does not count (its YAML)
        assert p.total_s + think_s <= NODE_S and not p.unfit, round(p.total_s / 60, 1)


def test_the_splits_were_needed(records: list[Record], repo: Path) -> None:
    """What the YAMLs say of the unsplit records: issue 44's three capacities on one node, and record b by prompt
    length alone (all four variants, even with 16 requests at c=1), do not fit."""
    capacity = plan(["experiment=h100_capacity_steady", "+experiment.variants.llamacpp=[q4_k_m]"], records, repo)
    assert not capacity.fits and capacity.total_s > NODE_S
    for p in (128, 1024):
        both = plan(["experiment=h100_seed_fp8_q4_p128", f"load.prompt_len=[{p}]", "experiment.variants.vllm=[fp16,fp8-online]",
                     "experiment.variants.llamacpp=[f16,q4_k_m]", "load.num_requests_by_concurrency={1:16}"], records, repo)
        assert not both.fits and both.total_s > NODE_S, p


@pytest.mark.parametrize("experiment", sorted(QUALITY))
def test_record_a_fits_where_each_evaluation_takes_its_allowance(experiment: str, records: list[Record], repo: Path) -> None:
    """Record a's two halves: no record scored quality on a GPU, so each evaluation counts the 30-minute bound and
    the plan does not fit; without its evaluations it fits, leaving each at least the minutes above. What the node
    needs comes first: the quality payload's part calls, before the prepare (bakeoff.node.quality): for the
    scorer and the model's weights, and for vLLM's fp8, compressed-tensors. When a record brings an eval_s, or the
    payload grows, these fail: plan it again."""
    p = plan([f"experiment={experiment}"], records, repo)
    q = p.rates.quality()
    assert q.value == 30 * 60 and "walltime's bound" in q.source and not p.fits
    assert p.unmeasured_quality is not None
    n, bare, each = p.unmeasured_quality
    assert n == 3 and bare <= NODE_S and each >= QUALITY[experiment] * 60, round(each / 60, 2)
    assert "roofline alone" in " ".join(i.source for j in p.jobs for i in j.items if i.term == "cells")  # no record
    assert len(quality_needs(p.cfg)) == (3 if "vllm" in experiment else 2)
    assert p.quality_parts == (DEFAULT_QUALITY_PARTS, p.quality_parts[1])
    assert [c.command.split()[-1] for c in p.calls[:DEFAULT_QUALITY_PARTS]] == \
        [f"build/node-quality/part-{k:02d}" for k in range(1, DEFAULT_QUALITY_PARTS + 1)]


def test_record_a_whole_leaves_its_evaluations_no_time(records: list[Record], repo: Path) -> None:
    """All six variants on one node (h100_quality): under half a minute an evaluation, the split's reason; from a
    checkout with the records' tarballs (the payload in 4 parts) the rest alone does not fit."""
    whole = plan(["experiment=h100_quality"], records, repo)
    assert whole.unmeasured_quality is not None and whole.unmeasured_quality[2] < 30
    wide = make_plan(["hardware=h100", "experiment=h100_quality", "eval=none"], records=records, repo=repo,
                     conf_dir=ROOT / "conf", quality=(4, "a checkout with the records' tarballs: parts of 28.8 MiB"))
    assert not wide.fits and wide.total_s > NODE_S, round(wide.total_s / 60, 1)
