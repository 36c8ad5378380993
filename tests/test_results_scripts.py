"""The evidence under results/ stays runnable: one README per area naming every check script, every
script's simlab imports resolve in today's package, and the scripts that need no model reproduce
the output committed beside them.

A script that names a module the package no longer has (after a module moved, say) fails here,
not on the day someone re-runs it.
"""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SCRIPTS = sorted(RESULTS.rglob("*.py"))
# Scripts that read only committed files (no model, no engine): run here, their stdout compared
# with the file they wrote when committed.
MODEL_FREE = {
    "llama-server/old_pricing.py": "llama-server/old_pricing.txt",
    "llama-server/arrivals_check.py": "llama-server/arrivals_check.txt",
}


def area(path: Path) -> Path:
    return RESULTS / path.relative_to(RESULTS).parts[0]


def test_every_area_has_a_readme_that_names_each_of_its_scripts():
    areas = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    assert [a.name for a in areas if not (a / "README.md").is_file()] == []
    unnamed = []
    for script in SCRIPTS:
        readme = (area(script) / "README.md").read_text()
        if str(script.relative_to(area(script))) not in readme and script.name not in readme:
            unnamed.append(str(script.relative_to(RESULTS)))
    assert unnamed == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_simlab_name_a_script_imports_exists(script):
    missing = []
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("simlab"):
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names
                        if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("simlab") and importlib.util.find_spec(a.name) is None:
                    missing.append(a.name)
    assert missing == []


@pytest.mark.parametrize("script", sorted(MODEL_FREE))
def test_a_model_free_check_prints_what_was_committed(script):
    out = subprocess.run([sys.executable, str(RESULTS / script)], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out == (RESULTS / MODEL_FREE[script]).read_text()
