"""One CLI convention for every rule: a rule named ``x_y`` runs ``bakeoff stage x-y`` or ``bakeoff x-y``.

So a rule's log, its command and the module that does the work can be found from its name alone. A
``bakeoff stage`` rule's work is in ``stages/<rule>.py``, or in the hardware module named here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULE = re.compile(r"^(?:local)?rule (\w+):(.*?)(?=^(?:local)?rule |\Z)", re.S | re.M)
COMMAND = re.compile(r"bakeoff (stage )?([a-z][\w-]*)")
# Stage rules whose work is a hardware check, not an artifact stage.
IN_HARDWARE = {"doctor": "hardware/doctor.py", "ecc_recheck": "hardware/ecc.py"}


def rules() -> dict[str, re.Match[str] | None]:
    out = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for m in RULE.finditer(smk.read_text()):
            out[m.group(1)] = COMMAND.search(m.group(2))
    return out


def test_every_rule_runs_the_command_of_its_own_name():
    found = rules()
    assert len(found) > 20
    wrong = {name: cmd.group(0) for name, cmd in found.items() if cmd and cmd.group(2) != name.replace("_", "-")}
    assert wrong == {}
    assert [name for name, cmd in found.items() if cmd is None] == ["node", "node_prepare"]  # targets: they run nothing


def test_every_stage_rule_has_its_module():
    src = ROOT / "src" / "bakeoff"
    stage_rules = [name for name, cmd in rules().items() if cmd and cmd.group(1)]
    missing = [n for n in stage_rules if not (src / IN_HARDWARE.get(n, f"stages/{n}.py")).is_file()]
    assert stage_rules and missing == []
