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
    ("errors",),
    ("atomic",),  # writes that never leave a half-written output
    ("jsonfile", "paths", "params", "signals", "mapping", "metrics", "openmp", "cpu_load"),  # no domain knowledge
    ("table_file",),  # result tables on disk (their list columns: metrics)
    ("trace",),  # the schema, IO, replay and synthetic traces
    ("latency", "models", "analytic", "engines", "trees"),
    ("record", "policies"),
    ("rounds",),  # the protocol between a policy and an executor
    ("sim",),  # the SimPy executor
    ("live", "serve", "predictor", "analytic_trace", "frontier", "result_table", "bench"),
    ("sweep", "plots", "serve_live"),  # serve_live: live batched decoding beside serve's prediction
    ("serve_llama",),  # llama-server under load beside serve's prediction (reads serve_live's cut_trace)
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
