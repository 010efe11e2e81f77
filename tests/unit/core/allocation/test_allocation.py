"""The allocation classes: each resource name has one class, each guarantee a profile may state
has one, and what the planner and placement do with a binding follows from its class."""

from __future__ import annotations

from typing import get_args

import pytest

from inference_policy.allocation import (
    ACCOUNTED_SHARE,
    CLASSES,
    MIG,
    WHOLE_DEVICE,
    Guarantee,
    class_of,
    class_of_resource,
)
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.trust.profile import ExtendedResourceBinding
from kits.profilekit import gpu_binding


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        ("nvidia.com/gpu", WHOLE_DEVICE),
        ("amd.com/gpu", WHOLE_DEVICE),
        ("nvidia.com/mig-1g.10gb", MIG),
        ("nvidia.com/mig-3g.40gb+me", MIG),
        ("kamiwaza.ai/vram-gb-1", ACCOUNTED_SHARE),
        ("cpu", None),
        ("memory", None),
        ("nvidia.com/gpu.shared", None),
    ],
)
def test_each_resource_name_has_at_most_one_class(resource: str, expected: object) -> None:
    assert class_of_resource(resource) is expected
    assert sum(cls.owns(resource) for cls in CLASSES) == (0 if expected is None else 1)


def test_every_guarantee_a_profile_states_is_a_class() -> None:
    assert set(get_args(Guarantee)) == {cls.guarantee for cls in CLASSES}


def test_the_planner_prefers_the_stronger_isolation() -> None:
    ranks = {cls.guarantee: cls.rank for cls in CLASSES}
    assert sorted(ranks, key=ranks.__getitem__) == ["mig", "whole-device", "accounted-share"]
    # Every class of one guarantee ranks alike, whatever hands its devices out.
    assert all(cls.rank == ranks[cls.guarantee] for cls in CLASSES)


def test_only_whole_devices_span_several_devices() -> None:
    assert [c.multi_device for c in (MIG, WHOLE_DEVICE, ACCOUNTED_SHARE)] == [False, True, False]


def test_a_shared_bucket_is_refused_as_a_bucket() -> None:
    assert ACCOUNTED_SHARE.busy_code is NodeVerdictCode.VRAM_BUCKET
    assert ACCOUNTED_SHARE.over_capacity_code is NodeVerdictCode.VRAM_BUCKET
    assert WHOLE_DEVICE.busy_code is NodeVerdictCode.INSUFFICIENT
    assert MIG.over_capacity_code is NodeVerdictCode.CAPACITY


def test_a_binding_knows_its_class() -> None:
    whole = ExtendedResourceBinding.model_validate(gpu_binding("whole-amd64"))
    assert whole.allocation is WHOLE_DEVICE
    mig = ExtendedResourceBinding.model_validate(
        gpu_binding("mig-amd64", resource="nvidia.com/mig-1g.10gb", memory="9Gi")
    )
    assert mig.allocation is MIG


def test_an_allocator_with_a_resource_of_another_class_has_none() -> None:
    with pytest.raises(ValueError, match="no allocation class for allocator vram-plugin"):
        class_of("vram-plugin", "nvidia.com/gpu")
    assert class_of("vram-plugin", "kamiwaza.ai/vram-gb-1") is ACCOUNTED_SHARE
