"""The names the tenant-input inventory's rows (`inference_policy.tools.tenant_inputs`) are written
with: the owner parts that read an input, the end-to-end tests that prove its treatment, and the
phrases several rows share, each spelled once.
"""

from __future__ import annotations

Row = tuple[str, tuple[str, ...], str, tuple[str, ...], str, str, tuple[str, ...]]

NEXT_ISSUE = "open: Tenants kept apart (next issue)"
SCHEDULER = "kube-scheduler"
APISERVER = "kube-apiserver"
GUARD = "inference_policy/admission/access_cel.py:guard_variables"
GUARD_RULES = "inference_policy/admission/access_cel.py:guard_validations"
SHIELD = "inference_policy/admission/shield_cel.py:shield_mutation"
STATUS = "inference_policy/admission/status_cel.py:status_variables"
VERDICT = "inference_policy/admission/verdict_cel.py:verdict_variables"
REACHES = "inference_policy/base/access.py:reaches"
GATE = "inference_policy/admission/device_gate.py:device_gate"
FINDINGS = "inference_policy/granting/grant_findings.py:pod_findings"
DEMAND = "inference_policy/granting/pod_demand.py:pod_demand"
REQUESTS = "inference_policy/placing/ledger.py:pod_requests"
ACCOUNTED = "inference_policy/placing/ledger.py:accounted_pod"
HOLDING = "inference_policy/placing/ledger.py:holding_part"
RECONCILE = "allocation_controller/reconciler.py:Reconciler.reconcile"
ON_POD = "allocation_controller/controller.py:Controller._on_pod"
ENGINE_NAME = "inference_policy/admission/engine_pod.py:engine_container_name"
CONDITION = "inference_policy/base/pod_view.py:PodView.condition"

E2E = "tests/e2e/"
MINE = E2E + "deny/test_tenant_inputs.py::"
OPEN = E2E + "deny/test_tenant_inputs_open.py::"
DENY = E2E + "deny/test_default_deny.py::"
POLICIES = E2E + "admission/test_admission_policies.py::"
PLACEMENT = E2E + "scheduling/test_placement.py::"
VERIFIED = E2E + "verdict/test_allocation_verified.py::"
DRA = E2E + "scheduling/test_dra.py::"
FAULTS = E2E + "verdict/test_faults.py::"
REVISION = E2E + "verdict/test_profile_revision.py::"
LIFECYCLE = E2E + "admission/test_admission_lifecycle.py::"
JUNK = E2E + "deny/test_tenant_junk.py::"
SPILL = E2E + "scheduling/test_spill.py::"
OWNER_RIGHTS = E2E + "deny/test_owner_rights.py::"
STATUS_TEST = DENY + "test_status_writes_are_refused_but_for_the_tenants_own_conditions"
NEVER_READ_TEST = MINE + "test_what_no_owner_part_reads_moves_no_verdict"
CONSTRAINTS_TEST = OPEN + "test_tolerations_and_constraints_within_the_namespace_leave_the_grant"
STEERING = (
    E2E + "tenants/test_two_tenants.py::test_no_tenant_steers_the_scheduler_against_the_other"
)
NOT_ITS_PLAN = MINE + "test_an_engine_pod_that_is_not_its_plan_is_placed_nowhere"
REPLACED = PLACEMENT + "test_a_replaced_webhook_granting_eight_gpus_gets_no_pod_bound"
FORGERIES = POLICIES + "test_forgeries_are_refused_by_the_guard"
CLAIMS_TEST = DRA + "test_the_tenant_can_make_no_claim_that_widens_the_grant"
STATUS_POLICY = (
    "kamiwaza-tmi-status refuses every PodStatus field (`status_cel.STATUS_FIELDS`) and every "
    "condition but those of the tenant's own domain to all but the kubelet, the schedulers, "
    "kube-controller-manager's controllers and the writers the owner lists"
)


def row(
    kind: str,
    paths: tuple[str, ...],
    writer: str,
    readers: tuple[str, ...],
    treatment: str,
    how: str,
    tests: tuple[str, ...],
) -> Row:
    """One row: the object, its paths, who may write it, who reads it (`file:function`, or the
    Kubernetes component), the treatment, how, and the end-to-end tests acting as the tenant's
    namespace admin."""
    return (kind, paths, writer, readers, treatment, how, tests)
