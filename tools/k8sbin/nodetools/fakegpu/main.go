// Command tmi-fakegpu is a device plugin for simulated NVIDIA GPUs: it speaks the kubelet's real
// device-plugin API (v1beta1: Registration on the kubelet's socket, then ListAndWatch and
// Allocate on its own socket per resource) for devices described in a fixture, so the local
// cluster's real node advertises nvidia.com/gpu, nvidia.com/mig-<profile> and the owner's
// kamiwaza.ai/vram-gb-gpu-<i> buckets the way NVIDIA's plugin and Kamiwaza's VRAM plugin would,
// and the kubelet hands containers the device UUIDs it allocated. No GPU or driver is needed;
// nothing here is installed with tmi. Built by tools/k8sbin/build-node.sh.
//
//	tmi-fakegpu -fixture devices.json [-plugin-dir /var/lib/kubelet/device-plugins]
//
// Allocate answers as NVIDIA's plugin does with DEVICE_LIST_STRATEGY=envvar: the allocated
// device UUIDs, comma-separated, in NVIDIA_VISIBLE_DEVICES. A kubelet restart removes every
// socket in the plugin directory; the plugin notices its socket gone and registers again.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Fixture is the simulated node's GPUs; localcluster/fake_gpus.py reads the same file for the
// labels GPU Feature Discovery would publish.
type Fixture struct {
	// Read by localcluster (GPU Feature Discovery labels) and not by the plugin.
	ComputeCapability string `json:"computeCapability"`
	DriverVersion     string `json:"driverVersion"`
	CUDADriverVersion string `json:"cudaDriverVersion"`

	Product    string   `json:"product"`
	MemoryGB   int      `json:"memoryGB"`
	VRAMBudget bool     `json:"vramBudget"`
	Replicas   int      `json:"replicas"`
	MemoryMiB  int      `json:"memoryMiB"`
	Devices    []Device `json:"devices"`
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

// resource is one advertised resource: its device IDs, and for each ID the UUID a container
// allocated it sees.
type resource struct {
	name    string
	devices map[string]string
}

func resources(f Fixture) ([]resource, error) {
	whole := resource{name: "nvidia.com/gpu", devices: map[string]string{}}
	mig := map[string]*resource{}
	var out []resource
	replicas := f.Replicas
	if replicas < 1 {
		replicas = 1
	}
	for _, d := range f.Devices {
		if !strings.HasPrefix(d.UUID, "GPU-") {
			return nil, fmt.Errorf("device %d: uuid %q does not start with GPU-", d.Index, d.UUID)
		}
		if len(d.MIG) == 0 {
			for r := 0; r < replicas; r++ {
				id := d.UUID
				if replicas > 1 {
					// NVIDIA's time-slicing names each replica <uuid>::<n>.
					id = fmt.Sprintf("%s::%d", d.UUID, r)
				}
				whole.devices[id] = d.UUID
			}
		}
		for _, m := range d.MIG {
			name := "nvidia.com/mig-" + m.Profile
			if mig[name] == nil {
				mig[name] = &resource{name: name, devices: map[string]string{}}
			}
			mig[name].devices[m.UUID] = m.UUID
		}
		if f.VRAMBudget && f.MemoryGB > 0 {
			bucket := resource{
				name:    fmt.Sprintf("kamiwaza.ai/vram-gb-gpu-%d", d.Index),
				devices: map[string]string{},
			}
			for gb := 0; gb < f.MemoryGB; gb++ {
				bucket.devices[fmt.Sprintf("%s-gb-%d", d.UUID, gb)] = d.UUID
			}
			out = append(out, bucket)
		}
	}
	if len(whole.devices) > 0 {
		out = append(out, whole)
	}
	for _, r := range mig {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	res    resource
	socket string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ids := make([]string, 0, len(p.res.devices))
	for id := range p.res.devices {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	devs := make([]*pluginapi.Device, 0, len(ids))
	for _, id := range ids {
		devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		seen := map[string]bool{}
		var uuids []string
		for _, id := range c.DevicesIds {
			uuid, ok := p.res.devices[id]
			if !ok {
				return nil, fmt.Errorf("%s: unknown device %q", p.res.name, id)
			}
			if !seen[uuid] {
				seen[uuid] = true
				uuids = append(uuids, uuid)
			}
		}
		log.Printf("allocate %s %v -> NVIDIA_VISIBLE_DEVICES=%s", p.res.name, c.DevicesIds, strings.Join(uuids, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) serve(dir string) (*grpc.Server, error) {
	path := filepath.Join(dir, p.socket)
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}

func register(dir string, p *plugin) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.socket,
		ResourceName: p.res.name,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

// run serves and registers every plugin, and again whenever the kubelet has removed a socket.
func run(dir string, plugins []*plugin, stop <-chan os.Signal) error {
	servers := map[string]*grpc.Server{}
	defer func() {
		for _, s := range servers {
			s.Stop()
		}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range plugins {
			if _, err := os.Stat(filepath.Join(dir, p.socket)); err == nil && servers[p.socket] != nil {
				continue
			}
			if s := servers[p.socket]; s != nil {
				s.Stop()
				delete(servers, p.socket)
			}
			if _, err := os.Stat(filepath.Join(dir, "kubelet.sock")); err != nil {
				continue // the kubelet is not up yet
			}
			srv, err := p.serve(dir)
			if err != nil {
				return fmt.Errorf("%s: serve: %w", p.res.name, err)
			}
			if err := register(dir, p); err != nil {
				log.Printf("%s: register: %v (retrying)", p.res.name, err)
				srv.Stop()
				continue
			}
			servers[p.socket] = srv
			log.Printf("registered %s (%d devices) at %s", p.res.name, len(p.res.devices), p.socket)
		}
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
	}
}

// socketName is the plugin's socket in the kubelet's directory, one per resource.
func socketName(resource string) string {
	return "tmi-fakegpu-" + strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
}

func main() {
	fixture := flag.String("fixture", "", "JSON file describing the simulated GPUs")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	raw, err := os.ReadFile(*fixture)
	if err != nil {
		log.Fatalf("fixture: %v", err)
	}
	var f Fixture
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		log.Fatalf("fixture %s: %v", *fixture, err)
	}
	res, err := resources(f)
	if err != nil {
		log.Fatalf("fixture %s: %v", *fixture, err)
	}
	var plugins []*plugin
	for _, r := range res {
		plugins = append(plugins, &plugin{res: r, socket: socketName(r.name)})
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if err := run(*dir, plugins, stop); err != nil {
		log.Fatal(err)
	}
}
