// Command tmi-probe stands in for an engine on the local cluster's real node, where no CUDA and
// no engine image exist: started in a container, it prints one line, "tmi-probe {json}", with the
// environment the runtime actually gave its process, its user and its cgroups, then sleeps until
// it is stopped. The tests read that line from the container's log through the API server, so a
// device UUID or the shield's "void" is proven in the running container, not in a stored spec.
// With -listen it also serves the same JSON over HTTP (GET /), for readiness probes.
//
// `tmi-probe pause` is the Pod sandbox's pause process (the containerd sandbox image here): it
// waits for SIGTERM or SIGINT and reaps orphans meanwhile. Built by tools/k8sbin/build-node.sh.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

type report struct {
	Env    map[string]string `json:"env"`
	UID    int               `json:"uid"`
	GID    int               `json:"gid"`
	PID    int               `json:"pid"`
	Cgroup []string          `json:"cgroup"`
}

func collect() report {
	env := map[string]string{}
	// /proc/self/environ is what the runtime set up for this process; os.Environ reads the same.
	raw, err := os.ReadFile("/proc/self/environ")
	if err == nil {
		for _, kv := range strings.Split(string(raw), "\x00") {
			if name, value, ok := strings.Cut(kv, "="); ok {
				env[name] = value
			}
		}
	}
	var cgroups []string
	if text, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
			cgroups = append(cgroups, line)
		}
		sort.Strings(cgroups)
	}
	return report{Env: env, UID: os.Getuid(), GID: os.Getgid(), PID: os.Getpid(), Cgroup: cgroups}
}

func pause() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		return
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pause" {
		pause()
		return
	}
	listen := flag.String("listen", "", "address to serve the report on, e.g. :8080")
	flag.Parse()
	line, err := json.Marshal(collect())
	if err != nil {
		fmt.Fprintln(os.Stderr, "tmi-probe:", err)
		os.Exit(1)
	}
	fmt.Printf("tmi-probe %s\n", line)
	if *listen != "" {
		http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(collect())
		})
		go func() {
			if err := http.ListenAndServe(*listen, nil); err != nil {
				fmt.Fprintln(os.Stderr, "tmi-probe:", err)
				os.Exit(1)
			}
		}()
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
