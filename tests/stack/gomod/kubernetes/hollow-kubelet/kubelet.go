package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	kubeletoptions "k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
)

// What both hollow kubelets (this one and the old control plane's, which
// links this file) set the same way over pkg/kubemark's configuration.

// clients are the kubelet's API client and its heartbeat client, which
// never waits on the client's rate limit, as kubemark's own command makes.
func clients(o *options) (*clientset.Clientset, *clientset.Clientset, error) {
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", o.kubeconfig, err)
	}
	config.UserAgent = "hollow-kubelet"
	client, err := clientset.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	heartbeat := *config
	heartbeat.QPS = -1
	heartbeat.Timeout = time.Duration(o.statusSeconds) * time.Second
	heartbeatClient, err := clientset.NewForConfig(&heartbeat)
	if err != nil {
		return nil, nil, err
	}
	return client, heartbeatClient, nil
}

// configure sets what kubemark's command fixes from the flags, in place of
// kubemark's temporary root directory (removed here: this one is ours).
func configure(o *options, flags *kubeletoptions.KubeletFlags, kc *kubeletconfig.KubeletConfiguration) error {
	_ = os.RemoveAll(flags.RootDirectory)
	flags.RootDirectory = o.rootDir
	flags.NodeIP = "127.0.0.1"
	kc.StaticPodPath = filepath.Join(o.rootDir, "static-pods")
	if err := os.MkdirAll(kc.StaticPodPath, 0o750); err != nil {
		return err
	}
	kc.ProviderID = o.providerID
	kc.NodeLeaseDurationSeconds = int32(o.leaseSeconds)
	kc.NodeStatusUpdateFrequency.Duration = time.Duration(o.statusSeconds) * time.Second
	if o.reportSeconds > 0 {
		kc.NodeStatusReportFrequency.Duration = time.Duration(o.reportSeconds) * time.Second
	}
	// The attach/detach controller attaches, as on every cluster node-fencer
	// serves; the kubelet only waits for the attachment and mounts.
	kc.EnableControllerAttachDetach = true
	// No kubelet server: scenarios start several kubelets on one host, and
	// nothing here calls the kubelet's API.
	kc.EnableServer = false
	kc.ReadOnlyPort = 0
	kc.HealthzPort = 0
	return nil
}

// machine is the fake cadvisor with the identity a real machine's reports.
type machine struct {
	cadvisortest.Fake
	systemUUID, bootID string
}

func newMachine(o *options) *machine {
	return &machine{Fake: cadvisortest.Fake{NodeName: o.name}, systemUUID: o.systemUUID, bootID: o.bootID}
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
