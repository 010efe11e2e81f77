"""The access rule (`inference_policy.base.access`) as CEL, for the API server to evaluate itself.

The Python predicate decides for the webhook and the controller; the API server needs the same
decision in CEL in two places, and each is generated here from the same tables so the two
languages cannot drift (tests pin the shipped manifests to these strings, and an end-to-end
test holds the policies to the Python predicate on a corpus through a real API server):

* the owner's admission policies, evaluated inside kube-apiserver with no server of ours to go
  down (Kubernetes 1.36: MutatingAdmissionPolicy and ValidatingAdmissionPolicy v1):
  - the shield (`inference_policy.admission.shield_cel`), built from `cel_unshielded` here;
  - `guard_variables` / `guard_validations`: the ValidatingAdmissionPolicy, the last word
    after every mutation. It refuses a reach outside a plan, an engine Pod that holds a grant
    but is not scheduled by the owner's scheduler (a policy parameter, not baked in) or names
    its node, a changed plan annotation or planned image, and any container that holds no grant
    but does not carry the shield, whatever a webhook did before it;
  - the other policies (claims, verdict, status, owner objects) in modules of their own, and
    all of them as the chart's one document in `inference_policy.admission.policy_cel`;
* `cel_condition`: on clusters without those APIs, the fallback guard webhook entry's
  matchCondition, which sends the webhook exactly the Pods it has something to do for.
"""

from __future__ import annotations

from typing import Any

from inference_policy.admission.dra_cel import ENGINE_CLAIMS_FROM_OWNER, ENGINE_CLAIMS_MESSAGE
from inference_policy.base.access import (
    CDI_ANNOTATION_PREFIXES,
    CONTAINER_LISTS,
    DEVICE_ENV_PREFIXES,
    NO_DEVICE,
    NVIDIA_DEVICE_ENV,
    RESOURCE_PARTS,
    STANDARD_PREFIXES,
    STANDARD_RESOURCES,
)
from inference_policy.base.cel_text import cel_string
from inference_policy.base.wire import ENGINE_CONTAINER_ANNOTATION, ENGINE_LABEL, PLAN_ANNOTATION

# The policy parameter (a field of the tenant's TenantAdmission) holding the owner's scheduler.
SCHEDULER_PARAM = "schedulerName"
# The PriorityClasses a Pod of the tenant may name (TenantAdmission spec.priorityClasses).
PRIORITY_PARAM = "priorityClasses"
FORGERY_PREFIX = "tenant-mode inference: this Pod asks for accelerator access outside a plan ("


def _cel_list(items: Any) -> str:
    return "[" + ", ".join(cel_string(item) for item in items) + "]"


def _accelerator_key(var: str) -> str:
    standard = _cel_list(sorted(STANDARD_RESOURCES))
    prefixes = " || ".join(f"{var}.startsWith({cel_string(p)})" for p in STANDARD_PREFIXES)
    return f"!({var} in {standard} || {prefixes})"


def _cel_resource_map(expr: str) -> str:
    return f"{expr}.exists(k, {_accelerator_key('k')})"


def _cel_resources(holder: str) -> str:
    parts = [
        f"(has({holder}.resources) && has({holder}.resources.{part}) && "
        f"{_cel_resource_map(f'{holder}.resources.{part}')})"
        for part in RESOURCE_PARTS
    ]
    return " ||\n    ".join(parts)


def _device_variable(name: str) -> str:
    """`name` is in a device-variable namespace (`access.is_device_variable`)."""
    spaces = " || ".join(f"{name}.startsWith({cel_string(p)})" for p in DEVICE_ENV_PREFIXES)
    return f"({spaces})"


def _device_env(var: str) -> str:
    """`var` is an env entry that selects devices (`access.selects_devices`): a device
    variable, unless it is the shield's literal value."""
    return (
        f"{_device_variable(f'{var}.name')} && !({var}.name == {cel_string(NVIDIA_DEVICE_ENV)} "
        f"&& has({var}.value) && {var}.value == {cel_string(NO_DEVICE)} && !has({var}.valueFrom))"
    )


def _cdi_annotation(obj: str) -> str:
    """`obj` carries an annotation a CDI-enabled runtime turns into devices."""
    keys = " || ".join(f"k.startsWith({cel_string(p)})" for p in CDI_ANNOTATION_PREFIXES)
    return f"has({obj}.metadata.annotations) && {obj}.metadata.annotations.exists(k, {keys})"


