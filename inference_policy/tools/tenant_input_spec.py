"""The tenant-input inventory's rows for the rest of a Pod's spec and for its status
(`inference_policy.tools.tenant_inputs` says what a row is and how the rows are held true).
"""

from __future__ import annotations

from inference_policy.tools.tenant_input_names import (
    ACCOUNTED,
    APISERVER,
    CLAIMS_TEST,
    CONDITION,
    CONSTRAINTS_TEST,
    DRA,
    E2E,
    FINDINGS,
    FORGERIES,
    GUARD,
    GUARD_RULES,
    HOLDING,
    MINE,
    NEVER_READ_TEST,
    NEXT_ISSUE,
    NOT_ITS_PLAN,
    ON_POD,
    POLICIES,
    REACHES,
    RECONCILE,
    SCHEDULER,
    STATUS,
    STATUS_POLICY,
    STATUS_TEST,
    STEERING,
    VERDICT,
    VERIFIED,
    Row,
    row,
)

SPEC_ROWS: tuple[Row, ...] = (
    row(
        "Pod",
        ("spec.resourceClaims",),
        "the tenant's webhook at create, on an engine Pod of a DRA plan",
        (FINDINGS, GUARD_RULES),
        "checked",
        "an engine Pod's claims are its plan's, from the owner's templates: kamiwaza-tmi-guard "
        "refuses a claim by name or from another template, and the controller compares them to "
        "the plan",
        (CLAIMS_TEST,),
    ),
    row(
        "Pod",
        ("spec.resourceClaims",),
        "the tenant, on any other Pod",
        (REACHES, GUARD),
        "refused",
        "kamiwaza-tmi-guard refuses a claim outside a plan",
        (FORGERIES,),
    ),
    row(
        "Pod",
        ("spec.runtimeClassName",),
        "the tenant's webhook at create, on an engine Pod",
        (FINDINGS, GUARD),
        "checked",
        "must be the plan's RuntimeClass, or the extender passes no node and the controller "
        "writes `RuntimeClassMismatch`",
        (NOT_ITS_PLAN,),
    ),
    row(
        "Pod",
        ("spec.runtimeClassName",),
        "the tenant, on any other Pod",
        (REACHES, GUARD),
        "refused",
        "kamiwaza-tmi-guard refuses a RuntimeClass outside a plan",
        (FORGERIES,),
    ),
    row(
        "Pod",
        ("spec.nodeSelector[kubernetes.io/arch]",),
        "the tenant's webhook at create",
        (FINDINGS,),
        "checked",
        "must be the plan's architecture, or the extender passes no node and the controller "
        "writes `NodeSelectorMismatch`",
        (NOT_ITS_PLAN,),
    ),
    row(
        "Pod",
        ("spec.nodeSelector[<other>]",),
        "the tenant",
        (SCHEDULER,),
        "never read",
        "not read by the extender or the controller; kube-scheduler honours them, so they only "
        "narrow the nodes the extender judges",
        (CONSTRAINTS_TEST,),
    ),
    row(
        "Pod",
        ("spec.schedulerName",),
        "the tenant",
        (GUARD_RULES, SCHEDULER),
        "refused",
        "an engine Pod holding a grant is scheduled by the owner's scheduler (TenantAdmission "
        "`schedulerName`) or refused by kamiwaza-tmi-guard, so the extender checks its grant "
        "before it is bound",
        (POLICIES + "test_a_webhook_that_names_another_scheduler_gets_no_pod",),
    ),
    row(
        "Pod",
        ("spec.nodeName",),
        "the owner's scheduler, by its binding (the `admin` role holds no pods/binding; the "
        "tenant's own value is refused)",
        (
            ACCOUNTED,
            HOLDING,
            "inference_policy/base/pod_view.py:PodView.node_name",
            ON_POD,
            GUARD_RULES,
        ),
        "refused",
        "kamiwaza-tmi-guard refuses any Pod that names its node (a kubelet's mirror Pod "
        "excepted), and RBAC refuses the tenant a Binding, so only a scheduler binds a Pod, and "
        "an engine Pod only the owner's, after the extender's check",
        (
            POLICIES + "test_a_webhook_that_plans_nothing_grants_nothing_the_guard_can_see",
            STEERING,
            MINE + "test_the_namespace_admin_can_neither_bind_a_pod_nor_label_its_namespace",
        ),
    ),
    row(
        "Pod",
        ("spec.priorityClassName", "spec.priority", "spec.preemptionPolicy"),
        "the tenant (the API server fills the last two from the class)",
        (GUARD_RULES, SCHEDULER),
        "refused",
        "kamiwaza-tmi-guard admits only the PriorityClasses the owner lists for the tenant "
        "(TenantAdmission `priorityClasses`, the cluster's global default among them), so no "
        "tenant Pod preempts another tenant's by a system class; kube-apiserver's Priority "
        "admission refuses a priority or preemption policy that is not its class's",
        (STEERING,),
    ),
    row(
        "Pod",
        ("spec.affinity",),
        "the tenant",
        (SCHEDULER,),
        "refused",
        "a pod affinity or anti-affinity term that reaches past the Pod's namespace is refused "
        "by kube-apiserver's quota admission (the owner's ResourceQuota "
        "`tmi-no-cross-namespace-affinity`: `CrossNamespacePodAffinity`, no Pods), kept by "
        "kamiwaza-tmi-owner-objects; what is left (node affinity, terms within the namespace) "
        "only narrows where the tenant's own Pods go; not read by the extender",
        (STEERING,),
    ),
    row(
        "Pod",
        ("spec.topologySpreadConstraints",),
        "the tenant",
        (SCHEDULER,),
        "never read",
        "not read by the extender or the controller; kube-scheduler counts only Pods of the "
        "Pod's own namespace for it, so it moves only the tenant's own Pods",
        (CONSTRAINTS_TEST,),
    ),
    row(
        "Pod",
        ("spec.tolerations",),
        "the tenant",
        (SCHEDULER,),
        "open",
        NEXT_ISSUE
        + (
            ": a Pod may tolerate every taint, the owner's on GPU nodes included, and land "
            "there as far as kube-scheduler's fit allows, holding no device (shielded, any "
            "reach refused); not read by the extender"
        ),
        (CONSTRAINTS_TEST,),
    ),
    row(
        "Pod",
        ("spec.schedulingGates",),
        "the tenant",
        (SCHEDULER,),
        "never read",
        "kube-scheduler holds a gated Pod; the controller's `SchedulingTimeout` then says so "
        "from `PodScheduled`",
        (NEVER_READ_TEST,),
    ),
    row(
        "Pod",
        ("spec.readinessGates",),
        "the tenant's webhook at create",
        (),
        "never read",
        "the webhook adds `kamiwaza.ai/AllocationVerified`; no policy requires it, so an engine "
        "Pod whose (replaced) webhook leaves it out is Ready before its verdict, though it was "
        "placed only after the extender's grant check",
        (
            E2E
            + "admission/test_webhook.py::test_planned_pod_is_not_ready_until_allocation_verified",
        ),
    ),
    row(
        "Pod",
        (
            "spec.securityContext",
            "spec.containers[].securityContext",
            "spec.initContainers[].securityContext",
            "spec.ephemeralContainers[].securityContext",
            "spec.hostNetwork",
            "spec.hostPID",
            "spec.hostIPC",
            "spec.volumes[].hostPath",
        ),
        "the tenant",
        (APISERVER,),
        "refused",
        "kamiwaza-tenant-pod-guard (seed 001's Pod Security baseline guard, `manifests/guard`) "
        "refuses privileged containers, host namespaces, hostPath volumes and capabilities "
        "beyond baseline; no tmi part reads them",
        (
            E2E + "admission/test_pod_guard.py::test_privileged_pod_refused",
            E2E + "admission/test_pod_guard.py::test_host_path_refused",
            E2E + "admission/test_pod_guard.py::test_host_pid_refused",
        ),
    ),
    row(
        "Pod",
        (
            "spec.volumes",
            "spec.containers[].command",
            "spec.initContainers[].command",
            "spec.ephemeralContainers[].command",
            "spec.containers[].args",
            "spec.initContainers[].args",
            "spec.ephemeralContainers[].args",
            "spec.containers[].ports",
            "spec.initContainers[].ports",
            "spec.ephemeralContainers[].ports",
            "spec.containers[].volumeMounts",
            "spec.initContainers[].volumeMounts",
            "spec.ephemeralContainers[].volumeMounts",
            "spec.containers[].volumeDevices",
            "spec.initContainers[].volumeDevices",
            "spec.ephemeralContainers[].volumeDevices",
            "spec.containers[].livenessProbe",
            "spec.initContainers[].livenessProbe",
            "spec.ephemeralContainers[].livenessProbe",
            "spec.containers[].readinessProbe",
            "spec.initContainers[].readinessProbe",
            "spec.ephemeralContainers[].readinessProbe",
            "spec.containers[].startupProbe",
            "spec.initContainers[].startupProbe",
            "spec.ephemeralContainers[].startupProbe",
            "spec.containers[].lifecycle",
            "spec.initContainers[].lifecycle",
            "spec.ephemeralContainers[].lifecycle",
            "spec.containers[].workingDir",
            "spec.initContainers[].workingDir",
            "spec.ephemeralContainers[].workingDir",
            "spec.serviceAccountName",
            "spec.automountServiceAccountToken",
            "spec.imagePullSecrets",
            "spec.dnsPolicy",
            "spec.hostAliases",
            "spec.restartPolicy",
            "spec.terminationGracePeriodSeconds",
            "spec.activeDeadlineSeconds",
            "spec.os",
            "spec.hostUsers",
            "spec.shareProcessNamespace",
        ),
        "the tenant",
        (),
        "never read",
        "not read by any owner part",
        (NEVER_READ_TEST,),
    ),
)

