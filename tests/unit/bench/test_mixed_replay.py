"""The mixed-class replay's bookkeeping (bench/research/mixed_fleet.py, mixed_replay.py) on tiny
hand-made fleets: devices shared between whole-GPU Pods and shares, CPU and memory on every Pod,
capacity freed at departure, the repair oracle, FGD's fragmentation of a node, and one tenant per
shared device."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "research"
sys.path.insert(0, str(BENCH))

from mixed_fleet import Fragmentation, Node, Placement, Task, devices_for, hold  # noqa: E402
from mixed_replay import MAX_WAIT, make_room, replay  # noqa: E402

GIB = 1024


def _task(index: int, cls: str, cpu: int, milli: int, arrive: float, life: float) -> Task:
    count = 0 if cls == "cpu" else (2 if cls == "whole2" else 1)
    cls = "whole" if cls == "whole2" else cls
    return Task(index, f"t{index}", cls, cpu, GIB, count, milli, arrive, life)


def _first(
    task: Task, nodes: list[Node], fit: list[tuple[int, tuple[int, ...]]], r: list[int]
) -> int:
    return 0


def test_a_whole_gpu_pod_is_refused_on_a_gpu_holding_a_share() -> None:
    node = Node.of("n0", 16000, 64 * GIB, 1)
    share = _task(0, "share", 1000, 200, 0.0, 10 * MAX_WAIT)
    whole = _task(1, "whole", 1000, 1000, 1.0, 10.0)
    hold(node, share, devices_for(node, share) or (), 1)
    assert node.free_gpu == [800]
    assert devices_for(node, whole) is None
    out = replay([share, whole], [Node.of("n0", 16000, 64 * GIB, 1)], _first)
    assert out["share"]["admitted"] == 1
    assert out["whole"]["admitted"] == 0  # refused at the deadline, before the share ends


def test_shares_pack_one_device_and_whole_pods_take_free_devices_only() -> None:
    node = Node.of("n0", 16000, 64 * GIB, 2)
    a, b = _task(0, "share", 100, 600, 0, 1), _task(1, "share", 100, 300, 0, 1)
    hold(node, a, devices_for(node, a) or (), 1)
    assert devices_for(node, b) == (0,)  # the fullest device it fits on
    assert devices_for(node, _task(2, "whole2", 100, 1000, 0, 1)) is None
    assert devices_for(node, _task(3, "whole", 100, 1000, 0, 1)) == (1,)


def test_every_pod_needs_its_cpu_and_memory() -> None:
    node = Node.of("n0", 4000, 64 * GIB, 1)
    assert devices_for(node, _task(0, "cpu", 5000, 0, 0, 1)) is None
    assert devices_for(node, _task(1, "whole", 5000, 1000, 0, 1)) is None
    big = Task(2, "t2", "share", 1000, 65 * GIB, 1, 100, 0, 1)
    assert devices_for(node, big) is None


def test_capacity_is_freed_at_departure_and_the_waiting_pod_placed() -> None:
    first = _task(0, "whole", 1000, 1000, 0.0, 100.0)
    second = _task(1, "whole", 1000, 1000, 10.0, 100.0)
    out = replay([first, second], [Node.of("n0", 16000, 64 * GIB, 1)], _first)
    assert out["whole"]["admitted"] == 2
    assert out["whole"]["wait_s"]["p99"] == 90.0
    late = _task(1, "whole", 1000, 1000, 10.0, 100.0)
    slow = _task(0, "whole", 1000, 1000, 0.0, MAX_WAIT + 20.0)
    out = replay([slow, late], [Node.of("n0", 16000, 64 * GIB, 1)], _first)
    assert out["whole"]["admitted"] == 1  # still waiting at its deadline


def test_arrivals_only_never_frees_anything() -> None:
    first = _task(0, "whole", 1000, 1000, 0.0, 1.0)
    second = _task(1, "whole", 1000, 1000, 10.0, 1.0)
    out = replay([first, second], [Node.of("n0", 16000, 64 * GIB, 1)], _first, churn=False)
    assert out["whole"]["admitted"] == 1
    assert out["arrival_only"]["end"]["unallocated_gpus"] == 0


def _stranding_case() -> tuple[list[Task], list[Node]]:
    # First fit puts the CPU task on the GPU node (first by name), whose CPU the whole-GPU
    # task then lacks; a CPU-only node had room for it.
    nodes = [Node.of("a-gpu", 8000, 64 * GIB, 1), Node.of("b-cpu", 8000, 64 * GIB, 0)]
    cpu = _task(0, "cpu", 6000, 0, 0.0, 1000.0)
    whole = _task(1, "whole", 4000, 1000, 1.0, 1000.0)
    return [cpu, whole], nodes


def test_the_oracle_admits_at_least_what_first_fit_admits_where_first_fit_strands() -> None:
    tasks, nodes = _stranding_case()
    first = replay(tasks, nodes, _first)
    proven = replay(tasks, nodes, None, oracle="proven")
    generous = replay(tasks, nodes, None, oracle="generous")
    assert first["total"]["refused"] == 1
    assert proven["total"]["refused"] == 0
    assert generous["total"]["refused"] == 0


def test_the_repair_moves_a_running_task_to_make_room() -> None:
    tasks, nodes = _stranding_case()
    cpu, whole = tasks
    hold(nodes[0], cpu, (), 1)
    placements: dict[int, Placement] = {0: (0, ())}
    moves = make_room(nodes, placements, tasks, whole)
    assert moves == [(0, (1, ())), (1, (0, (0,)))]
    assert nodes[0].free_cpu == 4000 and nodes[0].free_gpu == [0]
    assert nodes[1].free_cpu == 2000
    # Nowhere to move it: nothing changes.
    tasks, nodes = _stranding_case()
    nodes[1] = Node.of("b-cpu", 4000, 64 * GIB, 0)
    hold(nodes[0], tasks[0], (), 1)
    assert make_room(nodes, placements | {0: (0, ())}, tasks, tasks[1]) is None
    assert nodes[0].free_cpu == 2000 and nodes[1].free_cpu == 4000


def test_fgd_counts_free_share_a_task_type_cannot_use() -> None:
    share_type = (1000, GIB, 1, 500)
    whole_type = (1000, GIB, 1, 1000)
    measure = Fragmentation({share_type: 0.5, whole_type: 0.5})
    node = Node.of("n0", 8000, 64 * GIB, 2)
    assert measure.of(node) == 0.0
    node.free_gpu = [300, 1000]
    # The 300 left on device 0 serves neither type; device 1 serves both.
    assert measure.of(node) == 300.0
    node.free_gpu = [600, 1000]
    # 600 serves the share type only: a fragment to the whole-GPU half.
    assert measure.of(node) == 300.0
    node.free_cpu = 500
    # Neither type fits the node's CPU: every free milli is a fragment.
    assert measure.of(node) == 1600.0
    assert Fragmentation({share_type: 1.0}).of(Node.of("cpu", 8000, GIB, 0)) == 0.0


def test_one_tenant_per_shared_device_when_the_fleet_keeps_tenants_apart() -> None:
    """`bench_tenants_mixed.py`'s model of `inference_policy.placing.tenancy`: on a node built with
    tenants, a share goes only on a device no other tenant's share holds; the device is free
    to anyone once its shares leave. Without tenants, shares mix as before."""
    apart, free = Node.of("n0", 16000, 64 * GIB, 1, tenants=2), Node.of("n1", 16000, 64 * GIB, 1)
    first = _task(0, "share", 1000, 200, 0.0, 10.0)
    other = _task(1, "share", 1000, 200, 1.0, 10.0)
    same = _task(2, "share", 1000, 200, 2.0, 10.0)
    first.tenant, other.tenant, same.tenant = 0, 1, 0
    for node in (apart, free):
        hold(node, first, devices_for(node, first) or (), 1)
    assert devices_for(apart, other) is None and devices_for(free, other) == (0,)
    assert devices_for(apart, same) == (0,)
    assert apart.owned() == (800,) and free.owned() == ()
    hold(apart, first, (0,), -1)
    assert apart.owner == [-1] and devices_for(apart, other) == (0,)
    # The stranded measure: a device another tenant holds is usable by a share type only with
    # the chance (1 / tenants) that the next such task is that tenant's.
    measure = Fragmentation({(1000, GIB, 1, 200): 1.0})
    hold(apart, first, (0,), 1)
    assert measure.of(free) == 0.0
    assert measure.of(apart) == 400.0
    assert apart.copy_empty().tenants == 2
