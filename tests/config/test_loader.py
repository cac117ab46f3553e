"""The generic config loader on a toy schema that has every supported field type."""

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
import yaml

from mindgrpo.config.loader import ConfigError, check, from_dict, load_config, parse_overrides, to_dict, to_yaml


@dataclass(frozen=True)
class Inner:
    foo: int = 1
    rate: float = 0.5

    def __post_init__(self):
        check(self.rate <= 1.0, "rate", f"must be <= 1, got {self.rate}")


@dataclass(frozen=True)
class Middle:
    inner: Inner = field(default_factory=Inner)
    name: str = "m"


@dataclass(frozen=True)
class Toy:
    n: int = 3
    x: float = 1.5
    flag: bool = False
    name: str = "toy"
    maybe: Optional[int] = None
    maybe_path: Optional[str] = None
    ids: tuple[int, ...] = ()
    weights: list[float] = field(default_factory=lambda: [1.0])
    pair: tuple[int, str] = (0, "a")
    kind: Literal["a", "b"] = "a"
    table: dict[str, float] = field(default_factory=dict)
    middle: Middle = field(default_factory=Middle)
    opt_section: Optional[Inner] = None

    def __post_init__(self):
        check(self.n != 13, "n", "13 is unlucky")


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value


# ---------------------------------------------------------------------------------------
# defaults, YAML, precedence
# ---------------------------------------------------------------------------------------


def test_defaults_when_nothing_is_given(tmp_path):
    assert from_dict(Toy, {}) == Toy()
    assert load_config(Toy) == Toy()
    assert load_config(Toy, write(tmp_path, "")) == Toy()  # an empty file


def test_yaml_values_keep_their_types(tmp_path):
    cfg = load_config(Toy, write(tmp_path, """
n: 5
x: 2          # an int widens to float
flag: true
name: hello
maybe: 4
ids: [1, 2, 3]
weights: [1e-6, 2]   # 1e-6 is a float (PyYAML alone reads a string)
pair: [7, z]
kind: b
table: {a: 1, b: 0.5}
middle: {name: mid, inner: {foo: 8}}
opt_section: {rate: 0.25}
"""))
    assert cfg == Toy(n=5, x=2.0, flag=True, name="hello", maybe=4, ids=(1, 2, 3), weights=[1e-6, 2.0],
                      pair=(7, "z"), kind="b", table={"a": 1.0, "b": 0.5},
                      middle=Middle(inner=Inner(foo=8), name="mid"), opt_section=Inner(rate=0.25))
    assert type(cfg.x) is float and type(cfg.weights[0]) is float and type(cfg.table["a"]) is float


def test_cli_overrides_yaml_which_overrides_defaults(tmp_path):
    path = write(tmp_path, "n: 5\nx: 2.5\nmiddle:\n  inner: {foo: 4, rate: 0.25}\n")
    cfg = load_config(Toy, path, ["n=6", "middle.inner.foo=9", "n=7"])  # the later of two overrides wins
    assert (cfg.n, cfg.x, cfg.middle.inner.foo, cfg.middle.inner.rate) == (7, 2.5, 9, 0.25)
    assert (cfg.flag, cfg.name, cfg.middle.name) == (False, "toy", "m")  # untouched defaults
    # a section set whole on the command line replaces the YAML's keys for it
    cfg = load_config(Toy, path, ["middle.inner={foo: 7}"])
    assert cfg.middle.inner == Inner(foo=7, rate=0.5)
    # "--key=value" is accepted too
    assert load_config(Toy, path, ["--n=8"]).n == 8


