"""`tmi capacity`: the servers' planning and placement replayed over a fleet, in order."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from inference_policy.placing.nodes import node_facts
from inference_policy.tools.capacity import Deployment, Fill, replay
from kits.profilekit import CLUSTER, NAMESPACE, NOW, NOW_TEXT, Owner, request, with_profiles
from kits.stackkit import LARGE, whole_h100_profile
from localcluster.nodes.kwok import FakeNode
from tmi_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
BENCH = ROOT / "bench"
# The 70B on vLLM: two whole H100s on one node.
TWO_GPUS = json.loads((EXAMPLES / "request-llama70b-vllm.json").read_text())


@pytest.fixture
def owner() -> Owner:
    return Owner()


def _ctx(owner: Owner) -> Any:
    return owner.state(with_profiles(owner, whole_h100_profile())).context(NOW)


def _nodes(*gpus: int, **facts: Any) -> list[dict[str, Any]]:
    spec = {"vram_gb": 80, "gpu_product": "NVIDIA-H100-80GB-HBM3", **facts}
    return [FakeNode(f"n{i}", gpus=g, **spec).manifest() for i, g in enumerate(gpus)]


def test_each_deployment_goes_where_the_extender_would_put_it(owner: Owner) -> None:
    report = replay([Deployment("a", LARGE), Deployment("b", LARGE)], _nodes(4, 1, 1), _ctx(owner))
    # Best fit: the one-GPU nodes fill before the four-GPU node is cut into.
    assert [(p.name, p.node, dict(p.resources)) for p in report.placed] == [
        ("a", "n1", {"nvidia.com/gpu": 1}),
        ("b", "n2", {"nvidia.com/gpu": 1}),
    ]
    assert report.left == {"n0": {"nvidia.com/gpu": 4}}
    assert not report.waiting and not report.stranded


def test_what_does_not_fit_waits_with_the_closest_nodes_reason(owner: Owner) -> None:
    report = replay([Deployment(f"d{i}", LARGE) for i in range(3)], _nodes(1, 1), _ctx(owner))
    assert [p.node for p in report.placed] == ["n0", "n1"]
    (waiting,) = report.waiting
    assert waiting.name == "d2" and waiting.binding == "whole-h100-amd64"
    assert "nvidia.com/gpu" in waiting.reason and waiting.code
    assert report.left == {} and report.stranded == {}


def test_capacity_split_across_nodes_is_stranded(owner: Owner) -> None:
    report = replay([Deployment("70b", TWO_GPUS)], _nodes(1, 1), _ctx(owner))
    assert report.placed == [] and [w.name for w in report.waiting] == ["70b"]
    # Two free H100s, one on each node: the deployment needs both on one.
    assert report.stranded == {"nvidia.com/gpu": 2}
    # Where each stranded unit is, and which node came closest, for the fleet picture.
    assert report.stranded_by_node == {"n0": {"nvidia.com/gpu": 1}, "n1": {"nvidia.com/gpu": 1}}
    assert report.waiting[0].node == "n0" and report.waiting[0].reason.startswith("n0: ")


def test_each_placement_names_its_tenant_and_each_step_is_told(owner: Owner) -> None:
    told: list[str] = []
    report = replay(
        [Deployment("a", LARGE, "team-a"), Deployment("b", LARGE)],
        _nodes(1, 1),
        _ctx(owner),
        done=lambda d: told.append(d.name),
    )
    assert [(p.name, p.tenant) for p in report.placed] == [("a", "team-a"), ("b", NAMESPACE)]
    assert told == ["a", "b"]


def test_other_hardware_left_free_is_not_stranded(owner: Owner) -> None:
    report = replay(
        [Deployment("a", LARGE)],
        _nodes(1, gpu_product="NVIDIA-L40S", vram_gb=48, compute_capability="8.9"),
        _ctx(owner),
    )
    (waiting,) = report.waiting
    assert waiting.code and report.left == {"n0": {"nvidia.com/gpu": 1}}
    assert report.stranded == {}


def test_refusals_keep_the_admission_status_and_code(owner: Owner) -> None:
    report = replay([Deployment("x", request("no-such-engine"))], _nodes(1), _ctx(owner))
    (refused,) = report.refused
    assert (refused.status, refused.code) == (422, "engine-not-qualified")
    assert report.left == {"n0": {"nvidia.com/gpu": 1}}


def _cli(owner: Owner, tmp_path: Path, deployments: Any, nodes: Any, *extra: str) -> list[str]:
    bundle, deps, fleet = tmp_path / "bundle.json", tmp_path / "deps.json", tmp_path / "nodes.json"
    bundle.write_text(json.dumps(owner.sign(with_profiles(owner, whole_h100_profile()))))
    deps.write_text(json.dumps(deployments))
    fleet.write_text(json.dumps(nodes))
    return [
        "capacity", "--bundle", str(bundle), "--owner-public-key", owner.public_key,
        "--cluster-binding-id", CLUSTER, "--namespace", NAMESPACE, "--now", NOW_TEXT,
        "--deployments", str(deps), "--fleet", str(fleet), *extra,
    ]  # fmt: skip


def test_the_cli_reads_engine_pods_and_a_node_list_and_prints_the_replay(
    owner: Owner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p-1",
            "labels": {"kamiwaza.ai/deployment-id": "qwen72b"},
            "annotations": {"kamiwaza.ai/deployment-request": json.dumps(LARGE)},
        },
    }
    argv = _cli(owner, tmp_path, {"items": [pod]}, {"items": _nodes(1)}, "-o", "json")
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["placed"] == [
        {"name": "qwen72b", "node": "n0", "binding": "whole-h100-amd64",
         "resources": {"nvidia.com/gpu": 1}, "tenant": NAMESPACE}
    ]  # fmt: skip
    expected = replay([Deployment("qwen72b", LARGE)], _nodes(1), _ctx(owner)).to_json()
    assert report == expected


def test_the_cli_says_which_tenant_holds_each_gpu(
    owner: Owner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Pod's tenant is its namespace, an item's its `tenant`, else the profile's namespace;
    the table's `held by tenant` and the report's `gpus` say who holds each node's GPUs."""
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p-1",
            "namespace": "team-x",
            "annotations": {"kamiwaza.ai/deployment-request": json.dumps(LARGE)},
        },
    }
    deps = [
        pod,
        {"name": "b", "request": LARGE, "tenant": "team-y"},
        {"name": "c", "request": LARGE},
    ]
    assert main(_cli(owner, tmp_path, deps, _nodes(2, 1))) == 0
    out = capsys.readouterr().out
    held = out.split("held by tenant\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert held[0].split() == ["NODE", "GPU", "RESOURCE", "TENANTS"]
    rows = {tuple(line.split()) for line in held[1:]}
    # Best fit: the first fills the one-GPU node, the other two share the two-GPU one.
    assert rows == {
        ("n0", "-", "nvidia.com/gpu", f"{NAMESPACE}=1,team-y=1"),
        ("n1", "-", "nvidia.com/gpu", "team-x=1"),
    }
    assert main(_cli(owner, tmp_path, deps, _nodes(2, 1), "-o", "json")) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert gpus[0] == {
        "node": "n0",
        "resource": "nvidia.com/gpu",
        "gpu": None,
        "isolates": True,
        "tenants": {NAMESPACE: 1, "team-y": 1},
    }


def test_a_deployments_tenant_must_be_a_string(
    owner: Owner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deps = [{"name": "a", "request": LARGE, "tenant": 7}]
    assert main(_cli(owner, tmp_path, deps, _nodes(1))) == 2
    assert "item 0: tenant is not a string" in capsys.readouterr().err


def test_the_cli_table_names_each_section(
    owner: Owner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deps = [{"name": "a", "request": LARGE}, {"name": "b", "request": LARGE}]
    assert main(_cli(owner, tmp_path, deps, _nodes(1))) == 0
    out = capsys.readouterr().out
    assert out.startswith("placed\n") and "\nwaiting\n" in out and "left free\n(none)" in out


@pytest.mark.parametrize(
    ("deployments", "nodes", "message"),
    [
        ({"nope": 1}, [], "must be a JSON list or an object with items"),
        ([{"kind": "Pod", "metadata": {"name": "p"}}], [], "has no kamiwaza.ai/deployment-request"),
        ([{"name": "a"}], [], 'neither a Pod nor {"name", "request"}'),
        ([], [{"metadata": {}}], "is not a named Node"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(
    owner: Owner,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    deployments: Any,
    nodes: Any,
    message: str,
) -> None:
    assert main(_cli(owner, tmp_path, deployments, nodes)) == 2
    assert message in capsys.readouterr().err


def test_the_fill_places_the_shared_trace_as_the_placement_benchmark_replays_it() -> None:
    # The benchmark's own fleet, deployments and demands (bench/research/trace_fleet.py), its own
    # replay (bench_placement.simulate) with the extender's score and ties to the first node by
    # name.
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(BENCH / "research"))
    import bench_placement
    import trace_fleet
    from placement_policies import extender

    class First:
        def randrange(self, n: int) -> int:
            return 0

    fleet = trace_fleet.build_fleet(limit=60)
    items = trace_fleet.build_items(replays=1)[:1500]
    demands = trace_fleet.Demands()
    expected = bench_placement.simulate(items, fleet, demands, extender(First(), lambda: None))  # type: ignore[arg-type]
    fill = Fill([node_facts(spec.manifest()) for spec in fleet.specs])
    placed = {cls: 0 for cls in fleet.classes}
    for item in items:
        if fill.place(item.name, item.resource, demands.get(item)) is not None:
            placed[item.cls] += 1
    assert placed == {cls: stats["placed"] for cls, stats in expected.items()}, placed
    assert sum(placed.values()) > 0 and len(fill.report().waiting) > 0
