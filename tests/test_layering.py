"""The one-way module flow: no simlab module imports from a layer above its own.

Every import counts, function-local ones included (a hidden upstream import is still one).
Layers are listed once, here, from the bottom; a unit (a top-level module or package of
simlab) may import only units of strictly lower layers, and any module of its own package.
A new unit must be placed in a layer before this test passes.
"""

import ast
from pathlib import Path

import simlab

LAYERS = (
    ("common",),  # errors, metrics, signals, files: no stage's knowledge
    ("trace",),  # the schema, IO, replay and synthetic traces
    ("latency", "models", "engines", "trees"),
    ("record", "policies"),  # policies: decisions, and the round protocol that asks them
    ("sim",),  # the SimPy executor
    ("serve", "predictor", "analytic"),  # analytic: closed forms, and the same beside a simulation
    ("live", "sweep"),  # live: real decoding (and engines) measured beside the prediction
    ("plots",),
    ("cli",),
    ("__main__",),
)
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}
ROOT = Path(simlab.__file__).parent


def unit_of(module: str) -> str:
    """``simlab.sim.run`` -> ``sim``; ``simlab`` itself -> ``simlab`` (the package facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "simlab"


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported simlab module, line) for every import in the file, however deeply nested."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "simlab"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "simlab":  # from simlab import analytic: the named modules
                out += [(f"simlab.{a.name}", node.lineno) for a in node.names]
            elif node.module.startswith("simlab."):
                out.append((node.module, node.lineno))
    return out


def modules() -> list[tuple[str, Path]]:
    return [(unit_of("simlab." + ".".join(p.relative_to(ROOT).with_suffix("").parts)), p)
            for p in sorted(ROOT.rglob("*.py")) if p != ROOT / "__init__.py"]


def test_every_unit_has_a_layer():
    assert sorted({unit for unit, _ in modules()} - set(LAYER)) == []


def test_no_module_imports_from_its_own_layer_or_above():
    upstream = []
    for unit, path in modules():
        for target, line in imports(path):
            other = unit_of(target)
            if other != unit and LAYER.get(other, len(LAYERS)) >= LAYER[unit]:
                upstream.append(f"{path.relative_to(ROOT.parent)}:{line} ({unit}) imports {target}")
    assert upstream == []


def test_the_checker_sees_function_local_and_package_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from simlab.cli.output import console\nfrom simlab import analytic\n")
    assert sorted(imports(src)) == [("simlab.analytic", 3), ("simlab.cli.output", 2)]


def module_graph() -> dict[str, set[str]]:
    """simlab module -> the simlab modules it imports (``from pkg import sub`` counts ``pkg.sub``)."""
    names = {"simlab." + ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in ROOT.rglob("*.py")}
    names = {n.removesuffix(".__init__"): p for n, p in names.items()}
    graph = {}
    for name, path in names.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in names:
                    t = t.rpartition(".")[0]
                if t and t != name and t != "simlab":
                    out.add(t)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every import loop, each once, as the modules along it (Tarjan's strongly connected components)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(tuple(sorted(part)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_two_modules_import_each_other_even_round_about():
    assert cycles(module_graph()) == []


def test_the_loop_finder_sees_a_loop_round_about():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_top_holds_only_stage_folders():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == []


def test_the_architecture_table_names_every_stage_folder_and_nothing_else():
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    table = text[text.index("| folder | job |"):].split("\n\n")[0]
    named = set()
    for row in table.splitlines()[2:]:
        named |= {m.strip(" `/").removeprefix("simlab/") for m in row.split("|")[1].split(",")}
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert named == folders
    assert set(LAYER) - {"__main__"} == folders