# ---------------------------------------------------------------------------------------
# CLI coercion
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("override,attr,expected", [
    ("n=7", "n", 7),
    ("n=-2", "n", -2),
    ("x=1e-3", "x", 0.001),
    ("x=2", "x", 2.0),
    ("flag=true", "flag", True),
    ("flag=True", "flag", True),
    ("flag=1", "flag", True),
    ("flag=false", "flag", False),
    ("flag=False", "flag", False),
    ("flag=0", "flag", False),
    ("name=123", "name", "123"),  # str fields take the text verbatim
    ("name=null", "name", "null"),
    ("name=a=b", "name", "a=b"),  # split at the first '='
    ("maybe=5", "maybe", 5),
    ("maybe=null", "maybe", None),
    ("maybe=None", "maybe", None),
    ("maybe_path=~", "maybe_path", None),
    ("maybe_path=runs/a b", "maybe_path", "runs/a b"),
    ("ids=[1,2]", "ids", (1, 2)),
    ("ids=[]", "ids", ()),
    ("weights=[1, 2.5]", "weights", [1.0, 2.5]),
    ("pair=[3, x]", "pair", (3, "x")),
    ("kind=b", "kind", "b"),
    ("table={a: 1, b: 2.5}", "table", {"a": 1.0, "b": 2.5}),
    ("opt_section={foo: 2}", "opt_section", Inner(foo=2)),
    ("opt_section.foo=2", "opt_section", Inner(foo=2)),
])
def test_cli_values_are_converted_to_the_field_type(override, attr, expected):
    value = getattr(load_config(Toy, overrides=[override]), attr)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("override,key,expected", [
    ("n=1.5", "n", "expected int, got '1.5' (command line)"),
    ("n=abc", "n", "expected int"),
    ("n=true", "n", "expected int"),
    ("x=abc", "x", "expected float"),
    ("flag=yes", "flag", "expected bool, got 'yes'"),
    ("flag=2", "flag", "expected bool"),
    ("maybe=abc", "maybe", "expected int or None"),
    ("ids=3", "ids", "expected a list of int"),
    ("ids=[1, x]", "ids[1]", "expected int, got str 'x'"),
    ("pair=[1]", "pair", "expected a list of 2 (int, str)"),
    ("kind=c", "kind", "expected one of 'a', 'b'"),
    ("table=[1]", "table", "expected a mapping of float"),
    ("middle=3", "middle", "expected a mapping (section Middle)"),
    ("middle.inner.foo.bar=1", "middle.inner.foo.bar", "'middle.inner.foo' holds int, not a section"),
    ("ids=[1, 2", "ids", "cannot parse"),
])
def test_cli_type_errors_name_the_key_and_the_type(override, key, expected):
    e = error(load_config, Toy, overrides=[override])
    assert e.key == key and expected in e.message, str(e)
    assert str(e).startswith(f"config key '{key}': ")


# ---------------------------------------------------------------------------------------
# YAML type errors, unknown keys, __post_init__
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("data,key,expected", [
    ({"n": "3"}, "n", "expected int, got str '3'"),
    ({"n": True}, "n", "expected int, got bool"),  # bool is an int in Python, not here
    ({"n": 2.0}, "n", "expected int, got float"),
    ({"x": True}, "x", "expected float, got bool"),
    ({"x": "1e-6"}, "x", "expected float, got str"),
    ({"flag": 1}, "flag", "expected bool, got int"),
    ({"name": 5}, "name", "expected str, got int"),
    ({"ids": 5}, "ids", "expected a list of int"),
    ({"weights": [1, "a"]}, "weights[1]", "expected float, got str 'a'"),
    ({"middle": 3}, "middle", "expected a mapping (section Middle), got int 3"),
    ({"middle": {"inner": {"rate": "high"}}}, "middle.inner.rate", "expected float"),
    ({"opt_section": {"rate": "high"}}, "opt_section.rate", "expected float"),
])
def test_yaml_type_errors(data, key, expected):
    e = error(from_dict, Toy, data)
    assert e.key == key and expected in e.message, str(e)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "+Infinity", "1e999"])
def test_non_finite_floats_from_the_command_line_are_refused(text):
    e = error(load_config, Toy, overrides=[f"x={text}"])
    assert e.key == "x" and "must be a finite number" in e.message, str(e)
    assert error(load_config, Toy, overrides=[f"weights=[1, {text}]"]).key == "weights[1]"  # YAML flow: a string
    e = error(load_config, Toy, overrides=["weights=[1, .inf]"])
    assert e.key == "weights[1]" and "finite" in e.message, str(e)
    e = error(load_config, Toy, overrides=[f"middle.inner.rate={text}"])
    assert e.key == "middle.inner.rate" and "finite" in e.message, str(e)


@pytest.mark.parametrize("text", [".nan", ".NaN", ".inf", "-.inf", "+.INF", "1e999"])
def test_non_finite_floats_from_yaml_are_refused(tmp_path, text):
    e = error(load_config, Toy, write(tmp_path, f"x: {text}\n"))
    assert e.key == "x" and "must be a finite number" in e.message, str(e)
    e = error(load_config, Toy, write(tmp_path, f"table: {{a: {text}}}\n"))
    assert e.key == "table.a" and "finite" in e.message, str(e)
    assert error(from_dict, Toy, {"x": float(text.replace(".", "").replace("NaN", "nan").replace("INF", "inf"))}
                 ).key == "x"


