"""Paths that results files record name no user's machine."""

from pathlib import Path

from simlab.common.locations import portable_path


def test_a_path_under_the_working_directory_is_recorded_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert portable_path(tmp_path / "traces" / "t") == str(Path("traces", "t"))


def test_a_path_under_home_is_recorded_with_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert portable_path(tmp_path / "home" / ".cache" / "simlab" / "t") == str(Path("~", ".cache", "simlab", "t"))
    assert portable_path(tmp_path / "other") == str(tmp_path / "other")  # neither: left as it is
