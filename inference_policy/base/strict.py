"""The one strict base every wire model of tmi is parsed with.

Everything tmi decodes from outside (a deployment request, a signed profile, a plan annotation,
a recipe catalog, the room figures, a server's tenant settings) is read the same way: an unknown
key is refused, no value is coerced from another type, nothing parsed is changed afterwards, no
infinity or NaN is a number, and an error names the field and the rule but never echoes the
value it refused (a tenant's input can be large, or a secret the tenant did not mean to show).
Models that read only the keys they name and ignore the rest (a model's configuration, whose
other keys are the engine's) say so with `extra="ignore"` on their own config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A wire model: strict, frozen, closed to unknown keys, quiet about refused values."""

    # Written out here, not through a constant: the type checker's pydantic plugin reads a
    # literal config, and then refuses an assignment to a frozen model's field.
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, allow_inf_nan=False, hide_input_in_errors=True
    )


STRICT = Strict.model_config


__all__ = ["STRICT", "Strict"]
