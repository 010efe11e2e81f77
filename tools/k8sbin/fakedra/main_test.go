package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var fixture = Fixture{
	Product:           "NVIDIA-H200",
	ComputeCapability: "9.0",
	DriverVersion:     "580.95.05",
	CUDADriverVersion: "13.0",
	MemoryGB:          141,
	MemoryMiB:         143771,
	Devices: []Device{
		{Index: 0, UUID: "GPU-5f2c3a1e-8b7d-4c21-9e6a-0d4b7c1a2f01"},
		{Index: 1, UUID: "GPU-a91e07d4-3c55-4f8e-b2d0-6e8f1c3b4a02", MIG: []MIG{{Profile: "3g.71gb", UUID: "MIG-1"}}},
	},
}

func TestDevicesAreSpelledAsTheDriverPublishesThem(t *testing.T) {
	published, uuids, err := devices(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if len(published) != 1 || published[0].Name != "gpu-0" {
		t.Fatalf("want one whole GPU gpu-0 (the MIG-cut one left out), got %+v", published)
	}
	a := published[0].Attributes
	for name, want := range map[resourceapi.QualifiedName]string{
		"type": "gpu", "productName": "NVIDIA H200", "architecture": "Hopper",
		"uuid": fixture.Devices[0].UUID,
	} {
		if got := a[name].StringValue; got == nil || *got != want {
			t.Errorf("%s: want %q, got %v", name, want, got)
		}
	}
	for name, want := range map[resourceapi.QualifiedName]string{
		"cudaComputeCapability": "9.0.0", "driverVersion": "580.95.5", "cudaDriverVersion": "13.0.0",
	} {
		if got := a[name].VersionValue; got == nil || *got != want {
			t.Errorf("%s: want %q, got %v", name, want, got)
		}
	}
	memory := published[0].Capacity["memory"].Value
	if memory.String() != "143771Mi" {
		t.Errorf("memory: want 143771Mi, got %s", memory.String())
	}
	if uuids["gpu-0"] != fixture.Devices[0].UUID {
		t.Errorf("uuids: %v", uuids)
	}
}

func TestABadVersionIsNamed(t *testing.T) {
	bad := fixture
	bad.DriverVersion = "580.x"
	if _, _, err := devices(bad); err == nil || err.Error() != `version "580.x": "x" is not a number` {
		t.Fatalf("want the version named, got %v", err)
	}
}

func claim(pool, device string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "0e1f"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "tmi-devices/b0", Driver: driverName, Pool: pool, Device: device},
			}},
		}},
	}
}

func TestPrepareWritesTheClaimsCDISpecAndUnprepareRemovesIt(t *testing.T) {
	dir := t.TempDir()
	p := &plugin{cdiDir: dir, node: "n", uuids: map[string]string{"gpu-0": "GPU-abc"}}
	result := p.prepare(claim("n", "gpu-0"))
	if result.Err != nil {
		t.Fatal(result.Err)
	}
	if len(result.Devices) != 1 || result.Devices[0].CDIDeviceIDs[0] != "k8s.gpu.nvidia.com/claim=0e1f-gpu-0" {
		t.Fatalf("devices: %+v", result.Devices)
	}
	body, err := os.ReadFile(filepath.Join(dir, "k8s.gpu.nvidia.com-claim_0e1f.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdiSpec
	if err := json.Unmarshal(body, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Kind != cdiKind || len(spec.Devices) != 1 || spec.Devices[0].ContainerEdits.Env[0] != "NVIDIA_VISIBLE_DEVICES=GPU-abc" {
		t.Fatalf("spec: %s", body)
	}
	if p.prepare(claim("other-node", "gpu-0")).Err == nil {
		t.Fatal("a device of another node's pool was prepared")
	}
	if p.prepare(claim("n", "gpu-9")).Err == nil {
		t.Fatal("a device the node does not have was prepared")
	}
}
