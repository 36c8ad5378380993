"""Build llama.cpp's ``llama-speculative-simple``, ``llama-server`` and simlab's trace tool from the package index alone.

llama.cpp's source ships inside the ``llama-cpp-python`` sdist (``vendor/llama.cpp``), so a
pinned sdist from PyPI is a reproducible source: CI and users need no other download. The build
lands in ``$SIMLAB_CACHE/engines/llama.cpp-<version>/`` and is reused: a second call returns at
once.

The trace tool (``llama_trace.cpp`` beside this file) is added to that tree as one more
example, built by the same CMake configuration with the same libraries as
``llama-speculative-simple``, so the numerics it records are the binary's own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from simlab.common.atomic import one_at_a_time
from simlab.common.errors import SimlabError
from simlab.common.locations import cache_root

VERSION = "0.3.36"  # llama-cpp-python release whose vendored llama.cpp the llama-cpp policy was read from
TARGET = "llama-speculative-simple"
SERVER = "llama-server"  # several requests at once in parallel slots (simlab.engines.llama_cpp.server)
TRACE_TOOL = "simlab-llama-trace"
TRACE_SOURCE = Path(__file__).with_name("llama_trace.cpp")
_TRACE_CMAKE = f"""set(TARGET {TRACE_TOOL})
add_executable(${{TARGET}} llama_trace.cpp)
target_link_libraries(${{TARGET}} PRIVATE llama-common llama ${{CMAKE_THREAD_LIBS_INIT}})
target_compile_features(${{TARGET}} PRIVATE cxx_std_17)
"""
CMAKE_FLAGS = ("-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release")


@dataclass(frozen=True)
class Build:
    """Where a built binary is, and whether this call had to build it."""

    binary: Path
    built_now: bool


def build_dir(root: Path | None = None) -> Path:
    return (root or cache_root() / "engines") / f"llama.cpp-{VERSION}"


def binary_path(root: Path | None = None, target: str = TARGET) -> Path:
    return build_dir(root) / "build" / "bin" / target


def build(root: Path | None = None, jobs: int = 2) -> Build:
    """Download the sdist, extract ``vendor/llama.cpp`` and build :data:`TARGET` (cached)."""
    with _one_builder(root):
        binary = binary_path(root)
        if binary.exists():
            return Build(binary, built_now=False)
        _configure(root)
        return Build(_make(root, TARGET, jobs), built_now=True)


def _one_builder(root: Path | None):
    """One process at a time configures and builds in the tree (cmake's own files are not shared safely)."""
    work = build_dir(root)
    return one_at_a_time(work.with_name(f".{work.name}.lock"))


def build_server(root: Path | None = None, jobs: int = 2) -> Build:
    """Build :data:`SERVER` in the same tree (after :func:`build`; cached)."""
    with _one_builder(root):
        build(root, jobs)
        binary = binary_path(root, SERVER)
        if binary.exists():
            return Build(binary, built_now=False)
        return Build(_make(root, SERVER, jobs), built_now=True)


def build_trace_tool(root: Path | None = None, jobs: int = 2) -> Build:
    """Build :data:`TRACE_TOOL` in the same tree (after :func:`build`); rebuilt when its source changed."""
    with _one_builder(root):
        return _build_trace_tool(root, jobs)


def _build_trace_tool(root: Path | None, jobs: int) -> Build:
    build(root, jobs)
    binary = binary_path(root, TRACE_TOOL)
    example = build_dir(root) / "src" / "examples" / TRACE_TOOL
    source = TRACE_SOURCE.read_text()
    copy = example / TRACE_SOURCE.name
    if binary.exists() and copy.exists() and copy.read_text() == source:
        return Build(binary, built_now=False)
    example.mkdir(exist_ok=True)
    copy.write_text(source)
    (example / "CMakeLists.txt").write_text(_TRACE_CMAKE)
    listing = example.parent / "CMakeLists.txt"
    line = f"add_subdirectory({TRACE_TOOL})\n"
    if line not in listing.read_text():
        listing.write_text(listing.read_text() + line)
    _configure(root)
    return Build(_make(root, TRACE_TOOL, jobs), built_now=True)


def _make(root: Path | None, target: str, jobs: int) -> Path:
    _run(["cmake", "--build", str(build_dir(root) / "build"), "--target", target, "-j", str(jobs)], "build")
    binary = binary_path(root, target)
    if not binary.exists():
        raise SimlabError(f"llama.cpp built but {binary} is missing")
    return binary


def _configure(root: Path | None) -> None:
    missing = [tool for tool in ("cmake", "cc", "c++") if shutil.which(tool) is None]
    if missing:
        raise SimlabError(f"building llama.cpp needs {' and '.join(missing)} on PATH (e.g. apt-get install cmake g++)")
    work = build_dir(root)
    source = work / "src"
    if not (source / "CMakeLists.txt").exists():
        _extract(_download(work / "sdist"), source)
    _run(["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_FLAGS], "configure")


def _download(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={VERSION}", "-d", str(dest)], "download of the llama-cpp-python sdist")
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SimlabError(f"pip downloaded no llama-cpp-python sdist into {dest}")
    return found[0]


def _extract(sdist: Path, source: Path) -> None:
    """Unpack only ``vendor/llama.cpp`` of the sdist into ``source``."""
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    tmp = source.with_name(source.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(source, ignore_errors=True)
    tmp.rename(source)


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SimlabError(f"llama.cpp {what} failed ({cmd[0]} exited {done.returncode}): {tail[0]}")
