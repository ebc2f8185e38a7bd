// Command hollow-kubelet runs Kubernetes' hollow kubelet (pkg/kubemark: the
// real kubelet, its node status and Lease controllers, its volume manager and
// pod workers, over the kubelet's own fake container runtime) as one node of
// node-fencer's scenarios, with what kubemark's own command fixes set from
// flags: the providerID, the systemUUID and boot id the node reports, the
// Lease's duration and where the kubelet keeps its state.
//
// It also serves a CSI node service for the drivers it is given, registered
// through the kubelet's plugin-registration socket as a driver's
// node-driver-registrar would: the kubelet writes the CSINode and the
// node-id annotation itself, mounts the volumes it is given through it
// (nothing is mounted: NodePublishVolume only answers), and reports them in
// the Node's volumesInUse. The service lives and dies with the kubelet, as a
// machine's drivers do with its kubelet.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	cadvisorapi "github.com/google/cadvisor/info/v1"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
)

type options struct {
	kubeconfig    string
	name          string
	providerID    string
	systemUUID    string
	bootID        string
	rootDir       string
	leaseSeconds  int
	statusSeconds int
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
	if o.leaseSeconds < 1 || o.statusSeconds < 1 {
		return nil, errors.New("--node-lease-seconds and --node-status-update-seconds must be at least 1")
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

// machine is the fake cadvisor with the identity a real machine's reports.
type machine struct {
	cadvisortest.Fake
	systemUUID, bootID string
}

func (m *machine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo()
	if err != nil {
		return nil, err
	}
	info.SystemUUID = m.systemUUID
	info.BootID = m.bootID
	info.MachineID = m.bootID
	return info, nil
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

func run(ctx context.Context, o *options) error {
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", o.kubeconfig, err)
	}
	config.UserAgent = "hollow-kubelet"
	client, err := clientset.NewForConfig(config)
	if err != nil {
		return err
	}
	heartbeat := *config
	heartbeat.QPS = -1
	heartbeat.Timeout = time.Duration(o.statusSeconds) * time.Second
	heartbeatClient, err := clientset.NewForConfig(&heartbeat)
	if err != nil {
		return err
	}

	flags, kc := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName:   o.name,
		MaxPods:    110,
		NodeLabels: o.labels.asMap(),
	})
	// kubemark made itself a temporary root; this one is ours to clean.
	_ = os.RemoveAll(flags.RootDirectory)
	if err := os.MkdirAll(o.rootDir, 0o750); err != nil {
		return err
	}
	flags.RootDirectory = o.rootDir
	flags.NodeIP = "127.0.0.1"
	kc.StaticPodPath = filepath.Join(o.rootDir, "static-pods")
	kc.PodLogsDir = filepath.Join(o.rootDir, "pod-logs")
	for _, dir := range []string{kc.StaticPodPath, kc.PodLogsDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	kc.ProviderID = o.providerID
	kc.NodeLeaseDurationSeconds = int32(o.leaseSeconds)
	kc.NodeStatusUpdateFrequency.Duration = time.Duration(o.statusSeconds) * time.Second
	// The attach/detach controller attaches, as on every cluster node-fencer
	// serves; the kubelet only waits for the attachment and mounts.
	kc.EnableControllerAttachDetach = true
	// No kubelet server: scenarios start several kubelets on one host, and
	// nothing here calls the kubelet's API.
	kc.EnableServer = false
	kc.ReadOnlyPort = 0
	kc.HealthzPort = 0

	fake := fakeremote.NewFakeRemoteRuntime()
	endpoint, err := fakeremote.GenerateEndpoint()
	if err != nil {
		return err
	}
	if err := fake.Start(endpoint); err != nil {
		return fmt.Errorf("starting the fake runtime: %w", err)
	}
	defer fake.Stop()
	runtime, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return err
	}

	if len(o.drivers) > 0 {
		if err := serveCSI(ctx, o); err != nil {
			return err
		}
	}
	hollow := kubemark.NewHollowKubelet(flags, kc, client, heartbeatClient,
		&machine{Fake: cadvisortest.Fake{NodeName: o.name}, systemUUID: o.systemUUID, bootID: o.bootID},
		fake.ImageService, runtime, cm.NewStubContainerManager())
	go hollow.Run(ctx)
	<-ctx.Done()
	return nil
}

// serveCSI serves the CSI node service of each driver on a socket of the
// kubelet's plugin registry, where the kubelet's plugin watcher finds it.
func serveCSI(ctx context.Context, o *options) error {
	registry := filepath.Join(o.rootDir, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return err
	}
	topology := o.topology.asMap()
	for _, d := range o.drivers {
		name, nodeID := d[0], d[1]
		socket := filepath.Join(registry, strings.ReplaceAll(name, "/", "_")+".sock")
		_ = os.Remove(socket)
		listener, err := net.Listen("unix", socket)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", socket, err)
		}
		server := grpc.NewServer()
		registration.RegisterRegistrationServer(server, &registrar{name: name, endpoint: socket})
		csi.RegisterNodeServer(server, &node{nodeID: nodeID, topology: topology})
		csi.RegisterIdentityServer(server, &identity{name: name})
		go func() { _ = server.Serve(listener) }()
		go func() { <-ctx.Done(); server.Stop() }()
	}
	return nil
}

type registrar struct {
	registration.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		klog.Errorf("the kubelet refused CSI driver %s: %s", r.name, s.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

type identity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (i *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: "hollow"}, nil
}

func (i *identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// node answers the kubelet's CSI node calls. Nothing is mounted: the pods
// run on the fake runtime, which never reads their volumes.
type node struct {
	csi.UnimplementedNodeServer
	nodeID   string
	topology map[string]string
}

func (n *node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	info := &csi.NodeGetInfoResponse{NodeId: n.nodeID, MaxVolumesPerNode: 25}
	if len(n.topology) > 0 {
		info.AccessibleTopology = &csi.Topology{Segments: n.topology}
	}
	return info, nil
}

func (n *node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (n *node) NodePublishVolume(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	klog.Infof("NodePublishVolume %s at %s", r.VolumeId, r.TargetPath)
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *node) NodeUnpublishVolume(_ context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	klog.Infof("NodeUnpublishVolume %s at %s", r.VolumeId, r.TargetPath)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}
