"""The README's first-screen figure cannot go stale: its command (the one the README names) runs
again here, into a temporary folder, and the data behind the figure must be the committed data.

PNG bytes differ across matplotlib versions and fonts, so the image itself is not compared byte
for byte: the sweep table it is drawn from is (every column but the timings and the cache key,
which names the simulator's source), and the figure drawn again from the committed table must have
the committed image's size. A number that moves fails here until the figure is made again.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pandas as pd

from simlab.sweep.result_table import TIMING_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
FIGURE = "docs/figures/frontier.png"


def readme_command() -> str:
    readme = (ROOT / "README.md").read_text()
    assert f"![" in readme.split("## From your pair")[0] and f"]({FIGURE})" in readme  # on the first screen
    return next(block for block in re.findall(r"```bash\n(.*?)```", readme, re.S) if FIGURE in block).strip()


def run(command: str, out: Path) -> None:
    for part in command.split("&&"):
        args = shlex.split(part.replace("docs/figures/", f"{out}/"))
        assert args[0] == "simlab", part
        subprocess.run([sys.executable, "-m", "simlab", *args[1:]], cwd=ROOT, check=True, capture_output=True)


def data(csv: Path) -> pd.DataFrame:
    return pd.read_csv(csv).drop(columns=[*TIMING_COLUMNS, "key"])


def test_the_first_screen_figure_is_made_by_its_command_from_the_committed_data(tmp_path):
    run(readme_command(), tmp_path)
    pd.testing.assert_frame_equal(data(tmp_path / "frontier.csv"), data(ROOT / "docs/figures/frontier.csv"))
    committed = ROOT / FIGURE
    assert committed.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(committed).shape == matplotlib.image.imread(tmp_path / "frontier.png").shape
