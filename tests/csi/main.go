// Command csi-controller is the controller service of a CSI plugin for the
// test stack, served over gRPC on a unix socket for the real external-attacher
// sidecar. It plays the drivers whose own controllers cannot run here:
//
//   - ebs.csi.aws.com (-driver ebs): ControllerPublishVolume and
//     ControllerUnpublishVolume against the EC2 API (moto, through
//     AWS_ENDPOINT_URL), making the calls the AWS EBS CSI driver's controller
//     makes, in its order, with its treatment of EC2's answers (see ebs.go).
//     The driver's own module is not served by the Go module proxy.
//   - cstor.csi.openebs.io (-driver cstor): a storage system with no cloud
//     call, whose volumes are published to one node at a time (an iSCSI target
//     with one initiator); it refuses a second node with FAILED_PRECONDITION,
//     as the CSI spec asks for a single-node volume published elsewhere (see
//     cstor.go). csi-test v5 ships no mock driver any more, only csi-sanity.
//
// Only what the external-attacher calls is served: the identity service and
// the controller service's publish, unpublish and capabilities.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// version is stamped by the build; it only shows in GetPluginInfo.
var version = "dev"

// backend is one driver's publish and unpublish.
type backend interface {
	name() string
	publish(ctx context.Context, volume, node string, readonly bool, mode csi.VolumeCapability_AccessMode_Mode) (map[string]string, error)
	unpublish(ctx context.Context, volume, node string) error
}

func main() {
	driver := flag.String("driver", "", "which driver to serve: ebs or cstor")
	endpoint := flag.String("endpoint", "", "unix socket to serve on (unix:///path or /path)")
	state := flag.String("state", "", "cstor: file that keeps which node each volume is published to, so a restart keeps it")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)

	path := strings.TrimPrefix(strings.TrimPrefix(*endpoint, "unix://"), "unix:")
	if path == "" {
		log.Fatal("-endpoint is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var b backend
	var err error
	switch *driver {
	case "ebs":
		b, err = newEBS(ctx)
	case "cstor":
		b, err = newCstor(*state)
	default:
		err = fmt.Errorf("-driver must be ebs or cstor, not %q", *driver)
	}
	if err != nil {
		log.Fatal(err)
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls))
	p := &plugin{b: b}
	csi.RegisterIdentityServer(srv, p)
	csi.RegisterControllerServer(srv, p)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Printf("%s controller %s serving on %s", b.name(), version, path)
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}

// logCalls logs every call and its outcome: what the sidecar asked, and
// what it was told.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	switch method {
	case "Probe", "GetPluginInfo", "GetPluginCapabilities", "ControllerGetCapabilities":
		if err != nil {
			log.Printf("%s: %v", method, err)
		}
	default:
		if err != nil {
			log.Printf("%s %v: %v", method, req, err)
		} else {
			log.Printf("%s %v: ok %v", method, req, resp)
		}
	}
	return resp, err
}

type plugin struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	b backend
}

func (p *plugin) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: p.b.name(), VendorVersion: version}, nil
}

func (p *plugin) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

func (p *plugin) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (p *plugin) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
			Type: csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		}},
	}}}, nil
}

func (p *plugin) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID not provided")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Node ID not provided")
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "Volume capability not provided")
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	ctxInfo, err := p.b.publish(ctx, req.GetVolumeId(), req.GetNodeId(), req.GetReadonly(), mode)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: ctxInfo}, nil
}

func (p *plugin) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Volume ID not provided")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "Node ID not provided")
	}
	if err := p.b.unpublish(ctx, req.GetVolumeId(), req.GetNodeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
