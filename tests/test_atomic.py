"""The one way simlab writes outputs (simlab/common/atomic.py): all or nothing, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from simlab.common.atomic import check_output, one_at_a_time, replace_dir, replace_file
from simlab.common.errors import SimlabError


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "table.csv"
    out.write_text("old\n")

    def half_then_fail(tmp):
        tmp.write_text("half of the new")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        replace_file(out, half_then_fail)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_an_os_error_while_writing_is_one_line_naming_the_output(tmp_path):
    def no_space(tmp):
        tmp.write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(SimlabError, match=r"cannot write .*x\.json \(No space left on device\)"):
        replace_file(tmp_path / "x.json", no_space)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_directory_write_keeps_the_old_directory(tmp_path):
    out = tmp_path / "trace"
    out.mkdir()
    (out / "manifest.json").write_text("{}")

    def fail(tmp):
        (tmp / "positions.parquet").write_bytes(b"new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_dir(out, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["trace"]
    assert [p.name for p in out.iterdir()] == ["manifest.json"]


def test_what_a_killed_writer_left_is_removed_by_the_next_write(tmp_path):
    dead = 2**22 + 12345  # above the default pid_max: no such process
    (tmp_path / f".trace.tmp-{dead}").mkdir()
    (tmp_path / f".table.tmp-{dead}.csv").write_text("torn")
    replace_dir(tmp_path / "trace", lambda tmp: (tmp / "manifest.json").write_text("{}"))
    replace_file(tmp_path / "table.csv", lambda tmp: tmp.write_text("a\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv", "trace"]


def test_a_running_writers_temporary_is_left_alone(tmp_path):
    mine = tmp_path / f".table.tmp-{os.getppid()}.csv"  # a live process's
    mine.write_text("in progress")
    replace_file(tmp_path / "table.csv", lambda tmp: tmp.write_text("a\n"))
    assert mine.exists()


@pytest.mark.parametrize("force", [False, True])
def test_force_never_replaces_a_directory_simlab_did_not_write(tmp_path, force):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SimlabError, match="did not write"):
        check_output(tmp_path, directory=True, force=force, owned="manifest.json")


HOLDER = """
import sys, time
from pathlib import Path
from simlab.common.atomic import one_at_a_time
lock, filled = Path(sys.argv[1]), Path(sys.argv[2])
with one_at_a_time(lock):
    print("held", flush=True)
    time.sleep(1.0)
    filled.write_text("filled")
"""


def test_a_second_installer_waits_for_the_first_and_finds_its_cache_filled(tmp_path):
    lock, filled = tmp_path / "cache" / ".install.lock", tmp_path / "cache" / "model"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(filled)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    said = []
    t0 = time.monotonic()
    with one_at_a_time(lock, said.append):
        assert filled.read_text() == "filled"  # entered only after the first had filled the cache
    assert time.monotonic() - t0 > 0.3
    assert said and "waiting for another simlab process" in said[0]
    assert holder.wait(timeout=30) == 0


def test_the_lock_is_reentrant_in_one_process_and_free_after(tmp_path):
    lock, said = tmp_path / ".build.lock", []
    with one_at_a_time(lock, said.append):
        with one_at_a_time(lock, said.append):  # llama.cpp's server build starts with the plain build
            pass
    holder = subprocess.run([sys.executable, "-c", HOLDER, str(lock), str(tmp_path / "x")], capture_output=True,
                            text=True, timeout=30)
    assert holder.returncode == 0 and said == []