def _cdi_keys(obj: str) -> str:
    keys = " || ".join(f"k.startsWith({cel_string(p)})" for p in CDI_ANNOTATION_PREFIXES)
    return f"{obj}.metadata.annotations.filter(k, {keys})"


def _cel_env(var: str) -> str:
    return f"(has({var}.env) && {var}.env.exists(e, {_device_env('e')}))"


def _cel_claims(var: str) -> str:
    return (
        f"(has({var}.resources) && has({var}.resources.claims) && size({var}.resources.claims) > 0)"
    )


def _cel_env_from(var: str) -> str:
    """An envFrom source of `var` could set a device variable (`access.can_set_device_env`)."""
    spaces = _cel_list(DEVICE_ENV_PREFIXES)
    return (
        f"(has({var}.envFrom) && {var}.envFrom.exists(f, !has(f.prefix) || f.prefix == '' ||\n"
        f"    {spaces}.exists(n, n.startsWith(f.prefix) || f.prefix.startsWith(n))))"
    )


def _cel_container() -> str:
    return (
        _cel_resources("c")
        + " ||\n    "
        + _cel_claims("c")
        + " ||\n    "
        + _cel_env("c")
        + " ||\n    "
        + _cel_env_from("c")
    )


def cel_unshielded(kinds: tuple[str, ...]) -> str:
    lists = [
        f"(has(object.spec.{kind}) && object.spec.{kind}.exists(c, !has(c.env) ||\n"
        f"    !c.env.exists(e, e.name == {cel_string(NVIDIA_DEVICE_ENV)})))"
        for kind in kinds
    ]
    return " ||\n".join(lists)


def cel_condition() -> str:
    """The fallback guard entry's matchCondition: the Pods for which `reaches(pod)` (or, on
    UPDATE, the old Pod's plan annotation) is non-empty, and those with a container to shield
    (`unshielded`: on CREATE any container, on UPDATE an ephemeral container)."""
    container = _cel_container()
    lists = [
        f"(has(object.spec.{kind}) && object.spec.{kind}.exists(c,\n    {container}))"
        for kind in CONTAINER_LISTS
    ]
    plan = cel_string(PLAN_ANNOTATION)
    clauses = [
        "has(object.spec.runtimeClassName)",
        "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)",
        f"(has(object.metadata.annotations) && {plan} in object.metadata.annotations)",
        f"({_cdi_annotation('object')})",
        "(request.operation == 'UPDATE' && has(oldObject.metadata.annotations) &&\n  "
        f"{plan} in oldObject.metadata.annotations)",
        _cel_resources("object.spec"),
        *lists,
        "(request.operation == 'CREATE' && (\n"
        + cel_unshielded(("containers", "initContainers", "ephemeralContainers"))
        + "))",
        "(request.operation == 'UPDATE' && (\n" + cel_unshielded(("ephemeralContainers",)) + "))",
    ]
    return " ||\n".join(clauses)


# -- the owner's admission policies ---------------------------------------------------------------


def _plan_of(obj: str) -> str:
    plan = cel_string(PLAN_ANNOTATION)
    return (
        f"has({obj}.metadata.annotations) && {plan} in {obj}.metadata.annotations ? "
        f"{obj}.metadata.annotations[{plan}] : ''"
    )


def _engine_name_of(obj: str) -> str:
    named = cel_string(ENGINE_CONTAINER_ANNOTATION)
    return (
        f"has({obj}.metadata.annotations) && {named} in {obj}.metadata.annotations &&\n"
        f"  {obj}.metadata.annotations[{named}] != '' ? {obj}.metadata.annotations[{named}] :\n"
        f"  size({obj}.spec.containers) > 0 ? {obj}.spec.containers[0].name : ''"
    )


def _named_engine(obj: str) -> str:
    """The engine-container annotation's value, '' when absent."""
    named = cel_string(ENGINE_CONTAINER_ANNOTATION)
    return (
        f"has({obj}.metadata.annotations) && {named} in {obj}.metadata.annotations ? "
        f"{obj}.metadata.annotations[{named}] : ''"
    )


def _shielded(var: str) -> str:
    return (
        f"(has({var}.env) && {var}.env.exists(e, e.name == {cel_string(NVIDIA_DEVICE_ENV)} &&\n"
        f"    has(e.value) && e.value == {cel_string(NO_DEVICE)} && !has(e.valueFrom)))"
    )


