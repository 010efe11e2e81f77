// Command tmi-oci assembles an OCI image layout from layer tarballs, with no registry and no
// container runtime: the machines that build and test tmi reach no image registry, so the
// image is proven by assembling it from its parts (a base root filesystem and the application
// layer) and running the servers from the result. Built by tools/k8sbin/build.sh.
//
//	tmi-oci -out DIR -tag tmi:dev -user 65532:65532 -env PATH=/opt/tmi/bin:/usr/bin \
//	        -cmd tmi,--help layer1.tar layer2.tar ...
//
// It prints the manifest digest. DIR is replaced.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	out := flag.String("out", "", "OCI layout directory to write (replaced)")
	tag := flag.String("tag", "", "org.opencontainers.image.ref.name of the image in the index")
	user := flag.String("user", "65532:65532", "the image's user")
	cmd := flag.String("cmd", "", "comma-separated default command")
	arch := flag.String("arch", "amd64", "architecture")
	var env, labels list
	flag.Var(&env, "env", "NAME=VALUE, repeatable")
	flag.Var(&labels, "label", "NAME=VALUE, repeatable")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: tmi-oci -out DIR [flags] LAYER.tar...")
		os.Exit(2)
	}
	if err := run(*out, *tag, *user, *cmd, *arch, env, labels, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "tmi-oci:", err)
		os.Exit(1)
	}
}

func run(out, tag, user, cmd, arch string, env, labels list, layers []string) error {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, path := range layers {
		layer, err := tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return fmt.Errorf("layer %s: %w", path, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Config.User = user
	cfg.Config.Env = env
	if cmd != "" {
		cfg.Config.Cmd = strings.Split(cmd, ",")
	}
	cfg.Config.Labels = map[string]string{}
	for _, kv := range labels {
		name, value, _ := strings.Cut(kv, "=")
		cfg.Config.Labels[name] = value
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	annotations := map[string]string{}
	if tag != "" {
		annotations["org.opencontainers.image.ref.name"] = tag
	}
	if err := p.AppendImage(img, layout.WithAnnotations(annotations), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}
