"""The policy flags of ``simulate`` and ``live``, built from the policies' own declarations.

Every declared parameter (:class:`~simlab.policies.base.Param`) and each of its aliases
becomes one ``--NAME`` flag whose type and help come from the declaration, so the commands
cannot drift from the policies, and a new parameter needs nothing here. A flag sets the
parameter of that name of whichever policy is chosen; a policy without it is a one-line error,
and values are checked by the policy itself (once, when it is built). ``--param KEY=VALUE``
sets any parameter by name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from simlab.cli.output import policy_params
from simlab.policies import REGISTRY
from simlab.policies.base import Param as Declared

Policy = Annotated[str, typer.Option("--policy", help="Policy name (see `simlab policies`).")]
PANEL = "Policy parameters (each sets the chosen policy's parameter of that name)"


def declared() -> dict[str, list[tuple[str, Declared]]]:
    """Flag name (a parameter's name or alias) -> the (policy, parameter) pairs it sets."""
    out: dict[str, list[tuple[str, Declared]]] = {}
    for policy, cls in REGISTRY.items():
        for p in cls.params:
            for name in (p.name, *p.aliases):
                out.setdefault(name, []).append((policy, p))
    return out


def flag_help(name: str, uses: list[tuple[str, Declared]]) -> str:
    """Which policies the flag sets (under which of their parameters) and its values; what the
    parameter means, policy by policy, is in ``simlab policies``."""
    own = [policy for policy, p in uses if p.name == name]
    aliased = [f"{policy} {p.name}" for policy, p in uses if p.name != name]
    ranges = " / ".join(sorted({p.kind.range for _, p in uses}))
    parts = [f"For {', '.join(own)}." if own else "", f"Also, as Hugging Face or vLLM name it: {', '.join(aliased)}." if aliased else ""]
    return " ".join(filter(None, parts)) + f" Values: {ranges}."


def flag_type(name: str, uses: list[tuple[str, Declared]]) -> type:
    types = {p.kind.type for _, p in uses}
    if len(types) != 1:  # pinned by tests/test_cli_policies.py
        raise TypeError(f"policy parameter {name!r} is declared with types {sorted(t.__name__ for t in types)}")
    return types.pop()


def _option(name: str, uses: list[tuple[str, Declared]]) -> inspect.Parameter:
    kind = flag_type(name, uses)
    dashed = "--" + name.replace("_", "-")
    flag = f"{dashed}/--no-{name.replace('_', '-')}" if kind is bool else dashed
    option = typer.Option(flag, help=flag_help(name, uses), rich_help_panel=PANEL, show_default=False)
    return inspect.Parameter(f"policy_{name}", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[kind], option])


def with_policy_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` a flag per declared policy parameter and ``--param``; it receives their
    values, merged, as its ``params`` argument (a dict of the parameters that were given)."""
    flags = {name: _option(name, uses) for name, uses in declared().items()}
    pairs = inspect.Parameter("param", inspect.Parameter.KEYWORD_ONLY, default=[], annotation=Annotated[
        list[str], typer.Option("--param", "-P", help="Any policy parameter as KEY=VALUE; repeatable.",
                                rich_help_panel=PANEL, show_default=False)])
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "params"]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(option.name) for name, option in flags.items()}
        return command(params=policy_params(kwargs.pop("param"), **given), **kwargs)

    parameters = [*own, pairs, *flags.values()]
    run.__signature__ = inspect.Signature(parameters)  # what Typer reads the options from
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    return run