def _container_tests(kind: str, governed: bool) -> list[tuple[str, str]]:
    """Each way a container of `kind` (as `c`) reaches on its own, as a test and the field it
    names, spelled as `access.Reach.field` spells it. The governed engine container's resource
    asks are its plan's; its envFrom is not. Both the guard's test (any of them) and its message
    (the fields) are drawn from this one table."""
    at = f"'spec.{kind}[' + c.name + ']"
    skip = "c.name != variables.granted && " if governed else ""
    tests = [
        (
            f"{skip}has(c.resources) && has(c.resources.{part}) &&\n"
            f"    {_cel_resource_map(f'c.resources.{part}')}",
            f"{at}.resources.{part}[' + c.resources.{part}.filter(k, {_accelerator_key('k')})"
            ".join(', ') + ']'",
        )
        for part in RESOURCE_PARTS
    ]
    tests.append((f"{skip}{_cel_claims('c')}", f"{at}.resources.claims'"))
    tests.append(
        (
            f"has(c.env) && c.env.exists(e, {_device_env('e')})",
            f"{at}.env[' + c.env.filter(e, {_device_env('e')}).map(e, e.name).join(', ') + ']'",
        )
    )
    tests.append((_cel_env_from("c"), f"{at}.envFrom'"))
    return tests


def _reaching(kind: str, governed: bool) -> str:
    """The fields through which containers of `kind` reach (built only for a message)."""
    return " +\n".join(
        f"variables.{kind}.filter(c, {test}).map(c,\n    {field})"
        for test, field in _container_tests(kind, governed)
    )


def _reaches_any(kind: str, governed: bool) -> str:
    """Whether any container of `kind` reaches: short-circuiting and building no text, since it
    is what every admitted Pod pays for."""
    tests = " ||\n    ".join(f"({test})" for test, _ in _container_tests(kind, governed))
    return f"variables.{kind}.exists(c,\n    {tests})"


def _pod_tests() -> list[tuple[str, str]]:
    """The Pod-level ways to reach, as `_container_tests` gives the containers'."""
    tests = [
        (
            "!variables.engine && has(object.spec.runtimeClassName)",
            "'spec.runtimeClassName (' + object.spec.runtimeClassName + ')'",
        ),
        (
            "!variables.engine && has(object.spec.resourceClaims) &&\n"
            "  size(object.spec.resourceClaims) > 0",
            "'spec.resourceClaims'",
        ),
    ]
    tests += [
        (
            f"has(object.spec.resources) && has(object.spec.resources.{part}) &&\n"
            f"  {_cel_resource_map(f'object.spec.resources.{part}')}",
            f"'spec.resources.{part}[' + object.spec.resources.{part}.filter(k, "
            f"{_accelerator_key('k')}).join(', ') + ']'",
        )
        for part in RESOURCE_PARTS
    ]
    tests.append(
        (
            f"!variables.engine && ({_plan_of('object')}) != ''",
            f"'metadata.annotations[{PLAN_ANNOTATION}]'",
        )
    )
    tests.append(_cdi_test())
    return tests


def _cdi_test() -> tuple[str, str]:
    """The CDI annotations, judged on CREATE and UPDATE alike: annotations may change on an
    admitted Pod, and a runtime reads them again for a restarted container."""
    return (
        _cdi_annotation("object"),
        f"'metadata.annotations[' + {_cdi_keys('object')}.join(', ') + ']'",
    )


def _shield_tests() -> list[tuple[str, str]]:
    """Per container list, the test (on `c`) of a container that must carry the shield but does
    not: every container but the engine container holding a grant."""
    granted = "!(c.name == variables.granted && variables.holdsGrant) && "
    return [
        (kind, f"{granted if kind == 'containers' else ''}!{_shielded('c')}")
        for kind in CONTAINER_LISTS
    ]


def _unshielded(names: bool) -> str:
    """The unshielded containers' names (`names`), or whether there is any; an UPDATE can add
    ephemeral containers alone, so the others are judged on CREATE."""
    parts = []
    for kind, test in _shield_tests():
        part = (
            f"variables.{kind}.filter(c, {test}).map(c, c.name)"
            if names
            else f"variables.{kind}.exists(c, {test})"
        )
        if kind != "ephemeralContainers":
            part = f"(request.operation == 'CREATE' ? {part} : {'[]' if names else 'false'})"
        parts.append(part)
    return (" +\n" if names else " ||\n").join(parts)


