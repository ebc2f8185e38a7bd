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
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
)

func run(ctx context.Context, o *options) error {
	client, heartbeatClient, err := clients(o)
	if err != nil {
		return err
	}
	flags, kc := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName:   o.name,
		MaxPods:    110,
		NodeLabels: o.labels.asMap(),
	})
	if err := configure(o, flags, kc); err != nil {
		return err
	}
	kc.PodLogsDir = filepath.Join(o.rootDir, "pod-logs")
	if err := os.MkdirAll(kc.PodLogsDir, 0o750); err != nil {
		return err
	}

	fake := fakeremote.NewFakeRemoteRuntime()
	endpoint, err := runtimeEndpoint(o)
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

	if err := serveCSI(ctx, o); err != nil {
		return err
	}
	hollow := kubemark.NewHollowKubelet(flags, kc, client, heartbeatClient, newMachine(o),
		fake.ImageService, runtime, cm.NewStubContainerManager())
	go hollow.Run(ctx)
	<-ctx.Done()
	return nil
}

// registrarBase is what the generated registration server asks its
// implementations to embed.
type registrarBase = registration.UnimplementedRegistrationServer
