// Command hollow-kubelet is the hollow kubelet of the old control plane
// (Kubernetes v1.25): the same command as gomod/kubernetes/hollow-kubelet,
// whose shared files this directory links, over that release's
// pkg/kubemark, its fake runtime and its plugin-registration API.
package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cri/remote"
	fakeremote "k8s.io/kubernetes/pkg/kubelet/cri/remote/fake"
	"k8s.io/kubernetes/pkg/kubemark"
)

func run(ctx context.Context, o *options) error {
	client, heartbeatClient, err := clients(o)
	if err != nil {
		return err
	}
	flags, kc := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubletOptions{
		NodeName:   o.name,
		MaxPods:    110,
		NodeLabels: o.labels.asMap(),
	})
	if err := configure(o, flags, kc); err != nil {
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
	runtime, err := remote.NewRemoteRuntimeService(endpoint, 15*time.Second, trace.NewNoopTracerProvider())
	if err != nil {
		return err
	}

	if err := serveCSI(ctx, o); err != nil {
		return err
	}
	hollow := kubemark.NewHollowKubelet(flags, kc, client, heartbeatClient, newMachine(o),
		fake.ImageService, runtime, cm.NewStubContainerManager())
	go hollow.Run()
	<-ctx.Done()
	return nil
}

// registrarBase is empty: this release's generated registration server
// asks for no embedding.
type registrarBase struct{}
