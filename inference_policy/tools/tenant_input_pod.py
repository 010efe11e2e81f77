"""The tenant-input inventory's rows for a Pod's metadata and containers
(`inference_policy.tools.tenant_inputs` says what a row is and how the rows are held true).
"""

from __future__ import annotations

from inference_policy.tools.tenant_input_names import (
    APISERVER,
    CLAIMS_TEST,
    DEMAND,
    DENY,
    E2E,
    ENGINE_NAME,
    FAULTS,
    FINDINGS,
    FORGERIES,
    GATE,
    GUARD,
    GUARD_RULES,
    HOLDING,
    MINE,
    NEVER_READ_TEST,
    NEXT_ISSUE,
    NOT_ITS_PLAN,
    ON_POD,
    OPEN,
    PLACEMENT,
    POLICIES,
    REACHES,
    RECONCILE,
    REPLACED,
    REQUESTS,
    SHIELD,
    VERIFIED,
    Row,
    row,
)

METADATA_ROWS: tuple[Row, ...] = (
    row(
        "Pod",
        ("apiVersion", "kind", "metadata.name", "metadata.uid", "metadata.resourceVersion"),
        "the API server (the tenant names the Pod at create; the name is then fixed and unique "
        "in the namespace)",
        (
            HOLDING,
            "inference_policy/placing/ledger.py:pod_key",
            "extender/view.py:ClusterView.demand",
            "extender/view.py:ClusterView.observe",
            "allocation_controller/reconciler.py:Reconciler._write",
            ON_POD,
        ),
        "api server",
        "keys only: the ledger's and the controller's Pod key, the demand memo, the status "
        "patch's precondition, the Events; no decision rests on their values",
        (
            VERIFIED + "test_honest_pod_is_verified_then_ready",
            FAULTS + "test_controller_killed_between_read_and_patch_writes_the_verdict_once",
        ),
    ),
    row(
        "Pod",
        ("metadata.namespace",),
        "the API server, from the request's path (RBAC holds the tenant to its namespace)",
        (
            "extender/view.py:ClusterView.demand",
            "inference_policy/granting/pod_demand.py:outside_every_tenant",
            "inference_policy/placing/spread.py:deployment_of",
            APISERVER,
        ),
        "api server",
        "picks the tenant whose signed profile, policies and controller hold the Pod; a Pod in "
        "no tenant namespace that plans or reaches is placed nowhere; replicas are grouped "
        "within one namespace",
        (E2E + "tenants/test_two_tenants.py::test_two_tenants_share_a_node_without_over_commit",),
    ),
    row(
        "Pod",
        ("metadata.creationTimestamp",),
        "the API server (a value sent at create is replaced)",
        (
            "inference_policy/granting/stored_pod.py:created_at",
            "inference_policy/granting/grant.py:scheduling_verdict",
        ),
        "api server",
        "the plan is re-derived at it, clamped into the signed revision's window, and the "
        "scheduling deadline counts from it",
        (
            PLACEMENT
            + "test_full_cluster_leaves_the_pod_pending_with_reasons_then_reports_the_deadline",
        ),
    ),
    row(
        "Pod",
        ("metadata.deletionTimestamp",),
        "the API server, on the tenant's DELETE (after a grace period of the tenant's choosing)",
        (RECONCILE, ON_POD),
        "api server",
        "a terminating Pod is not checked again: what it holds can no longer change (its spec is "
        "immutable, its image and plan frozen by the guard, its status the cluster's); every Pod "
        "that leaves the controller's watch, terminating or not, is read afresh, so one whose "
        "engine label is removed while it terminates loses its verdict (`EngineLabelRemoved`)",
        (OPEN + "test_a_terminating_pod_whose_label_is_removed_loses_its_verdict",),
    ),
    row(
        "Pod",
        ("metadata.labels[kamiwaza.ai/deployment-id]",),
        "the tenant, at create and update",
        (
            GUARD,
            "inference_policy/admission/shield_cel.py:not_an_engine_pod",
            "inference_policy/base/pod_view.py:PodView.is_engine_pod",
            HOLDING,
            "inference_policy/placing/spread.py:deployment_of",
            "inference_policy/evidence/observations.py:pod_info",
        ),
        "checked",
        "makes the Pod an engine Pod, held to its plan by the extender and the controller; "
        "kamiwaza-tmi-guard refuses one holding a grant without a plan, and one holding none "
        "must carry the shield on every container; removed from a verified Pod, the controller "
        "writes `EngineLabelRemoved` (False) and the extender's ledger stops counting it, "
        "kube-scheduler's fit still counting its device; its value groups replicas for "
        "spreading within the namespace",
        (
            MINE + "test_removing_the_engine_label_withdraws_the_verdict",
            PLACEMENT
            + "test_replicas_of_one_deployment_go_to_distinct_nodes_while_deployments_still_pack",
        ),
    ),
    row(
        "Pod",
        ("metadata.labels[<other>]",),
        "the tenant",
        (),
        "never read",
        "no owner part reads another label; the stores keep only the engine label",
        (NEVER_READ_TEST,),
    ),
    row(
        "Pod",
        ("metadata.annotations[kamiwaza.ai/plan]",),
        "the tenant's webhook at create: the tenant's software, which a replaced one makes "
        "write anything",
        (
            GATE,
            "inference_policy/granting/stored_pod.py:read_plan",
            "extender/args.py:has_plan",
            "inference_policy/granting/pod_demand.py:outside_every_tenant",
            ON_POD,
            GUARD,
        ),
        "checked",
        "the plan must be what the verified revision it names plans for the Pod's request "
        "(`grant.check_placement` before any node passes, `grant.check_grant` once bound); a "
        "plan that places nothing or grants no device holds none (`device_gate`); "
        "kamiwaza-tmi-guard freezes it and refuses it on a Pod that is not an engine Pod",
        (
            REPLACED,
            PLACEMENT + "test_a_plan_that_says_it_places_nothing_gets_no_device",
            E2E + "admission/test_webhook.py::test_plan_annotation_cannot_change_on_update",
        ),
    ),
    row(
        "Pod",
        ("metadata.annotations[kamiwaza.ai/deployment-request]",),
        "the tenant, at create and update",
        ("inference_policy/granting/grant.py:_request",),
        "checked",
        "planned again under the signed revision the plan names: the plan must come out the "
        "same, or the Pod is placed nowhere and reported `PlanMismatch`",
        (VERIFIED + "test_request_annotation_changed_after_admission_is_reported_false",),
    ),
    row(
        "Pod",
        ("metadata.annotations[kamiwaza.ai/engine-container]",),
        "the tenant's webhook at create",
        (ENGINE_NAME, GUARD, GUARD_RULES),
        "refused",
        "names the container the plan governs (else the first); kamiwaza-tmi-guard freezes it "
        "from admission, so the grant cannot move to a container whose image is free to change",
        (DENY + "test_the_engine_container_annotation_cannot_be_moved",),
    ),
    row(
        "Pod",
        (
            "metadata.annotations[*]",
            "metadata.annotations[cdi.k8s.io/*]",
            "metadata.annotations[nvidia.cdi.k8s.io/*]",
        ),
        "the tenant, at create and update",
        (REACHES, GUARD),
        "refused",
        "every key's name is scanned for the CDI prefixes: kamiwaza-tmi-guard refuses such a "
        "key on create and update, and the extender and the controller find it",
        (DENY + "test_cdi_annotations_are_refused_on_create_and_update",),
    ),
    row(
        "Pod",
        ("metadata.annotations[<other>]",),
        "the tenant",
        (),
        "never read",
        "no owner part reads another annotation's value",
        (NEVER_READ_TEST,),
    ),
    row(
        "Pod",
        (
            "metadata.ownerReferences",
            "metadata.finalizers",
            "metadata.generateName",
            "metadata.managedFields",
        ),
        "the tenant",
        (),
        "never read",
        "not read by any owner part",
        (NEVER_READ_TEST,),
    ),
    row(
        "Pod",
        ("spec.containers[].resources",),
        "the tenant's webhook at create, for the engine container of a GPU or CPU plan (the "
        "`admin` role holds no pods/resize)",
        (DEMAND, "inference_policy/placing/placement.py:demand_for", REQUESTS, FINDINGS, GUARD),
        "checked",
        "the engine container's accelerator asks, and a DRA plan's claims, must be exactly the "
        "plan's and the plan the signed revision's: the extender passes no node otherwise and "
        "the controller writes `ResourcesMismatch`",
        (REPLACED, CLAIMS_TEST),
    ),
    row(
        "Pod",
        (
            "spec.containers[].resources",
            "spec.initContainers[].resources",
            "spec.ephemeralContainers[].resources",
            "spec.resources",
        ),
        "the tenant, for every other container and the Pod itself",
        (REACHES, GATE, FINDINGS, GUARD),
        "refused",
        "any resource but cpu, memory, ephemeral-storage and hugepages-*, and any claim, is "
        "refused outside a plan by kamiwaza-tmi-guard (default-deny); the extender's device "
        "gate and the controller find it too",
        (FORGERIES, POLICIES + "test_the_policies_refuse_exactly_what_the_predicate_refuses"),
    ),
    row(
        "Pod",
        (
            "spec.containers[].resources",
            "spec.initContainers[].resources",
            "spec.containers[].restartPolicy",
            "spec.initContainers[].restartPolicy",
        ),
        "the tenant: cpu, memory, ephemeral-storage and hugepages asks, and which init "
        "containers are sidecars",
        (REQUESTS, HOLDING, "inference_policy/placing/placement.py:score_nodes"),
        "open",
        NEXT_ISSUE
        + (
            ": counted as kube-scheduler counts them, for a CPU plan's fit and the scores (a "
            "CPU plan's own asks are checked as its grant); what a tenant's Pods take of a node "
            "it shares with another tenant is bounded by kube-scheduler's fit and the owner's "
            "ResourceQuota, not by tmi"
        ),
        (
            PLACEMENT
            + "test_cpu_engine_lands_on_the_cpu_node_and_on_a_gpu_node_only_once_that_is_full",
        ),
    ),
    row(
        "Pod",
        ("spec.overhead",),
        "the API server's RuntimeClass admission, from the owner's RuntimeClass",
        (REQUESTS, HOLDING),
        "refused",
        "kube-apiserver's RuntimeClass admission refuses an overhead that is not the "
        "RuntimeClass's own, which the owner defines; counted as kube-scheduler counts it",
        (MINE + "test_overhead_and_oversized_annotations_are_refused_by_the_api_server",),
    ),
    row(
        "Pod",
        ("spec.containers[].image",),
        "the tenant's webhook at create, for the engine container",
        (FINDINGS, GUARD_RULES),
        "checked",
        "the engine container runs the image its plan names, or the extender passes no node and "
        "the controller writes `ImageMismatch`; on an admitted Pod kamiwaza-tmi-guard refuses a "
        "change",
        (NOT_ITS_PLAN, MINE + "test_the_planned_image_is_frozen_and_a_sidecars_is_not_read"),
    ),
    row(
        "Pod",
        (
            "spec.containers[].image",
            "spec.initContainers[].image",
            "spec.ephemeralContainers[].image",
        ),
        "the tenant, for every other container",
        (),
        "never read",
        "every container without the grant is shielded (`NVIDIA_VISIBLE_DEVICES=void`), so "
        "nothing its image's environment asks reaches a GPU",
        (
            MINE + "test_the_planned_image_is_frozen_and_a_sidecars_is_not_read",
            E2E + "node/test_real_node.py::test_a_pod_whose_image_sets_all_runs_with_void",
        ),
    ),
    row(
        "Pod",
        (
            "spec.containers[].name",
            "spec.initContainers[].name",
            "spec.ephemeralContainers[].name",
        ),
        "the tenant",
        (ENGINE_NAME, REACHES, FINDINGS, GUARD, SHIELD),
        "checked",
        "which container the plan governs is the annotation's or the first; the guard, the "
        "extender and the controller use the one rule, and every other container must carry the "
        "shield",
        (DENY + "test_the_engine_container_annotation_cannot_be_moved",),
    ),
    row(
        "Pod",
        ("spec.containers[].env", "spec.initContainers[].env", "spec.ephemeralContainers[].env"),
        "the tenant",
        (REACHES, "inference_policy/base/access.py:unshielded", GUARD, SHIELD),
        "refused",
        "a variable in any vendor's device namespace (`NVIDIA_`, `AMD_`, `HABANA_`, "
        "`AWS_NEURON_`, `ASCEND_`, `ENFLAME_`, `MTHREADS_`) is refused on every container by "
        "kamiwaza-tmi-guard, but the shield's `NVIDIA_VISIBLE_DEVICES=void`, which every "
        "container without the grant must carry (kamiwaza-tmi-shield sets it on Pods that are "
        "not engine Pods)",
        (
            DENY + "test_no_engine_container_takes_a_device_variable",
            POLICIES + "test_plain_pods_are_shielded_by_the_api_server_without_the_webhook",
        ),
    ),
    row(
        "Pod",
        (
            "spec.containers[].envFrom",
            "spec.initContainers[].envFrom",
            "spec.ephemeralContainers[].envFrom",
        ),
        "the tenant",
        (REACHES, GUARD),
        "refused",
        "a source that could set a device variable (no prefix, or one overlapping a device "
        "namespace) is refused on every container, the granted one included, by "
        "kamiwaza-tmi-guard",
        (
            DENY + "test_no_engine_container_takes_a_device_variable",
            POLICIES + "test_a_webhook_that_plans_nothing_grants_nothing_the_guard_can_see",
        ),
    ),
)
