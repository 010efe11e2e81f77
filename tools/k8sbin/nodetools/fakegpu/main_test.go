package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubelet plays the kubelet's Registration service on kubelet.sock.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu       sync.Mutex
	requests []*pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.requests = append(k.requests, r)
	return &pluginapi.Empty{}, nil
}

func (k *kubelet) registered() map[string]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]string{}
	for _, r := range k.requests {
		out[r.ResourceName] = r.Endpoint
	}
	return out
}

var fixture = Fixture{
	Product:    "NVIDIA-A100-SXM4-80GB",
	MemoryGB:   4,
	VRAMBudget: true,
	Devices: []Device{
		{Index: 0, UUID: "GPU-aaaa"},
		{Index: 1, UUID: "GPU-bbbb", MIG: []MIG{{Profile: "3g.40gb", UUID: "MIG-1"}, {Profile: "3g.40gb", UUID: "MIG-2"}}},
	},
}

func TestResourcesFollowTheFixture(t *testing.T) {
	res, err := resources(fixture)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range res {
		got[r.name] = len(r.devices)
	}
	want := map[string]int{
		"nvidia.com/gpu":            1, // GPU-bbbb is partitioned: only its MIG instances
		"nvidia.com/mig-3g.40gb":    2,
		"kamiwaza.ai/vram-gb-gpu-0": 4,
		"kamiwaza.ai/vram-gb-gpu-1": 4,
	}
	if len(got) != len(want) {
		t.Fatalf("resources %v, want %v", got, want)
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s: %d devices, want %d", name, got[name], n)
		}
	}
	if _, err := resources(Fixture{Devices: []Device{{UUID: "0000"}}}); err == nil {
		t.Error("a UUID without the GPU- prefix was accepted")
	}
}

func TestTimeSlicedReplicasShareTheirDevice(t *testing.T) {
	res, err := resources(Fixture{Replicas: 2, Devices: []Device{{UUID: "GPU-cccc"}}})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for id, uuid := range res[0].devices {
		ids = append(ids, id)
		if uuid != "GPU-cccc" {
			t.Errorf("replica %s maps to %s", id, uuid)
		}
	}
	sort.Strings(ids)
	if len(ids) != 2 || ids[0] != "GPU-cccc::0" || ids[1] != "GPU-cccc::1" {
		t.Errorf("replicas %v", ids)
	}
}

// TestRegistersListsAndAllocatesOverTheRealAPI runs the plugin against a kubelet stand-in on a
// socket directory: every resource registers, ListAndWatch lists its devices, and Allocate
// answers NVIDIA_VISIBLE_DEVICES with the UUIDs behind the device IDs it was given.
func TestRegistersListsAndAllocatesOverTheRealAPI(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "fakegpu-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	res, _ := resources(fixture)
	var plugins []*plugin
	for _, r := range res {
		plugins = append(plugins, &plugin{res: r, socket: socketName(r.name)})
	}
	stop := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- run(dir, plugins, stop) }()
	defer func() { stop <- syscall.SIGTERM; <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for len(k.registered()) < len(res) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	endpoints := k.registered()
	if len(endpoints) != len(res) {
		t.Fatalf("registered %v, want %d resources", endpoints, len(res))
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoints["nvidia.com/mig-3g.40gb"]),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	listed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.Devices) != 2 || listed.Devices[0].ID != "MIG-1" || listed.Devices[0].Health != pluginapi.Healthy {
		t.Errorf("listed %v", listed.Devices)
	}
	answer, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"MIG-2"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := answer.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "MIG-2" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want MIG-2", got)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}},
	}); err == nil {
		t.Error("an unknown device was allocated")
	}
}
