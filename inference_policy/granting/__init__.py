"""Granting: is a bound engine Pod running exactly the grant its plan names, and may the owner's
side still vouch for it.

The AllocationVerified verdict (`grant`) over the Pod as the API server stored it (read through
`base.pod_view`; `stored_pod`: what the verdict makes of its fields, `kept_pod`: what the
controller keeps of a Pod) and every way it differs from its
plan (`grant_findings`); a DRA Pod's allocation against its binding (`dra_allocation`); tenants
kept apart on a shared GPU (`grant_tenants`); the rights the controller needs for its verdicts to
mean anything (`owner_rights`); and what a Pod asks the extender to place once its grant is
checked (`pod_demand`).

May import: admission, placing, planning, trust, allocation and the base. Only the owner tools
and `inference_policy.evidence` sit above it.
"""
