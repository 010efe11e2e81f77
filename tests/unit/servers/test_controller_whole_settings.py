"""The controller's whole-number settings refuse fractions instead of truncating them.

Found by the settings fuzz target (`tests/fuzz`): `--minimum-bundle-version 2.9` was read as a
floor of 2, quietly accepting the profile revision the owner meant to retire, and `--port 1.5`
and `--workers 2.5` were cut down the same way. The webhook and the extender already refused
them; the controller now reads them the same way.
"""

from __future__ import annotations

import pytest

from allocation_controller.config import settings_from_args
from serving.settings import ConfigError

ENV = {
    "TMI_NAMESPACE": "kamiwaza",
    "TMI_OWNER_PUBLIC_KEY": "A" * 43 + "=",
    "TMI_CLUSTER_BINDING_ID": "demo-cluster",
    "TMI_IDENTITY": "me",
}


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--minimum-bundle-version", "2.9"),
        ("--port", "1.5"),
        ("--workers", "2.5"),
        ("--minimum-bundle-version", "1e3"),
    ],
)
def test_a_fraction_is_refused_naming_the_flag(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        settings_from_args([flag, value], ENV)


def test_whole_numbers_are_read_as_written() -> None:
    settings = settings_from_args(
        ["--minimum-bundle-version", "3", "--port", "9090", "--workers", "4"], ENV
    )
    assert settings.policy.minimum_bundle_version == 3
    assert settings.port == 9090 and settings.workers == 4