def guard_variables() -> list[dict[str, str]]:
    """The guard policy's variables, in the order they may refer to each other."""
    label = cel_string(ENGINE_LABEL)
    pod_reaches = " +\n".join(f"(({test}) ? [{field}] : [])" for test, field in _pod_tests())
    pod_reach = " ||\n".join(f"({test})" for test, _ in _pod_tests())
    return [
        {
            "name": "engine",
            "expression": f"has(object.metadata.labels) && {label} in object.metadata.labels",
        },
        {"name": "granted", "expression": f"variables.engine ? ({_engine_name_of('object')}) : ''"},
        {"name": "containers", "expression": "object.spec.containers"},
        {
            "name": "initContainers",
            "expression": "has(object.spec.initContainers) ? object.spec.initContainers : []",
        },
        {
            "name": "ephemeralContainers",
            "expression": "has(object.spec.ephemeralContainers) ? "
            "object.spec.ephemeralContainers : []",
        },
        {
            "name": "holdsGrant",
            "expression": "variables.engine && (has(object.spec.runtimeClassName) ||\n"
            "  (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) ||\n"
            "  variables.containers.exists(c, c.name == variables.granted && (\n    "
            + _cel_resources("c")
            + ")))",
        },
        {
            # What the validations test: cheap, short-circuiting, no text. The lists below
            # name the fields, and are built only for a message (variables are lazy).
            "name": "reachesAny",
            "expression": pod_reach
            + " ||\n"
            + " ||\n".join(_reaches_any(kind, kind == "containers") for kind in CONTAINER_LISTS),
        },
        {
            "name": "refusedAny",
            "expression": "request.operation == 'CREATE' ? variables.reachesAny :\n("
            + _reaches_any("ephemeralContainers", False)
            + " ||\n"
            + f"({_cdi_test()[0]}))",
        },
        {"name": "unshieldedAny", "expression": _unshielded(names=False)},
        {"name": "podReaches", "expression": pod_reaches},
        {
            "name": "reaches",
            "expression": "variables.podReaches +\n"
            + _reaching("containers", True)
            + " +\n"
            + _reaching("initContainers", False)
            + " +\n"
            + _reaching("ephemeralContainers", False),
        },
        {
            # An UPDATE can add only ephemeral containers; the rest was judged at CREATE.
            "name": "refused",
            "expression": "request.operation == 'CREATE' ? variables.reaches :\n"
            + _reaching("ephemeralContainers", False)
            + f" +\n(({_cdi_test()[0]}) ? [{_cdi_test()[1]}] : [])",
        },
        {"name": "unshielded", "expression": _unshielded(names=True)},
        {"name": "plan", "expression": _plan_of("object")},
        {
            "name": "oldPlan",
            "expression": f"request.operation == 'UPDATE' ? ({_plan_of('oldObject')}) : ''",
        },
        {
            "name": "oldEngine",
            "expression": f"variables.oldPlan != '' ? ({_engine_name_of('oldObject')}) : ''",
        },
    ]


def _priority_classes() -> str:
    param = f"params.spec.{PRIORITY_PARAM}"
    return f"has({param}) ? {param} : []"


def _priority_allowed() -> str:
    return (
        "!has(object.spec.priorityClassName) || object.spec.priorityClassName == '' ||\n"
        f"  object.spec.priorityClassName in ({_priority_classes()})"
    )


