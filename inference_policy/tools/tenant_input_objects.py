"""The tenant-input inventory's rows for sizes and counts, ConfigMaps and the other objects of
the tenant namespace (`inference_policy.tools.tenant_inputs` says what a row is and how the rows are
held true).
"""

from __future__ import annotations

from inference_policy.tools.tenant_input_names import (
    APISERVER,
    CLAIMS_TEST,
    DENY,
    DRA,
    FAULTS,
    JUNK,
    LIFECYCLE,
    MINE,
    NEVER_READ_TEST,
    OWNER_RIGHTS,
    PLACEMENT,
    POLICIES,
    REVISION,
    SCHEDULER,
    SPILL,
    STATUS,
    VERDICT,
    VERIFIED,
    Row,
    row,
)

SIZE_AND_CONFIGMAP_ROWS: tuple[Row, ...] = (
    row(
        "Pod, sizes",
        ("metadata.annotations (256 KiB in all)",),
        "the tenant",
        ("inference_policy/granting/grant.py:_request",),
        "refused",
        "kube-apiserver refuses a Pod whose annotations pass 256 KiB together; the request "
        "annotation is read up to that and no further",
        (MINE + "test_overhead_and_oversized_annotations_are_refused_by_the_api_server",),
    ),
    row(
        "Pod, counts",
        ("engine-labelled Pods: their number and size",),
        "the tenant",
        (
            "allocation_controller/controller.py:Controller.__init__",
            "extender/sources.py:KubernetesSource._pods",
            "extender/view.py:ClusterView.demand",
        ),
        "checked",
        "checked against a cap: the allocation controller keeps an engine-labelled Pod whole up "
        "to 128 KiB as stored and past it a skeleton (`inference_policy.granting.kept_pod`) "
        "reported `PodTooLarge`, never verified, so each costs it at most 128 KiB (a genuine one "
        "4.75 KB); their number is the owner's to bound with a ResourceQuota on Pods; the extender "
        "keeps only what a bound one holds (`ledger.holding_part`) and bounds its memos",
        (DENY + "test_an_engine_pod_larger_than_the_controller_keeps_is_not_verified",),
    ),
    row(
        "ConfigMap",
        ("the profile (`bundleConfigMap`): `data`, `metadata.name`",),
        "the tenant (`admin`: create, replace, delete)",
        (
            "policy_io/feed.py:PolicyFeed.profile_read",
            "inference_policy/trust/signing.py:verify_configmap",
        ),
        "checked",
        "verified with the owner's key, cluster binding id, namespace and version floor from "
        "the owner's release, not the tenant's settings; the name is not signed, and an older "
        "signed revision put back under it is placed nowhere by the owner's rollback record; "
        "deleted or refused, GPU Pods are placed nowhere and verified ones keep their verdict",
        (
            PLACEMENT + "test_a_profile_signed_with_the_tenants_own_key_places_nothing",
            REVISION + "test_a_replayed_older_revision_places_nothing",
            FAULTS + "test_profile_deleted_or_untrusted_keeps_running_pods_and_refuses_new_ones",
        ),
    ),
    row(
        "ConfigMap",
        ("labelled `kamiwaza.ai/inference-profile=true`: their number, size and rewrites",),
        "the tenant",
        ("policy_io/feed.py:PolicyFeed.revision_changed", "policy_io/caps.py:readable"),
        "checked",
        "each verified as the profile is, once per uid and resourceVersion; one over 256 KiB is "
        "refused unread, at most 32 verified revisions are kept and copies of a kept bundle "
        "refused unverified (`policy_io.caps`), each refusal an Event on its ConfigMap",
        (
            JUNK + "test_junk_labelled_configmaps_leave_verdicts_and_placements_as_they_were",
            REVISION + "test_following_a_new_revision_takes_only_its_publication",
        ),
    ),
    row(
        "ConfigMap",
        ("the recipe catalogs (`gpuRecipeCatalogConfigMap`, `cpuRecipeCatalogConfigMap`)",),
        "the tenant (`admin`: create, replace, delete)",
        (
            "policy_io/feed.py:PolicyFeed.catalog_read",
            "inference_policy/planning/recipes.py:load_catalog",
        ),
        "checked",
        "checked against the owner's setting: the name the owner configures carries the "
        "catalog's whole sha256, and the ConfigMap must be immutable with that digest, so only "
        "the owner's exact catalog loads; replaced, edited or deleted, it is unusable "
        "(`RecipeCatalogUnavailable`: new plans refused, verified Pods keep their verdict)",
        (DENY + "test_a_recipe_catalog_under_the_owners_name_is_exactly_the_owners",),
    ),
    row(
        "ConfigMap",
        ("`tmi-binding-room` (room figures)",),
        "the owner's extender (PUT), and the tenant, which may rewrite, delete or freeze it",
        (),
        "never read",
        "the grant check replays the plan's recorded choice, never these figures: what the "
        "tenant writes there steers only among the bindings its request may use, and a stale or "
        "missing figure costs a Pending Pod",
        (
            SPILL
            + "test_figures_the_tenant_writes_steer_only_among_the_bindings_its_request_may_use",
        ),
    ),
    row(
        "ConfigMap",
        ("any other",),
        "the tenant",
        (),
        "never read",
        "not read by any owner part",
        (NEVER_READ_TEST,),
    ),
)

