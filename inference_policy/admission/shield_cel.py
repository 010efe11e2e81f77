"""The shield policy's CEL: `NVIDIA_VISIBLE_DEVICES=void` on every container of a Pod that is
not an engine Pod.

The MutatingAdmissionPolicy sets it on CREATE on every container and on UPDATE on the ephemeral
ones (the only kind an UPDATE can add), so a CUDA image's own `NVIDIA_VISIBLE_DEVICES=all` asks
the NVIDIA runtime for nothing; the guard (`inference_policy.admission.access_cel`) then refuses any
container without a grant that does not carry it, whatever a later mutation did.
"""

from __future__ import annotations

from inference_policy.admission.access_cel import cel_unshielded
from inference_policy.base.access import CONTAINER_LISTS, NO_DEVICE, NVIDIA_DEVICE_ENV
from inference_policy.base.cel_text import cel_string
from inference_policy.base.wire import ENGINE_LABEL


def not_an_engine_pod() -> str:
    """Engine Pods are the tenant webhook's to plan and shield; the policy checks them after."""
    label = cel_string(ENGINE_LABEL)
    return f"!has(object.metadata.labels) || !({label} in object.metadata.labels)"


def has_unshielded() -> str:
    """The shield policy's matchCondition: a container it has something to do for."""
    return (
        "(request.operation == 'CREATE' && (\n"
        + cel_unshielded(CONTAINER_LISTS)
        + ")) ||\n"
        + cel_unshielded(("ephemeralContainers",))
    )


def shield_mutation() -> str:
    """The apply configuration that adds `NVIDIA_VISIBLE_DEVICES=void` to each container that
    does not set the variable. Server-side apply merges containers and their env by name, so
    nothing else of the Pod is touched; a value already set is left for the guard to judge."""
    name = cel_string(NVIDIA_DEVICE_ENV)
    fields = []
    for kind in CONTAINER_LISTS:
        missing = f"!has(c.env) || !c.env.exists(e, e.name == {name})"
        when = f"has(object.spec.{kind}) && object.spec.{kind}.exists(c, {missing})"
        if kind != "ephemeralContainers":
            when = f"request.operation == 'CREATE' && {when}"
        item = (
            f"Object.spec.{kind}{{name: c.name, env: [Object.spec.{kind}.env{{"
            f"name: {name}, value: {cel_string(NO_DEVICE)}}}]}}"
        )
        fields.append(
            f"  ?{kind}: {when}\n"
            f"    ? optional.of(object.spec.{kind}.filter(c, {missing}).map(c,\n"
            f"        {item}))\n"
            "    : optional.none()"
        )
    return "Object{spec: Object.spec{\n" + ",\n".join(fields) + "\n}}"


__all__ = ["has_unshielded", "not_an_engine_pod", "shield_mutation"]
