"""What every test shares: the root logger is left as the test found it.

The servers' entry points (`serving.process.main`) install their own root handler on standard
error, which under pytest is a capture file closed when the test ends; kept, that handler would
make every later log record a "Logging error" and drop pytest's own capture of logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
