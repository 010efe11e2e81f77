"""Admission: what an engine Pod may be when it is created or changed, and the owner's admission
policies' CEL that the API server evaluates itself.

What a planned engine Pod looks like and what may change on it once admitted (`engine_pod`),
the admission of an engine Pod decided in one place (`engine_admission`), whether a Pod may hold
a device at all whatever its plan says (`device_gate`), and the CEL of the owner's policies,
each generated in the module of its rule: the access guard (`access_cel`), the shield
(`shield_cel`), who may write Pod status (`status_cel`) and the verdict (`verdict_cel`), the
owner's objects in a tenant namespace (`owner_objects_cel`), the DRA claims guard (`dra_cel`),
and all of them as the one document the chart renders (`policy_cel`).

May import: planning, trust, allocation and the base. Placing is its independent sibling:
neither imports the other. Granting and the tools import it.
"""
