"""The evidence readers on recorded output: nvidia-smi's XML, CSV, `-L` and `mig -lgi/-lci`,
NVML's process structs (through the fake), and `/proc/<pid>/cgroup` in every kubelet layout."""

from __future__ import annotations

import pynvml
import pytest

from inference_policy.tools.detection import DetectionError
from tests.evidencekit import (
    GPU,
    H200_UUID,
    MIB,
    MIG,
    SHARED,
    FakeEvidenceNvml,
    FakeSmi,
    load,
)
from tmi_cli.cgroups import owner_from_cgroup, read_owners
from tmi_cli.gpu_processes import (
    NvidiaSmiReader,
    NvmlReader,
    open_reader,
    parse_compute_apps,
    parse_list_gpus,
    parse_mig_lci,
    parse_mig_lgi,
    parse_smi_xml,
)
from tmi_cli.nvidia_smi import ABSENT_VALUES, NvidiaSmiUnavailable
from tmi_cli.nvml import NvmlUnavailable

REAL = GPU / "h200-1x"


def test_the_real_h200_report_has_one_gpu_no_processes_and_no_mig() -> None:
    report = parse_smi_xml((REAL / "nvidia-smi-q.xml").read_text())
    (device,) = report.devices
    assert device.uuid == H200_UUID and device.name == "NVIDIA H200"
    assert device.memory_total_bytes == 143771 * MIB
    assert device.mig_enabled is False and device.mig_instances == ()
    assert report.processes == () and report.driver == "580.159.04"


def test_the_shared_report_lists_each_compute_process_with_its_memory() -> None:
    report = parse_smi_xml((SHARED / "nvidia-smi-q.xml").read_text())
    found = {p.pid: (p.used_bytes, p.gpu_instance_id, p.name) for p in report.processes}
    assert found[41021] == (22032 * MIB, None, "python3")
    assert found[39001] == (1536 * MIB, None, "/usr/bin/python3")
    assert len(found) == 5


def test_the_mig_report_carries_instances_and_each_process_instance() -> None:
    report = parse_smi_xml((MIG / "nvidia-smi-q.xml").read_text())
    (device,) = report.devices
    assert device.mig_enabled is True
    assert [(m.gpu_instance_id, m.memory_total_bytes) for m in device.mig_instances] == [
        (2, 71424 * MIB),
        (7, 16384 * MIB),
        (8, 16384 * MIB),
    ]
    assert {p.pid: p.gpu_instance_id for p in report.processes} == {51001: 2, 51200: 7, 51300: 8}


def test_an_unreadable_xml_report_is_refused() -> None:
    with pytest.raises(DetectionError):
        parse_smi_xml("<nvidia_smi_log><gpu>")
    with pytest.raises(DetectionError, match="no UUID"):
        parse_smi_xml("<nvidia_smi_log><gpu><uuid>N/A</uuid></gpu></nvidia_smi_log>")


def test_compute_apps_csv_by_column_name() -> None:
    rows = parse_compute_apps((SHARED / "nvidia-smi-compute-apps.csv").read_text())
    assert [(r.pid, r.used_bytes) for r in rows][:2] == [(41021, 22032 * MIB), (41377, 10240 * MIB)]
    assert all(r.gpu_uuid == H200_UUID for r in rows)
    mig = parse_compute_apps((MIG / "nvidia-smi-compute-apps.csv").read_text())
    assert [r.used_bytes for r in mig] == [None, None, None]  # "[N/A]" on MIG
    assert parse_compute_apps("No running processes found\n") == []
    reordered = "pid, used_memory [MiB], gpu_uuid\n7, 12, GPU-x\n"
    assert parse_compute_apps(reordered)[0].used_bytes == 12 * MIB
    with pytest.raises(DetectionError, match="gpu_uuid"):
        parse_compute_apps("pid, used_memory\n1, 2\n")


@pytest.mark.parametrize("absent", sorted(ABSENT_VALUES))
def test_evidence_reads_nvidia_smi_absent_values_as_detect_does(absent: str) -> None:
    # One set for `tmi detect` and `tmi evidence` (`tmi_cli.nvidia_smi.ABSENT_VALUES`).
    csv = f"pid, gpu_uuid, process_name, used_memory [MiB]\n7, GPU-x, {absent}, {absent}\n"
    (row,) = parse_compute_apps(csv)
    assert (row.name, row.used_bytes) == (None, None)
    xml = f"<nvidia_smi_log><gpu><uuid>  {absent}\n</uuid></gpu></nvidia_smi_log>"
    with pytest.raises(DetectionError, match="no UUID"):
        parse_smi_xml(xml)


def test_none_is_not_one_of_nvidia_smis_absent_values() -> None:
    # nvidia-smi prints "None" for an empty list (`<mig_devices>` in the recorded reports),
    # which no reader takes as a value; where a value is read, "None" is what was printed.
    (row,) = parse_compute_apps("pid, gpu_uuid, process_name\n7, GPU-x, None\n")
    assert row.name == "None"


def test_mig_listings() -> None:
    listed = parse_list_gpus((MIG / "nvidia-smi-L.txt").read_text())
    assert [(i, p) for i, p, _ in listed[H200_UUID]] == [
        (0, "3g.71gb"),
        (1, "1g.18gb"),
        (2, "1g.18gb"),
    ]
    assert parse_list_gpus((REAL / "nvidia-smi-extra.txt").read_text()) == {H200_UUID: []}
    lgi = parse_mig_lgi((MIG / "nvidia-smi-mig-lgi.txt").read_text())
    assert lgi == {(0, 7): "1g.18gb", (0, 8): "1g.18gb", (0, 2): "3g.71gb"}
    lci = parse_mig_lci((MIG / "nvidia-smi-mig-lci.txt").read_text())
    assert lci == {(0, 7): [0], (0, 8): [0], (0, 2): [0]}
    # The profile table (-lgip) is not a list of instances.
    assert parse_mig_lgi((REAL / "nvidia-smi-extra.txt").read_text()) == {}


