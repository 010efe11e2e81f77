"""Connection limits: the same four settings in both HTTPS servers, by flag or `TMI_*` variable,
with defaults that bound a slow caller and bounds a server can live with."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from extender.config import settings_from_args as extender_settings
from serving.settings import ConfigError, ConnectionLimits
from webhook.config import settings_from_args as webhook_settings

KEY = "A" * 43 + "="
WEBHOOK_ENV = {"TMI_NAMESPACE": "kamiwaza", "TMI_TLS_CERT": "c.pem", "TMI_TLS_KEY": "k.pem"}
EXTENDER_ENV = {
    **WEBHOOK_ENV,
    "TMI_OWNER_PUBLIC_KEY": KEY,
    "TMI_CLUSTER_BINDING_ID": "demo-cluster",
}
Parse = Callable[[Sequence[str], Mapping[str, str]], Any]
SERVERS: list[tuple[Parse, dict[str, str]]] = [
    (webhook_settings, WEBHOOK_ENV),
    (extender_settings, EXTENDER_ENV),
]


@pytest.mark.parametrize(("parse", "env"), SERVERS)
def test_defaults_bound_every_slow_caller(parse: Parse, env: dict[str, str]) -> None:
    limits = parse([], env).limits
    assert limits == ConnectionLimits()
    # Each below what asyncio and aiohttp would otherwise give: 60 s for a handshake, an hour
    # for a connection that never sends a request, no limit on a body's arrival.
    assert limits.read_timeout == 10 and limits.tls_handshake_timeout == 10
    assert limits.idle_timeout == 120 and limits.max_header_bytes == 8190


@pytest.mark.parametrize(("parse", "env"), SERVERS)
def test_variables_and_flags_set_them_and_a_flag_wins(parse: Parse, env: dict[str, str]) -> None:
    variables = {
        **env,
        "TMI_READ_TIMEOUT": "2.5",
        "TMI_IDLE_TIMEOUT": "30",
        "TMI_TLS_HANDSHAKE_TIMEOUT": "3",
        "TMI_MAX_HEADER_BYTES": "16384",
    }
    limits = parse([], variables).limits
    assert (limits.read_timeout, limits.idle_timeout) == (2.5, 30)
    assert (limits.tls_handshake_timeout, limits.max_header_bytes) == (3, 16384)
    flagged = parse(["--read-timeout", "4", "--max-header-bytes", "2048"], variables).limits
    assert flagged.read_timeout == 4 and flagged.max_header_bytes == 2048
    assert flagged.idle_timeout == 30


@pytest.mark.parametrize(("parse", "env"), SERVERS)
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TMI_READ_TIMEOUT", "0"),
        ("TMI_READ_TIMEOUT", "nan"),
        ("TMI_IDLE_TIMEOUT", "-1"),
        ("TMI_TLS_HANDSHAKE_TIMEOUT", "inf"),
        ("TMI_MAX_HEADER_BYTES", "100"),
        ("TMI_MAX_HEADER_BYTES", "8k"),
    ],
)
def test_unusable_limits_are_refused_naming_the_flag(
    parse: Parse, env: dict[str, str], variable: str, value: str
) -> None:
    flag = "--" + variable.removeprefix("TMI_").lower().replace("_", "-")
    with pytest.raises(ConfigError, match=flag):
        parse([], {**env, variable: value})


def test_the_handler_options_carry_each_limit_to_aiohttp() -> None:
    limits = ConnectionLimits(idle_timeout=7, max_header_bytes=2048, linger_seconds=0.5)
    assert limits.handler_options() == {
        "keepalive_timeout": 7,
        "max_line_size": 2048,
        "max_field_size": 2048,
        "max_headers": 128,
        "lingering_time": 0.5,
    }
