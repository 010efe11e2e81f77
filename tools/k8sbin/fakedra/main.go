// Command tmi-fakedra is a DRA kubelet plugin for simulated NVIDIA GPUs: it registers with the
// kubelet as NVIDIA's DRA driver (gpu.nvidia.com) does, publishes the node's ResourceSlice with
// each fixture device's attributes spelled as that driver spells them, and prepares each
// allocated claim by writing a CDI spec that hands the container the device's UUID in
// NVIDIA_VISIBLE_DEVICES, which containerd applies from its CDI directory. The local cluster's
// real node then runs a DRA engine Pod end to end: scheduler allocation, kubelet preparation,
// CDI injection. No GPU or driver is needed; nothing here is installed with tmi. Built by
// tools/k8sbin/build-fakedra.sh, with k8s.io/dynamic-resource-allocation's kubeletplugin.
//
//	tmi-fakedra -fixture devices.json -node NAME -kubeconfig FILE -kubelet-dir DIR -cdi-dir DIR
//
// The fixture is the one tmi-fakegpu reads (localcluster/fake_gpus.py). GPU Feature Discovery
// writes a product name with dashes for spaces; the DRA driver publishes NVML's name, so the
// spaces are put back. The driver version is published as semver (leading zeros dropped).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

const (
	driverName = "gpu.nvidia.com"
	cdiKind    = "k8s.gpu.nvidia.com/claim"
)

// Fixture is the simulated node's GPUs, the file tmi-fakegpu reads.
type Fixture struct {
	Product           string   `json:"product"`
	ComputeCapability string   `json:"computeCapability"`
	DriverVersion     string   `json:"driverVersion"`
	CUDADriverVersion string   `json:"cudaDriverVersion"`
	MemoryGB          int      `json:"memoryGB"`
	MemoryMiB         int      `json:"memoryMiB"`
	VRAMBudget        bool     `json:"vramBudget"`
	Replicas          int      `json:"replicas"`
	Devices           []Device `json:"devices"`
}

type Device struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	MIG   []MIG  `json:"mig"`
}

type MIG struct {
	Profile string `json:"profile"`
	UUID    string `json:"uuid"`
}

// semver writes a dotted version with three parts and no leading zeros ("580.95.05" ->
// "580.95.5", "13.0" -> "13.0.0"), as the driver's version attributes are.
func semver(text string) (string, error) {
	parts := strings.Split(text, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return "", fmt.Errorf("version %q: want one to three dotted numbers", text)
	}
	out := make([]string, 3)
	for i := range out {
		out[i] = "0"
		if i < len(parts) {
			n, err := strconv.ParseUint(parts[i], 10, 32)
			if err != nil {
				return "", fmt.Errorf("version %q: %q is not a number", text, parts[i])
			}
			out[i] = strconv.FormatUint(n, 10)
		}
	}
	return strings.Join(out, "."), nil
}

// architecture is NVML's architecture name for a compute capability.
func architecture(cc string) string {
	switch {
	case strings.HasPrefix(cc, "7.0"), strings.HasPrefix(cc, "7.2"):
		return "Volta"
	case strings.HasPrefix(cc, "7.5"):
		return "Turing"
	case strings.HasPrefix(cc, "8.9"):
		return "Ada Lovelace"
	case strings.HasPrefix(cc, "8."):
		return "Ampere"
	case strings.HasPrefix(cc, "9."):
		return "Hopper"
	case strings.HasPrefix(cc, "10."), strings.HasPrefix(cc, "12."):
		return "Blackwell"
	}
	return "Unknown"
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func ver(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }

// devices is what the driver publishes for the fixture: one device per whole GPU, named
// gpu-<index>, with the UUID each container allocated it is handed.
func devices(f Fixture) ([]resourceapi.Device, map[string]string, error) {
	cc, err := semver(f.ComputeCapability)
	if err != nil {
		return nil, nil, err
	}
	driver, err := semver(f.DriverVersion)
	if err != nil {
		return nil, nil, err
	}
	cuda, err := semver(f.CUDADriverVersion)
	if err != nil {
		return nil, nil, err
	}
	memory := resource.MustParse(fmt.Sprintf("%dGi", f.MemoryGB))
	if f.MemoryMiB > 0 {
		memory = resource.MustParse(fmt.Sprintf("%dMi", f.MemoryMiB))
	}
	product := strings.ReplaceAll(f.Product, "-", " ")
	var out []resourceapi.Device
	uuids := map[string]string{}
	for _, d := range f.Devices {
		if len(d.MIG) > 0 {
			continue // MIG devices are not simulated here
		}
		if !strings.HasPrefix(d.UUID, "GPU-") {
			return nil, nil, fmt.Errorf("device %d: uuid %q does not start with GPU-", d.Index, d.UUID)
		}
		name := fmt.Sprintf("gpu-%d", d.Index)
		uuids[name] = d.UUID
		out = append(out, resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":                  str("gpu"),
				"productName":           str(product),
				"architecture":          str(architecture(f.ComputeCapability)),
				"cudaComputeCapability": ver(cc),
				"driverVersion":         ver(driver),
				"cudaDriverVersion":     ver(cuda),
				"uuid":                  str(d.UUID),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: memory},
			},
		})
	}
	if len(out) == 0 {
		return nil, nil, errors.New("the fixture has no whole GPU to publish")
	}
	return out, uuids, nil
}

