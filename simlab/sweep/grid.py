"""Sweep grids: which policies, and which values of each parameter, a sweep runs.

A grid is a list of :class:`PolicyGrid`; each runs every combination of its parameters'
values (their Cartesian product). Grids come from the command line or a TOML file, in one
value syntax:

- ``sd:gamma=1..12`` — an inclusive integer range; ``gamma=2..12:2`` steps by 2;
- ``spide:tau=0.5..0.95:0.05`` — a float range needs a step (values rounded to the digits
  typed, so 0.5..0.95:0.05 is exactly ten values, 0.95 included);
- ``sd:gamma=1,2,4,8`` — a list: a comma followed by something without ``=`` continues the
  previous parameter's values; ``spide:tau=0.5,0.9,window=2..4`` sweeps two parameters;
- ``pearl`` — a policy at its defaults.

A TOML grid file holds one ``[[policy]]`` table per policy; ``name`` names it and every other
key is a parameter whose value is a range string, a list, or a single value::

    [[policy]]
    name = "sd"
    gamma = "1..12"

    [[policy]]
    name = "spide"
    tau = "0.5..0.95:0.05"
    window = [2, 4]

Grids name policies and parameters without knowing them; the runner checks them against the
policy registry (so new policies need nothing here).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from simlab.common.errors import SimlabError
from simlab.common.params import parse_value

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

RANGE = ".."
MAX_RANGE = 10_000  # values one range may expand to: beyond this it is a typo, not a sweep


@dataclass(frozen=True)
class PolicyGrid:
    """One policy and the values to sweep for each of its parameters (in the order given)."""

    policy: str
    values: dict[str, tuple[Any, ...]]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every combination of parameter values, the last parameter varying fastest."""
        names = list(self.values)
        for combo in itertools.product(*(self.values[n] for n in names)):
            yield dict(zip(names, combo))

    def __len__(self) -> int:
        return math.prod(len(v) for v in self.values.values())


def parse_values(text: str) -> tuple[Any, ...]:
    """One parameter's values from ``a..b``, ``a..b:step`` or a single value."""
    text = text.strip()
    if RANGE not in text:
        if not text:
            raise SimlabError("empty parameter value")
        return (parse_value(text),)
    low, _, rest = text.partition(RANGE)
    high, _, step = rest.partition(":")
    try:
        a, b = Decimal(low), Decimal(high)
        d = Decimal(step) if step else Decimal(1)
    except InvalidOperation:
        raise SimlabError(f"bad range {text!r}: write START..STOP or START..STOP:STEP with numbers") from None
    if not (a.is_finite() and b.is_finite() and d.is_finite()):
        raise SimlabError(f"bad range {text!r}: bounds and step must be finite numbers")
    integral = all(x == x.to_integral_value() and "." not in s for x, s in ((a, low), (b, high), (d, step or "1")))
    if not integral and not step:
        raise SimlabError(f"bad range {text!r}: a range of non-integers needs a step, e.g. {low}..{high}:0.05")
    if d <= 0:
        raise SimlabError(f"bad range {text!r}: the step must be positive")
    if b < a:
        raise SimlabError(f"bad range {text!r}: it is empty (stop < start)")
    count = int((b - a) / d) + 1  # Decimal arithmetic: exact for the decimals people type
    if count > MAX_RANGE:
        raise SimlabError(f"bad range {text!r}: {count:,} values (at most {MAX_RANGE:,}); is the step right?")
    values = [a + i * d for i in range(count)]
    return tuple(int(v) for v in values) if integral else tuple(float(v) for v in values)


def parse_policy(spec: str) -> PolicyGrid:
    """``NAME`` or ``NAME:KEY=VALUES,KEY=VALUES`` (see the module docstring)."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise SimlabError(f"bad --policy {spec!r}: it needs a policy name, e.g. sd:gamma=1..12")
    values: dict[str, list[Any]] = {}
    key = None
    for part in filter(str.strip, rest.split(",")):
        if "=" in part:
            key, _, text = part.partition("=")
            key = key.strip().replace("-", "_")
            if not key:
                raise SimlabError(f"bad --policy {spec!r}: {part!r} has no parameter name")
            if key in values:
                raise SimlabError(f"bad --policy {spec!r}: parameter {key!r} is given twice")
            values[key] = []
        elif key is None:
            raise SimlabError(f"bad --policy {spec!r}: {part!r} is not KEY=VALUES")
        else:
            text = part
        try:
            values[key].extend(parse_values(text))
        except SimlabError as exc:
            raise SimlabError(f"bad --policy {spec!r}: {exc}") from None
    if rest and not values:
        raise SimlabError(f"bad --policy {spec!r}: nothing after ':'; write NAME or NAME:KEY=VALUES")
    return PolicyGrid(name, {k: tuple(v) for k, v in values.items()})


def read_grid(path: str | Path) -> list[PolicyGrid]:
    """The ``[[policy]]`` tables of a TOML grid file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise SimlabError(f"grid file not found: {p}") from None
    except OSError as exc:  # a directory, no permission
        raise SimlabError(f"cannot read grid file {p} ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SimlabError(f"grid file {p} is not valid TOML ({exc})") from None
    tables = data.get("policy")
    if not isinstance(tables, list) or not tables:
        raise SimlabError(f"grid file {p} has no [[policy]] tables")
    unknown = sorted(set(data) - {"policy"})
    if unknown:
        raise SimlabError(f"grid file {p}: unknown top-level keys {unknown}; a grid file holds [[policy]] tables")
    return [_table_grid(p, i, t) for i, t in enumerate(tables, 1)]


def _table_grid(path: Path, index: int, table: dict[str, Any]) -> PolicyGrid:
    where = f"grid file {path}, [[policy]] #{index}"
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise SimlabError(f"{where}: needs name = \"POLICY\"")
    values: dict[str, tuple[Any, ...]] = {}
    for key, value in table.items():
        if key == "name":
            continue
        try:
            if isinstance(value, str):
                values[key] = parse_values(value)
            elif isinstance(value, list):
                if not value:
                    raise SimlabError("the list is empty")
                values[key] = tuple(value)
            elif isinstance(value, (int, float, bool)):
                values[key] = (value,)
            else:
                raise SimlabError(f"a {type(value).__name__} is not a value, a list or a range string")
        except SimlabError as exc:
            raise SimlabError(f"{where} ({name}), {key}: {exc}") from None
    return PolicyGrid(name, values)


def combine(specs: list[str], grid_file: str | Path | None = None) -> list[PolicyGrid]:
    """The grids of a grid file and of ``--policy`` specs, file first; never empty."""
    grids = read_grid(grid_file) if grid_file else []
    grids += [parse_policy(s) for s in specs]
    if not grids:
        raise SimlabError("empty grid: give at least one --policy (e.g. sd:gamma=1..12) or --grid FILE")
    return grids