OTHER_ROWS: tuple[Row, ...] = (
    row(
        "Role, RoleBinding, ResourceQuota, ResourceClaimTemplate",
        ("labelled `tmi.kamiwaza.ai/owner-part` in the tenant namespace",),
        "the owner's release (the tenant's create, update and delete refused)",
        (
            APISERVER,
            "extender/owner_rights.py:RightsReviewer.start",
            "allocation_controller/rights.py:RightsMonitor.run",
            "extender/quota.py:QuotaBoard.check",
        ),
        "refused",
        "kamiwaza-tmi-owner-objects lets only an identity that may update the tenant's "
        "TenantAdmission create, change or delete them (the controller's and the extender's "
        "rights there, the cross-namespace-affinity quota, the tenant's quota `tmi-quota` the "
        "extender holds placements to, the DRA claim templates; `admin` may not write "
        "ResourceQuotas at all); lost all the same, the extender places no new engine Pod there "
        "and the controller reports it",
        (
            DENY + "test_the_owners_roles_and_bindings_in_the_tenant_namespace_are_the_owners",
            OWNER_RIGHTS + "test_a_controller_without_its_binding_places_nothing_new_and_says_why",
        ),
    ),
    row(
        "Role, RoleBinding",
        ("the tenant's own",),
        "the tenant",
        (APISERVER,),
        "never read",
        "RBAC only adds rights: nothing the tenant binds takes an owner part's away, and it may "
        "grant only what it holds",
        (DENY + "test_the_owners_roles_and_bindings_in_the_tenant_namespace_are_the_owners",),
    ),
    row(
        "ResourceClaim, ResourceClaimTemplate",
        ("made by the tenant (`admin` may create ResourceClaims)",),
        "the tenant",
        (SCHEDULER, "inference_policy/admission/dra_cel.py:claim_variables"),
        "refused",
        "kamiwaza-tmi-claims admits only exactly a claim template the owner published for a DRA "
        "binding; kamiwaza-tmi-guard holds an engine Pod's claims to those templates",
        (CLAIMS_TEST, LIFECYCLE + "test_tenant_claims_are_refused"),
    ),
    row(
        "ResourceClaim",
        ("`status.allocation` of an engine Pod's claim",),
        "kube-scheduler (`admin` holds no resourceclaims/status)",
        (
            "allocation_controller/reconciler.py:Reconciler._allocated",
            "inference_policy/granting/dra_allocation.py:allocation_verdict",
        ),
        "checked",
        "the allocated device must be in a ResourceSlice the driver published for the Pod's "
        "node, with every fact the binding signs",
        (DRA + "test_a_device_republished_with_other_facts_is_not_verified",),
    ),
    row(
        "Namespace",
        ("labels: `kamiwaza.ai/tenant-inference`, `resource.kubernetes.io/admin-access`",),
        "the owner (`admin` in a namespace cannot patch the Namespace)",
        (APISERVER,),
        "refused",
        "RBAC refuses the tenant its Namespace, so the opt-in is the owner's; "
        "kamiwaza-tmi-admin-access refuses the admin-access label to anyone",
        (
            MINE + "test_the_namespace_admin_can_neither_bind_a_pod_nor_label_its_namespace",
            DRA + "test_nobody_labels_the_tenant_namespace_for_admin_access",
        ),
    ),
    row(
        "TenantAdmission",
        ("`spec` (the policies' parameters), `status` (the rollback record)",),
        "the owner; the extender writes `status.highestVerifiedVersion`",
        (
            APISERVER,
            "extender/rollback_record.py:RollbackRecord.informer",
            "inference_policy/trust/rollback.py:floor_of",
        ),
        "refused",
        "cluster-scoped: RBAC gives the tenant no right on it, and the owner-objects rule is "
        "whoever may update it",
        (REVISION + "test_a_replayed_older_revision_places_nothing",),
    ),
    row(
        "TenantPolicy",
        ("`tmi-admission` in the tenant namespace: `spec` (the policies' parameters)",),
        "the owner",
        (APISERVER,),
        "refused",
        "the policies bound once for every tenant read it in the namespace of the request: RBAC "
        "gives `admin` no custom kind, and kamiwaza-tmi-owner-objects refuses any write of one, "
        "labelled or not, to an identity that may not update the tenant's TenantAdmission; an "
        "opted-in namespace without one has every matched request refused",
        (
            DENY + "test_the_admission_policies_parameters_are_the_owners_even_given_rbac",
            POLICIES + "test_an_opted_in_namespace_without_the_owners_parameters_admits_no_pod",
        ),
    ),
    row(
        "MutatingWebhookConfiguration",
        ("the tenant's entry (`kamiwaza-tenant-inference`)",),
        "the owner; the tenant's uninstall hook may delete it (an owner grant for that one object)",
        (APISERVER,),
        "checked",
        "without it engine Pods are not planned: one that holds a grant without a plan is "
        "refused by kamiwaza-tmi-guard, and whatever plan a Pod carries is checked as above",
        (
            PLACEMENT + "test_a_plan_that_says_it_places_nothing_gets_no_device",
            LIFECYCLE
            + "test_the_tenant_uninstall_hook_removes_its_webhook_configuration_and_no_other",
        ),
    ),
    row(
        "ServiceAccount",
        ("the tenant's, and their tokens (`admin` acts as any of them)",),
        "the tenant",
        (STATUS, VERDICT, "inference_policy/admission/owner_objects_cel.py:owner_objects_parts"),
        "refused",
        "no owner policy takes an identity of the tenant namespace for the owner's: "
        "kamiwaza-tmi-verdict and kamiwaza-tmi-status let only the writers the owner names "
        "(TenantAdmission `allocationController`, `statusWriters`), and "
        "kamiwaza-tmi-owner-objects asks for the right to update TenantAdmission",
        (MINE + "test_a_service_account_of_the_namespace_is_refused_what_its_admin_is",),
    ),
    row(
        "Lease",
        ("in the tenant namespace",),
        "the tenant",
        (),
        "never read",
        "the controller's and the scheduler's Leases are in the owner's namespace; one of the "
        "same name in the tenant namespace freezes nothing",
        (VERIFIED + "test_the_tenant_can_neither_forge_nor_freeze_the_verdict",),
    ),
    row(
        "Event, Endpoints",
        ("in the tenant namespace",),
        "the tenant (Endpoints: the installer's delegated right)",
        (),
        "never read",
        "the controller writes an Event for each verdict change and reads none back; no owner "
        "part reads Endpoints (the scheduler reaches the extender at the owner's Service)",
        (NEVER_READ_TEST,),
    ),
)
