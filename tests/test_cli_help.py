"""Every option's default is visible in ``--help`` of every command (Rich markup once ate the
``[default: ...]`` written into help strings)."""

import pytest
import typer
from typer.testing import CliRunner

from simlab.cli import app
from simlab.cli.commands import load


def commands(cmd=None, path=()):
    """(path, command) of every leaf command of the app, and of every group that is a command
    itself (``serve``: its options serve, ``serve tune`` is its subcommand)."""
    if cmd is None:
        load()  # every command module registers its commands on the app
        cmd = typer.main.get_command(app)
    if hasattr(cmd, "commands"):
        if cmd.invoke_without_command:
            yield path, cmd
        for name, sub in cmd.commands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path, cmd


def has_default(option) -> bool:
    """A default worth showing: one said in words, or a value other than "not given"."""
    if isinstance(option.show_default, str):
        return True
    return option.show_default is not False and option.default not in (None, "", [], (), False)


def help_lines(path) -> list[str]:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def option_entries(lines: list[str]) -> dict[str, str]:
    """Each option's entry of the help, as one line: an entry starts with its flags ("  -o, --out
    <path>", "  --dynamic-exit / --no-dynamic-exit") and goes on in the lines indented further."""
    entries, flags = {}, None
    for line in lines:
        if line.startswith("  -"):
            flags = [f for f in line.split("  ")[1].replace(" / ", ", ").split(", ")]
            flags = [f.split()[0] for f in flags if f]
            for flag in flags:
                entries[flag] = line
        elif flags and line.startswith("    "):
            for flag in flags:
                entries[flag] += " " + line
        else:
            flags = None
    return {flag: " ".join(text.split()) for flag, text in entries.items()}


@pytest.mark.parametrize("path, command", list(commands()), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_option_with_a_default_shows_it_in_help(path, command):
    entries = option_entries(help_lines(path))
    missing = []
    for option in command.params:
        if option.param_type_name != "option" or option.hidden:
            continue
        line = entries.get(option.opts[0], "")
        if option.help and " ".join(option.help.replace("\\[", "[").split()) not in line:
            missing.append(f"{option.opts[0]} (help text)")
        if not has_default(option):
            continue
        words = f"[default: ({option.show_default})" if isinstance(option.show_default, str) else "[default: "
        if words not in line:
            missing.append(option.opts[0])
    assert not missing, f"simlab {' '.join(path)} --help hides the help or default of {missing}"


def test_brackets_in_help_text_survive():
    assert any("[[policy]] tables" in line for line in help_lines(("sweep",)))
