package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// The command line and main, shared by this hollow kubelet and the old control
// plane's (gomod/kubernetes-legacy/hollow-kubelet links this file).

type options struct {
	kubeconfig    string
	name          string
	providerID    string
	systemUUID    string
	bootID        string
	rootDir       string
	leaseSeconds  int
	statusSeconds int
	reportSeconds int
	labels        keyValues
	drivers       keyValues
	topology      keyValues
}

// keyValues is a repeatable or comma-separated KEY=VALUE flag, kept in order.
type keyValues [][2]string

func (kv *keyValues) String() string {
	parts := make([]string, 0, len(*kv))
	for _, p := range *kv {
		parts = append(parts, p[0]+"="+p[1])
	}
	return strings.Join(parts, ",")
}

func (kv *keyValues) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not KEY=VALUE", part)
		}
		*kv = append(*kv, [2]string{k, v})
	}
	return nil
}

func (kv keyValues) asMap() map[string]string {
	m := make(map[string]string, len(kv))
	for _, p := range kv {
		m[p[0]] = p[1]
	}
	return m
}

func parse() (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("hollow-kubelet", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the apiserver (required)")
	fs.StringVar(&o.name, "name", "", "the Node's name (required)")
	fs.StringVar(&o.providerID, "provider-id", "", "the Node's spec.providerID (none on-premises)")
	fs.StringVar(&o.systemUUID, "system-uuid", "", "the systemUUID the Node reports (its machine's SMBIOS UUID)")
	fs.StringVar(&o.bootID, "boot-id", "", "the boot id the Node reports (default: a new random one, as each boot has)")
	fs.StringVar(&o.rootDir, "root-dir", "", "the kubelet's state directory, created if missing (required)")
	fs.IntVar(&o.leaseSeconds, "node-lease-seconds", 40, "the Lease's duration; the kubelet renews it every quarter of it")
	fs.IntVar(&o.statusSeconds, "node-status-update-seconds", 10, "how often the kubelet computes its node status")
	fs.IntVar(&o.reportSeconds, "node-status-report-seconds", 0, "how often the kubelet posts its node status when nothing changed (0: kubemark's 5 minutes)")
	fs.Var(&o.labels, "node-labels", "labels the kubelet registers the Node with (KEY=VALUE, repeatable)")
	fs.Var(&o.drivers, "csi-driver", "a CSI driver to serve and register: NAME=NODE_ID (repeatable)")
	fs.Var(&o.topology, "csi-topology", "the CSI node's accessible topology (KEY=VALUE, repeatable)")
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return nil, err
	}
	for flagName, v := range map[string]string{"kubeconfig": o.kubeconfig, "name": o.name, "root-dir": o.rootDir} {
		if v == "" {
			return nil, fmt.Errorf("--%s is required", flagName)
		}
	}
	if o.leaseSeconds < 1 || o.statusSeconds < 1 || o.reportSeconds < 0 {
		return nil, errors.New("--node-lease-seconds and --node-status-update-seconds must be at least 1, --node-status-report-seconds at least 0")
	}
	if o.bootID == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		o.bootID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	}
	return o, nil
}

func main() {
	o, err := parse()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hollow-kubelet: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "hollow-kubelet: %v\n", err)
		os.Exit(1)
	}
}

// runtimeEndpoint is the fake container runtime's socket, in the state
// directory rather than the fake's default under /tmp, which outlives the
// process; a socket left by the kubelet's previous boot is removed first.
func runtimeEndpoint(o *options) (string, error) {
	if err := os.MkdirAll(o.rootDir, 0o750); err != nil {
		return "", err
	}
	path := filepath.Join(o.rootDir, "runtime.sock")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return "unix://" + path, nil
}
