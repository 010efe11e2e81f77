"""What an allocation class reads of a binding: the facts, not the profile's models.

The profile (`inference_policy.trust.profile`) asks each GPU binding's class what it guarantees,
so it imports this package; were the classes to import the profile's binding models back, the
two would be one knot. They read these Protocols instead, which the profile's binding models
satisfy as they are (mypy checks it wherever a binding is handed to a class), so allocation
sits below trust and a new class needs nothing of the profile but the facts listed here.
"""

from __future__ import annotations

from typing import Protocol


class AcceleratorFacts(Protocol):
    """The attested accelerator, as far as a class reads it."""

    @property
    def capability_tuple(self) -> tuple[int, int]:
        """The attested compute capability as (major, minor); (0, 0) when none is attested."""
        ...


class BindingFacts(Protocol):
    """A signed GPU binding, as far as a class reads it."""

    @property
    def id(self) -> str:
        """The binding's id, to name it in a verdict."""
        ...

    @property
    def allocation_key(self) -> str:
        """What tells the binding's class apart among its allocator's: the resource name, or
        a DRA binding's device type."""
        ...

    @property
    def capacity_memory(self) -> str:
        """The usable memory per device the binding attests, as the profile writes it."""
        ...

    @property
    def usable_memory_bytes(self) -> int:
        """`capacity_memory` in bytes."""
        ...

    @property
    def accelerator(self) -> AcceleratorFacts: ...


__all__ = ["AcceleratorFacts", "BindingFacts"]