STATUS_ROWS: tuple[Row, ...] = (
    row(
        "Pod",
        ("status.phase",),
        "the kubelet (the tenant's write refused)",
        (ACCOUNTED, HOLDING, RECONCILE),
        "refused",
        STATUS_POLICY
        + ("; `Succeeded` or `Failed` ends the accounting of the Pod's device and its checks"),
        (STATUS_TEST,),
    ),
    row(
        "Pod",
        ("status.conditions",),
        "the owner's allocation controller, for `kamiwaza.ai/AllocationVerified`",
        (RECONCILE, "inference_policy/granting/stored_pod.py:verified_before", CONDITION, VERDICT),
        "refused",
        "only the controller the tenant's TenantAdmission names changes it "
        "(kamiwaza-tmi-verdict; kamiwaza-tmi-status refuses the owner's domains to others); a "
        "True is kept through a lapsed revision only for a Pod that still matches its plan",
        (VERIFIED + "test_the_tenant_can_neither_forge_nor_freeze_the_verdict",),
    ),
    row(
        "Pod",
        ("status.conditions",),
        "the cluster's components, for `PodScheduled`, `Ready` and the other unqualified types",
        ("inference_policy/granting/grant.py:scheduling_verdict", CONDITION, STATUS),
        "refused",
        STATUS_POLICY + ("; the `SchedulingTimeout` verdict quotes `PodScheduled`'s message"),
        (STATUS_TEST,),
    ),
    row(
        "Pod",
        ("status.conditions",),
        "the tenant, for a type qualified by its own domain (`example.com/Ready`)",
        (CONDITION,),
        "never read",
        "the owner parts look only for their own condition and `PodScheduled`; a condition of "
        "the tenant's domain decides nothing of theirs",
        (STATUS_TEST,),
    ),
    row(
        "Pod",
        ("status.nominatedNodeName",),
        "the schedulers (the tenant's write refused)",
        (SCHEDULER,),
        "refused",
        STATUS_POLICY + ("; kube-scheduler reserves room by it"),
        (STATUS_TEST,),
    ),
    row(
        "Pod",
        (
            "status.containerStatuses",
            "status.initContainerStatuses",
            "status.ephemeralContainerStatuses",
        ),
        "the kubelet (the tenant's write refused)",
        ("inference_policy/evidence/observations.py:pod_info", STATUS),
        "refused",
        STATUS_POLICY + ("; `tmi evidence` maps running containers to their Pods by the IDs there"),
        (STATUS_TEST,),
    ),
    row(
        "Pod",
        ("status.resourceClaimStatuses", "status.extendedResourceClaimStatus"),
        "kube-controller-manager (the tenant's write refused)",
        ("inference_policy/granting/dra_allocation.py:claim_name_of", STATUS),
        "refused",
        STATUS_POLICY
        + (
            "; the controller finds the Pod's claim by the name there and checks its allocated "
            "device against the binding"
        ),
        (STATUS_TEST, DRA + "test_a_dra_engine_pod_is_allocated_a_device_of_its_binding"),
    ),
    row(
        "Pod",
        (
            "status.observedGeneration",
            "status.message",
            "status.reason",
            "status.hostIP",
            "status.hostIPs",
            "status.podIP",
            "status.podIPs",
            "status.startTime",
            "status.qosClass",
            "status.resize",
            "status.allocatedResources",
            "status.resources",
            "status.nodeAllocatableResourceClaimStatuses",
        ),
        "the kubelet (the tenant's write refused)",
        (STATUS, "inference_policy/evidence/pressure.py:classify_job_pod"),
        "refused",
        STATUS_POLICY,
        (STATUS_TEST,),
    ),
)
