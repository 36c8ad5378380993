"""Building llama.cpp from the llama-cpp-python sdist: cache reuse and clear errors (no build here)."""

import pytest

from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp import build as llama_cpp


def test_a_built_binary_is_reused_without_building(tmp_path, monkeypatch):
    binary = llama_cpp.binary_path(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    monkeypatch.setattr(llama_cpp, "_run", lambda *a: pytest.fail("rebuilt a cached binary"))
    assert llama_cpp.build(tmp_path) == llama_cpp.Build(binary, built_now=False)


def test_missing_cmake_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda tool: None if tool == "cmake" else "/bin/" + tool)
    with pytest.raises(SimlabError, match="needs cmake on PATH"):
        llama_cpp.build(tmp_path)


def test_a_failed_step_names_the_step_and_the_last_line(tmp_path):
    with pytest.raises(SimlabError, match=r"llama.cpp configure failed \(false exited 1\)"):
        llama_cpp._run(["false"], "configure")