def test_unknown_keys_name_the_full_path_and_list_valid_keys(tmp_path):
    e = error(load_config, Toy, overrides=["middle.inner.bar=1"])
    assert e.key == "middle.inner.bar"
    assert str(e) == "config key 'middle.inner.bar': unknown key; valid keys under 'middle.inner': foo, rate"
    e = error(load_config, Toy, write(tmp_path, "middle:\n  inner:\n    bar: 1\n    baz: 2\n"))
    assert e.key == "middle.inner.bar" and "(also unknown: baz)" in e.message
    e = error(load_config, Toy, write(tmp_path, "nn: 1\n"))
    assert e.key == "nn" and "valid keys of Toy: n, x, flag, name, maybe" in e.message
    e = error(load_config, Toy, write(tmp_path, "opt_section: {fo: 1}\n"))
    assert e.key == "opt_section.fo"


def test_post_init_errors_are_prefixed_with_the_section_path():
    e = error(load_config, Toy, overrides=["middle.inner.rate=2"])
    assert e.key == "middle.inner.rate" and e.message == "must be <= 1, got 2.0"
    e = error(load_config, Toy, overrides=["n=13"])
    assert str(e) == "config key 'n': 13 is unlucky"


def test_required_fields_and_non_dataclasses():
    @dataclass(frozen=True)
    class Needs:
        path: str
        n: int = 1

    assert from_dict(Needs, {"path": "p"}) == Needs("p")
    assert error(from_dict, Needs, {"n": 2}).key == "path"
    with pytest.raises(TypeError, match="not a dataclass"):
        from_dict(dict, {})


# ---------------------------------------------------------------------------------------
# override syntax and files
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,expected", [
    (["n"], "must look like section.key=value"),
    (["=3"], "must look like section.key=value"),
    (["middle..name=x"], "must look like section.key=value"),
    (["middle=1", "middle.name=x"], "set as a value by one override and as a section"),
    (["middle.name=x", "middle=1"], "set as a section by one override and as a value"),
])
def test_bad_override_syntax(overrides, expected):
    assert expected in str(error(parse_overrides, overrides))


def test_parse_overrides_builds_a_tree_of_raw_strings():
    assert parse_overrides(["a.b=1", "a.c.d=x y", "e=[1, 2]"]) == {"a": {"b": "1", "c": {"d": "x y"}}, "e": "[1, 2]"}


def test_bad_files(tmp_path):
    assert "cannot read config file" in str(error(load_config, Toy, tmp_path / "missing.yaml"))
    assert "must hold a mapping, got list" in str(error(load_config, Toy, write(tmp_path, "- 1\n- 2\n")))
    assert "cannot parse config file" in str(error(load_config, Toy, write(tmp_path, "n: [1\n")))


# ---------------------------------------------------------------------------------------
# frozen, to_dict / from_dict
# ---------------------------------------------------------------------------------------


def test_configs_are_frozen_at_every_level():
    cfg = load_config(Toy, overrides=["n=4"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.middle.inner.foo = 5
    assert dataclasses.replace(cfg, n=5).n == 5 and cfg.n == 4


def test_to_dict_from_dict_round_trip(tmp_path):
    cfg = Toy(n=5, x=0.25, flag=True, name="r", maybe=2, maybe_path="p", ids=(4, 5), weights=[0.5],
              pair=(1, "q"), kind="b", table={"k": 1.5}, middle=Middle(Inner(3, 0.75), "mm"), opt_section=Inner(9))
    d = to_dict(cfg)
    assert d["ids"] == [4, 5] and d["pair"] == [1, "q"] and d["middle"] == {"inner": {"foo": 3, "rate": 0.75},
                                                                            "name": "mm"}
    assert d["opt_section"] == {"foo": 9, "rate": 0.5} and to_dict(Toy())["opt_section"] is None
    assert from_dict(Toy, d) == cfg
    # through a YAML file too
    assert yaml.safe_load(to_yaml(cfg)) == d
    assert load_config(Toy, write(tmp_path, to_yaml(cfg))) == cfg
