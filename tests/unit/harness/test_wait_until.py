"""`localcluster.wait_until` says what "done" is: the first truthy answer of its probe, so a
list that is still empty (a Pod a controller has not made yet) is "not yet", never an answer
a caller then fails to unpack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.plane.process import ComponentError, wait_until


def _answers(*values: object) -> Iterator[object]:
    yield from values
    while True:
        yield values[-1]


@pytest.mark.parametrize("not_yet", [None, False, [], {}, "", 0])
def test_an_empty_or_false_answer_is_not_yet(not_yet: object) -> None:
    answers = _answers(not_yet, not_yet, ["pod"])
    assert wait_until(lambda: next(answers), timeout=5, what="x", interval=0) == ["pod"]


def test_a_probe_that_never_answers_times_out_naming_what_was_awaited() -> None:
    with pytest.raises(ComponentError, match="timed out after 0s waiting for the Pod"):
        wait_until(lambda: [], timeout=0, what="the Pod", interval=0)


def test_an_exception_is_not_yet_and_is_named_on_timeout() -> None:
    def probe() -> list[str]:
        raise ConnectionRefusedError("not listening")

    with pytest.raises(ComponentError, match="ConnectionRefusedError"):
        wait_until(probe, timeout=0, what="the server", interval=0)
