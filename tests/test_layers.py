"""The package's layers point one way and its modules import no cycle (checked on the source).

core (errors, settings, statistics types, core/) <- transport/ <- client (TritonModel, routing,
fallback, validation, share) <- coffea glue (mixin, columns) <- everything else (zoo, engines,
server, data, examples, demo, bench, facility, cli). Every ``import`` of a coffea_sonic module
counts, at module level or inside a function: a lazy import still couples the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "coffea_sonic"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # zoo.spec: the zoo's tensor declarations (plain data, imported by data/ and the engines
    # without the zoo's models), so it sits with the core types
    ("core", ("coffea_sonic.errors", "coffea_sonic.config", "coffea_sonic.stats",
              "coffea_sonic.lazy",
              "coffea_sonic.core", "coffea_sonic.zoo.spec")),
    ("transport", ("coffea_sonic.transport",)),
    ("client", ("coffea_sonic.model", "coffea_sonic.calls", "coffea_sonic.classification",
                "coffea_sonic.routing",
                "coffea_sonic.fallback", "coffea_sonic.validation", "coffea_sonic.ragged",
                "coffea_sonic.share", "coffea_sonic.tracing", "coffea_sonic.cache",
                "coffea_sonic.dispatch", "coffea_sonic.hooks",
                "coffea_sonic.answers", "coffea_sonic.retry", "coffea_sonic.endpoints",
                "coffea_sonic.discovery", "coffea_sonic.provenance",
                "coffea_sonic.model_options", "coffea_sonic.incidents", "coffea_sonic.unserved",
                "coffea_sonic.shadow", "coffea_sonic.sizing", "coffea_sonic.ramp")),
    ("glue", ("coffea_sonic.processor", "coffea_sonic.columns",
              "coffea_sonic.repeats",
              "coffea_sonic.preflight", "coffea_sonic.run_report")),
    ("top", ("coffea_sonic.zoo", "coffea_sonic.engines", "coffea_sonic.server",
             "coffea_sonic.data", "coffea_sonic.examples", "coffea_sonic.demo",
             "coffea_sonic.bench", "coffea_sonic.facility", "coffea_sonic.cli",
             "coffea_sonic.netlab", "coffea_sonic.cliargs", "coffea_sonic.config_cli")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def _imports(path: Path) -> set[str]:
    """coffea_sonic modules ``path`` imports (absolute or relative, anywhere in the file)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("coffea_sonic"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("coffea_sonic"):
                continue
            found.add(target)
            # `from . import x` imports the submodule x when it is one
            for alias in node.names:
                if (PACKAGE.parent / Path(*f"{target}.{alias.name}".split("."))).with_suffix(
                        ".py").exists() or (PACKAGE.parent / Path(
                        *f"{target}.{alias.name}".split("."))).is_dir():
                    found.add(f"{target}.{alias.name}")
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in _graph() if m != "coffea_sonic" and _layer(m) is None]
    assert not unplaced, f"modules without a layer (add them to LAYERS): {unplaced}"


def test_imports_point_down_the_layers():
    upward = []
    for module, imported in _graph().items():
        here = _layer(module)
        if here is None:  # the package's lazy public namespace
            continue
        for target in sorted(imported):
            there = _layer(target)
            if there is not None and there > here:
                upward.append(f"{module} ({LAYERS[here][0]}) imports {target} "
                              f"({LAYERS[there][0]})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = _graph()
    # a package's __init__ re-exporting its own submodules is not a cycle of behaviour
    edges = {m: {t for t in ts if t in graph and not m.startswith(t + ".")
                 and not (t.startswith(m + ".") and graph.get(m) is not None
                          and (PACKAGE.parent / Path(*m.split("."))).is_dir())}
             for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