def guard_validations() -> list[dict[str, str]]:
    """What the guard refuses, each with a message naming what is wrong (403 Forbidden)."""
    scheduler = f"params.spec.{SCHEDULER_PARAM}"
    rules = [
        (
            "!variables.refusedAny",
            f"{cel_string(FORGERY_PREFIX)} + variables.refused.join(', ') +\n"
            "  '); only an engine Pod planned by the tenant webhook may, so remove ' +\n"
            "  (size(variables.refused) == 1 ? 'it' : 'them')",
        ),
        (
            f"request.operation != 'CREATE' || !variables.holdsGrant ||\n"
            f"  (has(object.spec.schedulerName) && object.spec.schedulerName == {scheduler})",
            "'tenant-mode inference: an engine Pod holding an accelerator grant is scheduled by ' "
            f"+ {scheduler} + ', not ' +\n"
            "  (has(object.spec.schedulerName) ? object.spec.schedulerName : 'default-scheduler')"
            " + ', so that the owner checks the grant before it runs'",
        ),
        (
            "request.operation != 'CREATE' || !variables.holdsGrant || variables.plan != ''",
            f"'tenant-mode inference: an engine Pod holding an accelerator grant carries the "
            f"plan ({PLAN_ANNOTATION}) the tenant webhook wrote for it; this one has none'",
        ),
        (f"request.operation != 'CREATE' || {ENGINE_CLAIMS_FROM_OWNER}", ENGINE_CLAIMS_MESSAGE),
        (
            # No Pod names its node: a pinned Pod skips every scheduler's checks, and one tenant
            # could crowd another's engines off a node with it. A kubelet's mirror Pod excepted.
            "request.operation != 'CREATE' ||\n"
            "  !has(object.spec.nodeName) || object.spec.nodeName == '' ||\n"
            "  (request.userInfo.username.startsWith('system:node:') &&\n"
            "    has(request.userInfo.groups) && 'system:nodes' in request.userInfo.groups)",
            "'tenant-mode inference: spec.nodeName (' + object.spec.nodeName + ') is set; ' +\n"
            f"  (variables.engine ? 'engine Pods are placed by ' + {scheduler} :\n"
            "  'Pods in this namespace are placed by a scheduler, which weighs every tenant\\'s "
            "Pods on the node; remove it and use a nodeSelector or node affinity')",
        ),
        (
            # Only the classes the owner lists for the tenant (a higher priority preempts other
            # tenants' Pods); the API server fills in the cluster's global default, which the
            # owner's chart lists, for a Pod that names none.
            f"request.operation != 'CREATE' || {_priority_allowed()}",
            "'tenant-mode inference: priorityClassName ' + object.spec.priorityClassName + "
            "' is not one the owner allows in this namespace (' +\n"
            f"  ({_priority_classes()}).join(', ') + '); a higher priority lets a Pod preempt "
            "other tenants\\' Pods'",
        ),
        (
            "!variables.unshieldedAny",
            "'tenant-mode inference: container(s) ' + variables.unshielded.join(', ') + ' hold "
            f"no accelerator grant and must set {NVIDIA_DEVICE_ENV}={NO_DEVICE} (the owner\\'s "
            "shield policy sets it; a later mutation removed or changed it)'",
        ),
        (
            "request.operation != 'UPDATE' || variables.plan == variables.oldPlan",
            f"'tenant-mode inference: the {PLAN_ANNOTATION} annotation is fixed when the Pod is "
            "admitted; it cannot be added, changed or removed'",
        ),
        (
            "variables.oldPlan == '' ||\n"
            f"  ({_named_engine('object')}) == ({_named_engine('oldObject')})",
            f"'tenant-mode inference: the {ENGINE_CONTAINER_ANNOTATION} annotation is fixed "
            "when the Pod is admitted, as its plan is; it cannot be added, changed or removed'",
        ),
        (
            "variables.oldEngine == '' ||\n"
            "  oldObject.spec.containers.all(o, o.name != variables.oldEngine ||\n"
            "    object.spec.containers.all(c, c.name != o.name || c.image == o.image))",
            "'tenant-mode inference: container ' + variables.oldEngine + ' runs the image its "
            "plan names; it cannot be changed on an admitted Pod'",
        ),
    ]
    # One validation, not one per rule: kube-apiserver evaluates each validation with its own
    # activation, so the variables every rule shares would be computed once per rule (measured
    # on 1.36: 0.23 ms more per admitted Pod for the eight). The message, evaluated only for a
    # refused Pod, is the first failing rule's.
    expression = " &&\n".join(f"({rule})" for rule, _ in rules)
    message = "".join(f"!({rule}) ? ({text}) :\n" for rule, text in rules[:-1]) + rules[-1][1]
    return [{"expression": expression, "messageExpression": message, "reason": "Forbidden"}]


__all__ = [
    "FORGERY_PREFIX",
    "PRIORITY_PARAM",
    "SCHEDULER_PARAM",
    "cel_condition",
    "cel_string",
    "cel_unshielded",
    "guard_validations",
    "guard_variables",
]