def test_the_nvidia_smi_reader_names_mig_instances_from_lgi_and_L() -> None:
    reader = NvidiaSmiReader(FakeSmi(MIG))
    (device,) = reader.devices()
    assert [(m.gpu_instance_id, m.profile, m.uuid) for m in device.mig_instances][1] == (
        7,
        "1g.18gb",
        "MIG-8c41d7e2-3b5a-5f06-8e19-4a7b2c9d0e63",
    )
    sample = reader.sample(0, "t")
    assert {p.pid: p.used_bytes for p in sample.processes}[51300] == 16100 * MIB


def test_the_nvidia_smi_reader_refuses_a_failed_report() -> None:
    with pytest.raises(DetectionError, match="exited 6"):
        NvidiaSmiReader(FakeSmi(SHARED, missing=["nvidia-smi-q.xml"]))


def test_the_nvml_reader_reads_mig_instances_through_their_own_handles() -> None:
    reader = NvmlReader(FakeEvidenceNvml(load(MIG, "nvml-samples.json")))
    (device,) = reader.devices()
    assert device.mig_instances[0].uuid == "MIG-2f6b8a6e-0c1d-5e4f-9a3b-7d2c1e0f4a51"
    sample = reader.sample(0, "t")
    # The parent's list leaves memory out; the instances' lists carry it.
    assert {p.pid: p.used_bytes for p in sample.processes} == {
        51001: 60000 * MIB,
        51200: 14336 * MIB,
        51300: 12288 * MIB,
    }
    reader.close()


def test_the_nvml_reader_maps_the_no_instance_id_to_none_and_reads_utilisation() -> None:
    reader = NvmlReader(FakeEvidenceNvml(load(SHARED, "nvml-samples.json")))
    first = {p.pid: p for p in reader.sample(0, "t").processes}
    assert first[41021].gpu_instance_id is None and first[41021].sm_util_percent == 61
    assert 42210 not in first
    third = reader.sample(1, "t"), reader.sample(2, "t")
    assert {p.pid for p in third[1].processes} >= {42210, 43100}


def test_open_reader_falls_back_to_nvidia_smi_and_says_why_when_neither_answers() -> None:
    missing = FakeEvidenceNvml(
        load(SHARED, "nvml-samples.json"), init="ERR NVMLError_LibraryNotFound: x"
    )
    reader = open_reader(missing, FakeSmi(SHARED))
    assert reader.source == "nvidia-smi"

    def absent(args: object) -> object:
        raise FileNotFoundError("nvidia-smi")

    with pytest.raises(DetectionError, match="cannot read the GPUs") as caught:
        open_reader(missing, absent)  # type: ignore[arg-type]
    assert not isinstance(caught.value, (NvmlUnavailable, NvidiaSmiUnavailable))
    with pytest.raises(DetectionError, match="could not start"):
        NvmlReader(FakeEvidenceNvml({}, init="ERR NVMLError_NoPermission: x"))
    assert pynvml.NVML_ERROR_NO_PERMISSION


# -- /proc/<pid>/cgroup --------------------------------------------------------------------------

UID = "3f6c1d2e-8a4b-4c5d-9e6f-0a1b2c3d4e5f"
U_ = UID.replace("-", "_")
CID = "4f1c2b7e9d3a5c8b6e0f1a2d3c4b5a69788766554433221100ffeeddccbbaa99"


@pytest.mark.parametrize(
    "text",
    [
        # v2, systemd driver, Burstable and BestEffort and Guaranteed
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}"
        f".slice/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}"
        f".slice/crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{U_}.slice/docker-{CID}.scope\n",
        # v2 from inside another cgroup namespace
        f"0::/../../kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope\n",
        # cgroupfs driver, v2 and v1 (several hierarchies)
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        f"12:pids:/kubepods/pod{UID}/{CID}\n9:memory:/kubepods/pod{UID}/{CID}\n0::/\n",
    ],
    ids=["v2-systemd", "v2-systemd-crio", "v2-guaranteed", "v2-cgroupns", "v2-cgroupfs", "v1"],
)
def test_every_kubelet_cgroup_layout_names_the_pod_and_container(text: str) -> None:
    owner = owner_from_cgroup(text)
    assert owner.pod_uid == UID
    assert owner.container_id == CID


def test_a_process_outside_kubepods_belongs_to_no_pod() -> None:
    owner = owner_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n")
    assert owner.pod_uid is None and owner.cgroup.startswith("/user.slice")
    assert owner_from_cgroup("0::/system.slice/containerd.service\n").pod_uid is None
    # "kubepods" alone (the Pod-level cgroup of nothing) names no Pod.
    assert owner_from_cgroup("0::/kubepods.slice/kubepods-burstable.slice\n").pod_uid is None
    static = "0::/kubepods/besteffort/pod6d3b2e7f0c1a4b5c8d9e0f1a2b3c4d5e/" + CID + "\n"
    assert owner_from_cgroup(static).pod_uid == "6d3b2e7f0c1a4b5c8d9e0f1a2b3c4d5e"


def test_read_owners_leaves_out_a_pid_that_is_gone() -> None:
    owners = read_owners([41021, 42210, 99999], proc=str(SHARED / "proc"))
    assert set(owners) == {41021, 42210}
    assert owners[42210].pod_uid == "c81f4a27-9b3e-4d5c-a6f7-2b3c4d5e6f70"
