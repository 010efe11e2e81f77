"""The rule of what the allocation controller must hold in a tenant namespace, and how access
reviews' answers become a verdict (`inference_policy.granting.owner_rights`)."""

from __future__ import annotations

from inference_policy.granting.owner_rights import (
    CONTROLLER_BINDING,
    CONTROLLER_RIGHTS,
    Right,
    describe,
    judge,
    placement_refusal,
    review_allowed,
    self_access_review,
    service_account_groups,
    subject_access_review,
)
from inference_policy.tools.doctor import controller_rights_check

CONTROLLER = "system:serviceaccount:tmi-system:tmi-allocation-controller"
LIST, WATCH, GET, PATCH = CONTROLLER_RIGHTS


def every(answer: bool | None) -> dict[Right, bool | None]:
    return dict.fromkeys(CONTROLLER_RIGHTS, answer)


def test_the_rights_are_what_the_verdict_needs() -> None:
    assert [str(r) for r in CONTROLLER_RIGHTS] == [
        "list pods",
        "watch pods",
        "get pods",
        "patch pods/status",
    ]
    assert all(r.why for r in CONTROLLER_RIGHTS)


def test_all_allowed_is_present() -> None:
    verdict = judge("kamiwaza", every(True))
    assert verdict.present and verdict.missing == () and verdict.unknown == ()
    assert describe(verdict, "the controller") == (
        "the controller may list pods, watch pods, get pods, patch pods/status in namespace "
        "'kamiwaza'"
    )


def test_one_denied_right_is_missing_and_names_the_binding() -> None:
    answers = every(True)
    answers[PATCH] = False
    verdict = judge("kamiwaza", answers)
    assert not verdict.present and verdict.missing == (PATCH,)
    message = placement_refusal(verdict, CONTROLLER)
    assert message.startswith(
        f"the allocation controller {CONTROLLER} may not patch pods/status in namespace "
        "'kamiwaza', so no AllocationVerified verdict can be checked there and no engine Pod "
        "is placed;"
    )
    assert f"Role and RoleBinding {CONTROLLER_BINDING} in namespace 'kamiwaza'" in message


def test_an_unknown_answer_is_not_present() -> None:
    """Rights must be confirmed: an answer not known (not asked, failed, too old) fails closed."""
    answers = every(True)
    del answers[WATCH]
    answers[GET] = None
    verdict = judge("kamiwaza", answers, why="the review failed")
    assert not verdict.present
    assert verdict.missing == () and verdict.unknown == (WATCH, GET)
    assert placement_refusal(verdict, CONTROLLER) == (
        f"the allocation controller {CONTROLLER}'s rights in namespace 'kamiwaza' (watch pods, "
        "get pods) are unconfirmed (the review failed), so no AllocationVerified verdict can be "
        "checked there and no engine Pod is placed until they are"
    )
    assert not judge("kamiwaza", {}).present


def test_a_denial_is_named_before_what_is_unknown() -> None:
    answers: dict[Right, bool | None] = {LIST: False, WATCH: None, GET: True, PATCH: False}
    verdict = judge("kamiwaza", answers)
    assert verdict.missing == (LIST, PATCH) and verdict.unknown == (WATCH,)
    assert (
        describe(verdict, "it") == "it may not list pods, patch pods/status in namespace 'kamiwaza'"
    )


def test_reviews_ask_for_the_service_accounts_groups_too() -> None:
    review = subject_access_review(CONTROLLER, PATCH, "kamiwaza")
    assert review == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": CONTROLLER,
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:tmi-system",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "namespace": "kamiwaza",
                "verb": "patch",
                "group": "",
                "resource": "pods",
                "subresource": "status",
            },
        },
    }
    assert service_account_groups("alice") == ["system:authenticated"]
    own = self_access_review(LIST, "kamiwaza")
    assert own["kind"] == "SelfSubjectAccessReview"
    assert own["spec"] == {
        "resourceAttributes": {
            "namespace": "kamiwaza",
            "verb": "list",
            "group": "",
            "resource": "pods",
        }
    }


def test_only_a_boolean_status_is_an_answer() -> None:
    assert review_allowed({"status": {"allowed": True}}) is True
    assert review_allowed({"status": {"allowed": False, "reason": "no RBAC"}}) is False
    documents: list[object] = [{}, {"status": {}}, {"status": {"allowed": "yes"}}, [], None]
    for document in documents:
        assert review_allowed(document) is None


def test_the_doctor_checks_the_same_rule() -> None:
    """`tmi doctor`, as the owner, once the owner part serves the namespace."""
    passed = controller_rights_check("kamiwaza", CONTROLLER, every(True))
    assert (passed.name, passed.status) == ("controller-rights", "pass")
    denied = every(True)
    denied[LIST] = False
    failed = controller_rights_check("kamiwaza", CONTROLLER, denied)
    assert failed.status == "fail"
    assert failed.found == (
        f"{CONTROLLER} may not list pods in namespace 'kamiwaza': no engine Pod is placed there"
    )
    assert failed.fix.startswith(f"restore Role and RoleBinding {CONTROLLER_BINDING}")
    unknown = controller_rights_check("kamiwaza", CONTROLLER, {**every(True), PATCH: None})
    assert unknown.status == "skip"
    assert controller_rights_check("kamiwaza", None, None).status == "skip"
    refused = controller_rights_check("kamiwaza", CONTROLLER, None, "HTTP 403")
    assert (refused.status, refused.found) == ("skip", "its rights could not be reviewed: HTTP 403")
