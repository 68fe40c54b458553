"""The docs keep up with conf/: every experiment, hardware config, engine and format is in a table of docs/.

Why: a config option nobody can find is as good as missing, and a table that lists fewer options than exist
(or names one that is gone) misleads. The check reads the markdown tables of docs/ (the first column names the
option) and the option files of conf/; a file added to conf/ without a row fails here, naming the file.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from bakeoff.composition.compose import load_config

from conftest import ROOT

DOCS = ROOT / "docs"
# conf/ group -> the first column's header of the docs table that lists its options
GROUPS = {"experiment": "experiment", "hardware": "hardware", "engine": "engine", "model": "model", "load": "load",
          "eval": "eval", "workload": "workload"}
# Pages other work adds to docs/; the README links them already. Checked like any link once they exist.
PENDING = {"docs/columns.md", "docs/node-route-vllm.md"}


def tables(docs: Path) -> dict[str, list[list[str]]]:
    """Every markdown table of ``docs/*.md``, by its first header cell: rows of cells (the header row left out)."""
    out: dict[str, list[list[str]]] = {}
    for page in sorted(docs.glob("*.md")):
        rows: list[list[str]] = []
        for line in [*page.read_text().splitlines(), ""]:
            if line.startswith("|"):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
                continue
            if len(rows) > 2:
                out.setdefault(rows[0][0].lower(), []).extend(rows[2:])
            rows = []
    return out


def first_column_names(rows: list[list[str]]) -> set[str]:
    """The backticked names in the first cells, e.g. "`smoke` (default)" -> smoke."""
    return {m for row in rows for m in re.findall(r"`([^`]+)`", row[0])}


def conf_formats(conf: Path) -> dict[str, str]:
    """Format name -> its conf/quant file stem, from conf/config.yaml's defaults (quant@formats.<name>: <file>)."""
    defaults = yaml.safe_load((conf / "config.yaml").read_text())["defaults"]
    return {k.split("formats.", 1)[1]: v for d in defaults if isinstance(d, dict)
            for k, v in d.items() if k.startswith("quant@formats.")}


def undocumented(conf: Path, docs: Path) -> list[str]:
    """What conf/ has that the docs' tables do not list (and table rows naming options conf/ lacks)."""
    found = tables(docs)
    problems = []
    for group, header in GROUPS.items():
        options = {p.stem for p in (conf / group).glob("*.yaml") if not p.stem.startswith("_")}
        listed = first_column_names(found.get(header, []))
        problems += [f"conf/{group}/{o}.yaml is in no docs table headed '{header}'" for o in sorted(options - listed)]
        problems += [f"a docs table headed '{header}' lists `{o}`, which conf/{group}/ lacks"
                     for o in sorted(listed - options)]
    rows = found.get("format", [])
    listed = first_column_names(rows)
    files = {m.removesuffix(".yaml") for row in rows for cell in row[1:] for m in re.findall(r"`([^`]+\.yaml)`", cell)}
    formats = conf_formats(conf)
    problems += [f"format {f} (conf/config.yaml) is in no docs table headed 'format'" for f in sorted(set(formats) - listed)]
    problems += [f"conf/quant/{q}.yaml is named in no row of the docs' format table"
                 for q in sorted({p.stem for p in (conf / "quant").glob("*.yaml")} - files)]
    return problems


def test_every_conf_option_is_in_the_docs_tables() -> None:
    assert not undocumented(ROOT / "conf", DOCS), "\n".join(undocumented(ROOT / "conf", DOCS))


@pytest.mark.parametrize("added", ["experiment/new_exp.yaml", "hardware/newbox.yaml", "engine/sglang.yaml",
                                   "quant/q5_k_m.yaml"])
def test_a_conf_file_added_without_docs_fails_the_check(tmp_path: Path, added: str) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / added).write_text("{}\n")
    if added.startswith("quant/"):  # a format is a file plus its mount in the defaults
        text = (conf / "config.yaml").read_text()
        (conf / "config.yaml").write_text(text.replace("  - experiment: smoke", "  - quant@formats.q5_k_m: q5_k_m\n"
                                                       "  - experiment: smoke"))
    problems = undocumented(conf, DOCS)
    stem = Path(added).stem
    assert problems and all(stem in p for p in problems), problems


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    commands = [line.split("#")[0].strip() for line in readme.splitlines() if line.startswith("make ")]
    assert commands == ["make run", "make test"], commands
    assert "\nmake test || status=$?\n" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def test_every_relative_link_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "runs" / "README.md", *sorted(DOCS.glob("*.md")),
             *sorted((ROOT / "runs").glob("*/README.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists() and str(path.relative_to(ROOT)) not in PENDING:
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_link_to_a_section_names_one_that_exists() -> None:
    pages = [ROOT / "README.md", ROOT / "runs" / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)?#([^)\s]+)\)", page.read_text()):
            path = (page.parent / target).resolve() if target else page
            if path.exists() and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_the_extension_skeletons_compose(monkeypatch: pytest.MonkeyPatch) -> None:
    skeletons = DOCS / "skeletons"
    monkeypatch.syspath_prepend(str(skeletons / "my_engines"))
    search = f"hydra.searchpath=[file://{skeletons / 'conf'}]"
    cfg = load_config(["experiment=mine", search])
    assert cfg.variants() == [("sglang", "fp16"), ("llamacpp", "q4_k_m")]
    assert cfg.engines["sglang"].plugin == "sglang_engine:SglangEngine"
    assert load_config(["experiment=mine", "model=my_model", search]).model.source == "hub"
