"""The house plan: each part of bakeoff imports only parts below it (or beside it), with no exception.

Why a test: the folder layout shows the architecture only while imports keep to
it; one import that runs back up (an engine reaching into a stage for a path)
makes every lower layer depend on everything. The test reads the imports of
every module (``ast``, nothing is imported), module-level and inside functions:
a call up at run time binds the layers as firmly as an import at load time.

A part is a package (``engines``) or a module at the top (``cli``). The config's
types (``config``) sit below the engines, which read them; composing a config
(``composition``) sits above the engines, which it asks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bakeoff"

# Lowest first. A module may import its own layer or any lower one.
LAYERS: list[set[str]] = [
    {"errors", "layout", "proc"},  # what every part needs: errors, the path grammar, processes
    {"models"},  # artifacts on disk: manifests, weights, model sources
    {"config"},  # the config's types
    {"hardware"},  # what the machine is and what it measured
    {"engines", "loadgen", "quality"},  # serving, loading and scoring a variant
    {"composition"},  # composing a config: Hydra, the schema, then each engine's own checks; sweeps
    {"results", "report"},  # what the numbers mean and how they are shown
    {"stages"},  # one DAG rule each: the order of events
    {"cli"},
]


def _part(module: str) -> str:
    """``bakeoff.engines.base`` -> ``engines``; ``bakeoff.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _rank(part: str) -> int:
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"bakeoff.{part} is in no layer: add it to LAYERS in {__file__}")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from(module: str, names: list[ast.alias]) -> list[str]:
    """What ``from <module> import <names>`` reaches: the module, or each name imported from the top package."""
    if module == "bakeoff":
        return [f"bakeoff.{a.name}" for a in names]
    return [module]


def _absolute(node: ast.ImportFrom, package: str) -> list[str]:
    """The modules a ``from`` import names, relative ones (``from ..stages import summary``) resolved against
    ``package``, the importing module's package."""
    if node.level == 0:
        return _from(str(node.module), node.names)
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - (node.level - 1)])
    if node.module:
        return _from(f"{base}.{node.module}", node.names)
    return [f"{base}.{a.name}" for a in node.names]


def _imports(tree: ast.Module, package: str = "bakeoff") -> list[tuple[str, bool]]:
    """(imported bakeoff module, imported at module level?) for every import in the file; ``package`` is the
    file's own package, against which relative imports resolve."""
    top = {id(n) for n in tree.body}
    for n in tree.body:  # `if TYPE_CHECKING:` and try/except blocks still run (or type-check) at import
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(c) for c in ast.walk(n)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            names = _absolute(node, package)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(n, id(node) in top) for n in names if n.startswith("bakeoff.")]
    return out


def violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        me = _module_name(path)
        mine = _part(me)
        if not mine:  # bakeoff/__init__.py
            continue
        package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for target, _ in _imports(ast.parse(path.read_text(), str(path)), package):
            theirs = _part(target)
            if _rank(theirs) <= _rank(mine):
                continue
            found.append(f"{me} imports {target} ({mine} is below {theirs})")
    return found


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert violations() == []


def test_at_most_five_modules_at_the_top() -> None:
    top = sorted(p.stem for p in SRC.glob("*.py"))
    assert len(top) <= 5, top
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} <= set().union(*LAYERS)


def test_composition_sits_above_the_engines_and_the_config_types_below_them() -> None:
    assert _rank("config") < _rank("engines") < _rank("composition")
    for text in ("from bakeoff.composition.compose import load_config\n", "from ..composition import compose\n"):
        (target, _), = _imports(ast.parse(text), "bakeoff.engines")
        assert _rank(_part(target)) > _rank("engines"), (text, target)


def test_the_check_catches_an_engine_importing_a_stage() -> None:
    tree = ast.parse("from bakeoff.stages.build_llamacpp import toolchain_bin\n")
    (target, at_import), = _imports(tree)
    assert at_import and _rank(_part(target)) > _rank("engines")


def test_relative_imports_are_read_too() -> None:
    """``from ..stages import summary`` inside models/manifest.py reaches up just as the absolute form does."""
    tree = ast.parse("def f():\n    from ..stages import summary\n    from . import weights\n")
    assert _imports(tree, "bakeoff.models") == [("bakeoff.stages", False), ("bakeoff.models.weights", False)]
    tree = ast.parse("from .. import layout\nfrom ..loadgen.metrics import summarize\n")
    assert _imports(tree, "bakeoff.stages") == [("bakeoff.layout", True), ("bakeoff.loadgen.metrics", True)]
