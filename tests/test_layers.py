"""The house plan: each part of bakeoff imports only parts below it (or beside it), with no exception.

Why a test: the folder layout shows the architecture only while imports keep to
it; one import that runs back up (an engine reaching into a stage for a path)
makes every lower layer depend on everything. The test reads the imports of
every module (``ast``, nothing is imported), module-level and inside functions:
a call up at run time binds the layers as firmly as an import at load time.

A part is a package (``engines``) or a module at the top (``cli``). The config's
types (``config``) sit below the engines, which read them; composing a config
(``composition``) sits above the engines, which it asks.

Inside a layer, and inside a package, no module may reach itself again through
its imports: a circle of modules is one module split across files, whichever
of its imports runs first decides what the others see half-made.
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
    {"serving"},  # one variant served: its job, its server's steps, each cell measured, the capacity search
    {"results", "report"},  # what the numbers mean and how they are shown
    {"node"},  # the DAG's GPU share on a node reached through limited transfers, and the records it returns
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


def _is_module(name: str, src: Path = SRC) -> bool:
    """``bakeoff.node.bundle`` is a file or a package under ``src`` (the ``bakeoff`` folder)."""
    rel = Path(*name.split(".")[1:])
    return (src / rel).with_suffix(".py").is_file() or (src / rel / "__init__.py").is_file()


def _from(module: str, names: list[ast.alias], src: Path = SRC) -> list[str]:
    """What ``from <module> import <names>`` reaches: each name that is a module of its own
    (``from bakeoff.serving import capacity``), else the module the names come from."""
    subs = [f"{module}.{a.name}" for a in names if _is_module(f"{module}.{a.name}", src)]
    if module == "bakeoff":
        return [f"bakeoff.{a.name}" for a in names]
    return subs if len(subs) == len(names) else [module, *subs]


def _absolute(node: ast.ImportFrom, package: str, src: Path = SRC) -> list[str]:
    """The modules a ``from`` import names, relative ones (``from ..stages import summary``) resolved against
    ``package``, the importing module's package."""
    if node.level == 0:
        return _from(str(node.module), node.names, src)
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - (node.level - 1)])
    if node.module:
        return _from(f"{base}.{node.module}", node.names, src)
    return [f"{base}.{a.name}" for a in node.names]


def _imports(tree: ast.Module, package: str = "bakeoff", src: Path = SRC) -> list[tuple[str, bool]]:
    """(imported bakeoff module, imported at module level?) for every import in the file; ``package`` is the
    file's own package, against which relative imports resolve."""
    top = {id(n) for n in tree.body}
    for n in tree.body:  # `if TYPE_CHECKING:` and try/except blocks still run (or type-check) at import
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(c) for c in ast.walk(n)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            names = _absolute(node, package, src)
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
    assert _imports(tree, "bakeoff.models") == [("bakeoff.stages.summary", False), ("bakeoff.models.weights", False)]
    tree = ast.parse("from .. import layout\nfrom ..loadgen.metrics import summarize\n")
    assert _imports(tree, "bakeoff.stages") == [("bakeoff.layout", True), ("bakeoff.loadgen.metrics", True)]


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the bakeoff modules it imports, at module level or inside a function (both bind the modules)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        me = ".".join(parts)
        package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        graph[me] = {t for t, _ in _imports(ast.parse(path.read_text(), str(path)), package, src) if t != me}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: every strongly connected set of two or more modules (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _faces(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without a package's own ``__init__`` re-exporting its modules: a package's face hands names on,
    and a module importing a sibling through the face is read as importing the sibling."""
    return {m: {t for t in ts if not (m.startswith(t + ".") or t.startswith(m + "."))} for m, ts in graph.items()}


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(_faces(import_graph())) == []


def test_the_circle_check_catches_a_function_level_import_that_closes_a_loop(tmp_path: Path) -> None:
    """A planted circle: ``a`` imports ``b`` at module level, ``b`` imports ``a`` only inside a function."""
    pkg = tmp_path / "bakeoff" / "hardware"
    pkg.mkdir(parents=True)
    (tmp_path / "bakeoff" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bakeoff.hardware.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from bakeoff.hardware import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path / "bakeoff")
    assert cycles(_faces(graph)) == [["bakeoff.hardware.a", "bakeoff.hardware.b"]]
    (pkg / "b.py").write_text("def g():\n    return 1\n")  # the loop opened: no circle
    assert cycles(_faces(import_graph(tmp_path / "bakeoff"))) == []