// cdiSpec is one claim's CDI spec: a CDI device per allocated device, each setting the
// device's UUID as the container runtime hook of NVIDIA's driver would.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

type plugin struct {
	cdiDir string
	node   string
	uuids  map[string]string
	mu     sync.Mutex
}

func (p *plugin) specPath(uid types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("k8s.gpu.nvidia.com-claim_%s.json", uid))
}

// prepare writes the claim's CDI spec and says which CDI device each allocated device is.
func (p *plugin) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	spec := cdiSpec{Version: "0.6.0", Kind: cdiKind}
	var prepared []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != driverName {
			continue
		}
		uuid, ok := p.uuids[result.Device]
		if !ok || result.Pool != p.node {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %s/%s is not this node's", claim.Namespace, claim.Name, result.Pool, result.Device)}
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: cdiEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid}}})
		prepared = append(prepared, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + name},
		})
	}
	body, err := json.Marshal(spec)
	if err == nil {
		err = writeAtomic(p.specPath(claim.UID), body)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return kubeletplugin.PrepareResult{Devices: prepared}
}

// writeAtomic replaces path in one rename, so containerd never reads half a spec.
func writeAtomic(path string, body []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		out[claim.UID] = p.prepare(claim)
		log.Printf("prepared claim %s/%s (%s): %v", claim.Namespace, claim.Name, claim.UID, out[claim.UID].Err)
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	for _, claim := range claims {
		err := os.Remove(p.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[claim.UID] = err
		log.Printf("unprepared claim %s (%s): %v", claim.String(), claim.UID, err)
	}
	return out, nil
}

func (p *plugin) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		log.Fatalf("unrecoverable: %v", err)
	}
}

func main() {
	fixturePath := flag.String("fixture", "", "the simulated GPUs (JSON)")
	node := flag.String("node", "", "this node's name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's identity")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where containerd reads CDI specs")
	flag.Parse()
	if *fixturePath == "" || *node == "" || *kubeconfig == "" {
		log.Fatal("-fixture, -node and -kubeconfig are required")
	}
	text, err := os.ReadFile(*fixturePath)
	if err != nil {
		log.Fatal(err)
	}
	var fixture Fixture
	if err := json.Unmarshal(text, &fixture); err != nil {
		log.Fatalf("%s: %v", *fixturePath, err)
	}
	published, uuids, err := devices(fixture)
	if err != nil {
		log.Fatalf("%s: %v", *fixturePath, err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	dataDir := filepath.Join(*kubeletDir, "plugins", driverName)
	for _, dir := range []string{dataDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	p := &plugin{cdiDir: *cdiDir, node: *node, uuids: uuids}
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(*kubeletDir, "plugins_registry")),
	)
	if err != nil {
		log.Fatalf("starting the plugin: %v", err)
	}
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{*node: {Slices: []resourceslice.Slice{{Devices: published}}}},
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		log.Fatalf("publishing the ResourceSlice: %v", err)
	}
	log.Printf("serving %d devices of %s on node %s", len(published), driverName, *node)
	<-ctx.Done()
	helper.Stop()
}
