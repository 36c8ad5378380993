"""The Python API: the example of docs/commands.md runs as written, and ``import simlab`` stays light."""

import re
import subprocess
import sys
from pathlib import Path

import simlab

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    section = (ROOT / "docs" / "commands.md").read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_example_runs_as_written(tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "cache"))
    code = readme_example()
    assert len(code.strip().splitlines()) <= 6  # an import and five lines
    exec(compile(code, "docs/commands.md", "exec"), {})
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_every_api_name_resolves():
    for name in simlab.__all__:
        assert getattr(simlab, name) is not None, name


def test_import_simlab_loads_no_heavy_dependency():
    code = "import sys, simlab; print(sorted(m for m in ('pandas', 'simpy', 'matplotlib', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
