"""Grid syntax: ranges, lists, several parameters, TOML files, and one-line errors."""

import pytest

from simlab.common.errors import SimlabError
from simlab.sweep.grid import combine, parse_policy, parse_values, read_grid


def test_integer_range_is_inclusive():
    assert parse_values("1..12") == tuple(range(1, 13))
    assert parse_values("2..12:2") == (2, 4, 6, 8, 10, 12)
    assert parse_values("1..10:4") == (1, 5, 9)


def test_float_range_has_exactly_the_decimal_values():
    taus = parse_values("0.5..0.95:0.05")
    assert taus == (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)  # 0.95 included, no 0.7000000001
    assert parse_values("0..1:0.3") == (0.0, 0.3, 0.6, 0.9)


def test_single_values_keep_their_type():
    assert parse_values("5") == (5,)
    assert parse_values("0.7") == (0.7,)
    assert parse_values("true") == (True,)
    assert parse_values("confidence") == ("confidence",)


def test_policy_spec_lists_and_several_parameters():
    assert parse_policy("pearl").values == {}
    assert parse_policy("sd:gamma=1,2,4,8").values == {"gamma": (1, 2, 4, 8)}
    grid = parse_policy("spide:tau=0.5,0.9,window=2..3")
    assert grid.values == {"tau": (0.5, 0.9), "window": (2, 3)}
    assert list(grid) == [{"tau": 0.5, "window": 2}, {"tau": 0.5, "window": 3},
                          {"tau": 0.9, "window": 2}, {"tau": 0.9, "window": 3}]
    assert len(grid) == 4


def test_dashes_in_names_become_underscores():
    assert parse_policy("oracle:max-draft=3").values == {"max_draft": (3,)}


@pytest.mark.parametrize("spec, fragment", [
    ("sd:gamma=1..x", "bad range '1..x'"),
    ("sd:gamma=0.5..1", "needs a step"),
    ("sd:gamma=5..1", "empty"),
    ("sd:gamma=1..5:0", "step must be positive"),
    ("sd:gamma=1..1e9", "at most"),
    ("sd:3", "is not KEY=VALUES"),
    ("sd:=3", "no parameter name"),
    ("sd:gamma=", "empty parameter value"),
    ("sd:gamma=1,gamma=2", "given twice"),
    (":gamma=1", "needs a policy name"),
])
def test_bad_specs_say_what_is_wrong(spec, fragment):
    with pytest.raises(SimlabError) as err:
        parse_policy(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_toml_grid_file(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('''
[[policy]]
name = "sd"
gamma = "1..3"

[[policy]]
name = "spide"
tau = "0.5..0.7:0.1"
window = [2, 4]
verbose = true

[[policy]]
name = "ad"
''')
    grids = read_grid(path)
    assert [g.policy for g in grids] == ["sd", "spide", "ad"]
    assert grids[0].values == {"gamma": (1, 2, 3)}
    assert grids[1].values == {"tau": (0.5, 0.6, 0.7), "window": (2, 4), "verbose": (True,)}
    assert grids[2].values == {}


@pytest.mark.parametrize("text, fragment", [
    ("", "has no [[policy]] tables"),
    ("[[policy]]\ngamma = 3\n", 'needs name = "POLICY"'),
    ('[[policy]]\nname = "sd"\ngamma = []\n', "gamma: the list is empty"),
    ('[[policy]]\nname = "sd"\ngamma = "3..1"\n', "gamma: bad range"),
    ('[[policy]]\nname = "sd"\ngamma = {a = 1}\n', "not a value, a list or a range"),
    ('trace = "x"\n[[policy]]\nname = "sd"\n', "unknown top-level keys ['trace']"),
    ("[[policy]\n", "not valid TOML"),
])
def test_bad_grid_files_say_what_is_wrong(tmp_path, text, fragment):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(SimlabError) as err:
        read_grid(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_grid_file_then_specs_and_never_empty(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('[[policy]]\nname = "ad"\n')
    assert [g.policy for g in combine(["sd:gamma=2"], path)] == ["ad", "sd"]
    with pytest.raises(SimlabError, match="empty grid"):
        combine([], None)
    with pytest.raises(SimlabError, match="grid file not found"):
        combine([], tmp_path / "missing.toml")
