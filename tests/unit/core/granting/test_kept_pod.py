"""What the allocation controller keeps of an engine Pod (inference_policy.granting.kept_pod).

The tenant decides how many engine-labelled Pods there are and how large each is, so past a
size the controller keeps a skeleton, and the verdict for it says the grant was not checked.
"""

from __future__ import annotations

import pickle
from typing import Any

from inference_policy.base.codes import POD_TOO_LARGE
from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL
from inference_policy.granting.grant import evaluate
from inference_policy.granting.kept_pod import MAX_KEPT_POD_BYTES, kept_pod, too_large
from kits.profilekit import NOW, Owner


def _pod(junk: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "big",
            "namespace": "kamiwaza",
            "uid": "u-1",
            "creationTimestamp": "2026-12-06T00:00:00Z",
            "labels": {ENGINE_LABEL: "d-1", "team": "x" * 60},
            "annotations": {"example.com/junk": "x" * junk},
        },
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"name": "engine", "image": "e", "env": [{"name": "A", "value": "b"}]}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": ALLOCATION_VERIFIED, "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        },
    }


def test_a_pod_within_the_cap_is_kept_whole() -> None:
    pod = _pod(1000)
    assert kept_pod(pod, 2000) is pod
    assert too_large(pod) is None


def test_a_pod_past_the_cap_is_kept_as_a_skeleton_of_bounded_size() -> None:
    pod = _pod(MAX_KEPT_POD_BYTES)
    kept = kept_pod(pod, MAX_KEPT_POD_BYTES + 500)
    assert too_large(kept) == MAX_KEPT_POD_BYTES + 500
    assert kept["metadata"] == {
        "name": "big",
        "namespace": "kamiwaza",
        "uid": "u-1",
        "creationTimestamp": "2026-12-06T00:00:00Z",
        "labels": {ENGINE_LABEL: "d-1"},
    }
    assert kept["spec"] == {"nodeName": "gpu-1"}
    assert kept["status"] == {
        "phase": "Running",
        "conditions": [{"type": ALLOCATION_VERIFIED, "status": "True"}],
    }
    assert len(pickle.dumps(dict(kept))) < 1024


def test_the_verdict_for_a_skeleton_says_it_was_not_checked() -> None:
    owner = Owner()
    ctx = owner.state(owner.envelope()).context(NOW)
    kept = kept_pod(_pod(10), MAX_KEPT_POD_BYTES + 1)
    evaluation = evaluate(kept, {}, ctx, NOW)
    assert evaluation.verdict is not None
    assert (evaluation.verdict.status, evaluation.verdict.reason) == ("False", POD_TOO_LARGE)
    assert str(MAX_KEPT_POD_BYTES + 1) in evaluation.verdict.message


def test_a_skeleton_keeps_what_the_pod_held_on_its_node() -> None:
    """The skeleton keeps no containers, so what the Pod holds is noted as it is cut: another
    tenant's controller counts its share from it (`allocation_controller.neighbours`)."""
    pod = _pod(MAX_KEPT_POD_BYTES)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"kamiwaza.ai/vram-gb-gpu-0": "8"}}
    kept = kept_pod(pod, MAX_KEPT_POD_BYTES + 500)
    assert getattr(kept, "held", None) == ("gpu-1", {"kamiwaza.ai/vram-gb-gpu-0": 8})
    pod["spec"].pop("nodeName")
    assert getattr(kept_pod(pod, MAX_KEPT_POD_BYTES + 500), "held", "unset") is None
