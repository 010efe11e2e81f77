"""The settings machinery every server shares: flag over variable, value checks, the parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.settings import (
    HOST,
    LOG_LEVEL,
    OWNER_PUBLIC_KEY,
    ConfigError,
    Given,
    Option,
    add_options,
    new_parser,
    parse_bool,
    parse_image_map,
    parse_number,
    parse_seconds,
    parse_whole,
    split_list,
)

PORT = Option("--port", "TMI_PORT", "port")
OPTIONS = (OWNER_PUBLIC_KEY, HOST, PORT, LOG_LEVEL, Option("--kubeconfig", "TMI_KUBECONFIG", ""))


def _given(argv: list[str], env: dict[str, str]) -> Given:
    parser = new_parser("tmi-test", "a test server")
    parser.add_argument("--enabled", action="store_true", default=None)
    add_options(parser, OPTIONS)
    return Given.parse(parser, OPTIONS, argv, env)


def test_a_flag_wins_over_its_variable_and_an_empty_variable_is_absent() -> None:
    given = _given(["--host", "flag"], {"TMI_HOST": "env", "TMI_PORT": ""})
    assert given.get("--host") == "flag"
    assert given.get("--port") is None
    assert _given([], {"TMI_HOST": "env"}).get("--host") == "env"


def test_a_repeated_flag_accumulates_and_splits_with_its_variable_form() -> None:
    given = _given(["--owner-public-key", "k1, k2", "--owner-public-key", "k3"], {})
    assert split_list(given.get("--owner-public-key") or "") == ("k1", "k2", "k3")
    env = _given([], {"TMI_OWNER_PUBLIC_KEY": "k1,,k2 ,"})
    assert split_list(env.get("--owner-public-key") or "") == ("k1", "k2")


@pytest.mark.parametrize(
    ("argv", "env", "default", "expected"),
    [
        (["--enabled"], {"TMI_ENABLED": "false"}, False, True),
        ([], {"TMI_ENABLED": "Yes"}, False, True),
        ([], {"TMI_ENABLED": "off"}, True, False),
        ([], {}, True, True),
        ([], {"TMI_ENABLED": "  "}, True, True),
        ([], {"TMI_ENABLED": ""}, False, False),
    ],
)
def test_a_switch_falls_back_to_its_variable_then_its_default(
    argv: list[str], env: dict[str, str], default: bool, expected: bool
) -> None:
    assert _given(argv, env).switch("enabled", "TMI_ENABLED", default) is expected


def test_numbers_fall_back_to_defaults_and_are_checked() -> None:
    given = _given(["--port", "9443"], {})
    assert given.whole("--port", 8443, 1, 65535) == 9443
    assert _given([], {}).whole("--port", 8443, 1, 65535) == 8443
    assert _given([], {}).seconds("--port", 2.5) == 2.5
    assert _given([], {"TMI_PORT": "0.5"}).number("--port", 1.0, 0.1, 2) == 0.5
    with pytest.raises(ConfigError, match=r"--port: 70000 is outside 1\.\.65535"):
        _given(["--port", "70000"], {}).whole("--port", 8443, 1, 65535)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_bool("maybe", "TMI_X"), "TMI_X: 'maybe' is not true or false"),
        (lambda: parse_whole("1.5", "--n", 0, 9), "--n: '1.5' is not a whole number"),
        (lambda: parse_whole("10", "--n", 0, 9), "--n: 10 is outside 0..9"),
        (lambda: parse_seconds("soon", "--s"), "--s: 'soon' is not a number"),
        (lambda: parse_seconds("86400", "--s"), "--s: 86400.0 is outside 0..86400 seconds"),
        (lambda: parse_seconds("-1", "--s"), "is outside 0..86400 seconds"),
        (lambda: parse_number("x", "--f", 0.1, 600), "--f: 'x' is not a number"),
        (lambda: parse_number("700", "--f", 0.1, 600), "--f: 700.0 is outside 0.1..600"),
    ],
)
def test_unusable_values_name_where_they_came_from(call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(ConfigError) as caught:
        call()
    assert message in str(caught.value)


def test_booleans_read_the_usual_spellings() -> None:
    assert [parse_bool(t, "x") for t in ("1", "TRUE", " on ", "yes")] == [True] * 4
    assert [parse_bool(t, "x") for t in ("0", "False", "off", "no", "")] == [False] * 5


def test_image_map_inline_or_from_a_file(tmp_path: Path) -> None:
    assert parse_image_map('{"a": "b"}') == {"a": "b"}
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"c": "d"}))
    assert parse_image_map(str(path)) == {"c": "d"}
    with pytest.raises(ConfigError, match="--engine-image-map: the engine image map must be"):
        parse_image_map('{"a": 1}')
    with pytest.raises(ConfigError, match=r"^--engine-image-map: must be a JSON object of image"):
        parse_image_map("[1]", expected="must be a JSON object of image references")
    with pytest.raises(ConfigError, match=r"TMI_MAP: .*inline JSON"):
        parse_image_map("{not json", where="TMI_MAP")
    with pytest.raises(ConfigError, match="cannot read engine image map"):
        parse_image_map(str(tmp_path / "missing.json"))


def test_kubeconfig_and_log_level() -> None:
    assert _given([], {"KUBECONFIG": "/kc"}).kubeconfig() == "/kc"
    assert _given(["--kubeconfig", "/flag"], {"KUBECONFIG": "/kc"}).kubeconfig() == "/flag"
    assert _given([], {}).kubeconfig() is None
    assert _given(["--log-level", "debug"], {}).log_level() == "DEBUG"
    assert _given([], {}).log_level() == "INFO"
    with pytest.raises(ConfigError, match="--log-level: 'LOUD' is not DEBUG"):
        _given([], {"TMI_LOG_LEVEL": "loud"}).log_level()


def test_the_parser_refuses_like_a_setting_and_names_each_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = new_parser("tmi-test", "a test server")
    add_options(parser, OPTIONS)
    assert "[TMI_HOST]" in parser.format_help()
    assert "environment variable in brackets" in parser.format_help()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tmi-test")
    assert "error: unrecognized arguments: --bogus" in err
