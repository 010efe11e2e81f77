"""Every owner admission policy's CEL as the one document the chart's template renders.

`make chart` writes it to `charts/tmi/files/admission-policies.yaml`; each part is generated in
the module of its rule (the shield, the guard, claims, the verdict, status, owner objects).
"""

from __future__ import annotations

from typing import Any

from inference_policy.admission.access_cel import guard_validations, guard_variables
from inference_policy.admission.dra_cel import claim_policy_parts
from inference_policy.admission.owner_objects_cel import owner_objects_parts
from inference_policy.admission.shield_cel import has_unshielded, not_an_engine_pod, shield_mutation
from inference_policy.admission.status_cel import status_parts
from inference_policy.admission.verdict_cel import verdict_parts


def policy_parts() -> dict[str, Any]:
    """What the chart's admission-policies template takes from the core, as one document."""
    return {
        "shield": {
            "matchConditions": [
                {"name": "not-an-engine-pod", "expression": not_an_engine_pod()},
                {"name": "has-a-container-to-shield", "expression": has_unshielded()},
            ],
            "expression": shield_mutation(),
        },
        "guard": {"variables": guard_variables(), "validations": guard_validations()},
        "claims": claim_policy_parts(),
        "verdict": verdict_parts(),
        "status": status_parts(),
        "ownerObjects": owner_objects_parts(),
    }


__all__ = ["policy_parts"]
