package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The CSI node service, shared by this hollow kubelet and the old control
// plane's (gomod/kubernetes-legacy/hollow-kubelet links this file); the
// registration server's generated code differs between the releases in
// what it asks implementations to embed (registrarBase, each one's own).

// serveCSI serves the CSI node service of each driver on a socket of the
// kubelet's plugin registry, where the kubelet's plugin watcher finds it.
func serveCSI(ctx context.Context, o *options) error {
	if len(o.drivers) == 0 {
		return nil
	}
	registry := filepath.Join(o.rootDir, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return err
	}
	topology := o.topology.asMap()
	for i, d := range o.drivers {
		name, nodeID := d[0], d[1]
		// Numbered, not named: a unix socket's path is at most 107 bytes,
		// and the state directory's is the caller's.
		socket := filepath.Join(registry, fmt.Sprintf("csi-%d.sock", i))
		_ = os.Remove(socket)
		listener, err := net.Listen("unix", socket)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", socket, err)
		}
		server := grpc.NewServer()
		registerRegistrar(server, name, socket)
		csi.RegisterNodeServer(server, &node{nodeID: nodeID, topology: topology})
		csi.RegisterIdentityServer(server, &identity{name: name})
		go func() { _ = server.Serve(listener) }()
		go func() { <-ctx.Done(); server.Stop() }()
	}
	return nil
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

func registerRegistrar(server *grpc.Server, name, socket string) {
	registration.RegisterRegistrationServer(server, &registrar{name: name, endpoint: socket})
}

type registrar struct {
	registrarBase
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
