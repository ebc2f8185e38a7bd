package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ebs makes the EC2 calls of the AWS EBS CSI driver's controller
// (pkg/cloud AttachDisk and DetachDisk, pkg/driver ControllerPublishVolume
// and ControllerUnpublishVolume), in the same order and with the same
// treatment of EC2's answers:
//
//   - publish: DescribeInstances for the node's instance (a missing
//     instance is NotFound); the volume's device if the instance's block
//     device mappings already name it, else the first free name; AttachVolume
//     unless already assigned; then DescribeVolumes until the attachment to
//     that instance is "attached" with that device. Any EC2 error is Internal,
//     "Could not attach volume ...".
//   - unpublish: DescribeInstances (a missing instance means nothing is
//     attached: success); DetachVolume (not forced); IncorrectState,
//     InvalidAttachment.NotFound and InvalidVolume.NotFound mean already
//     detached: success; else DescribeVolumes until no attachment to that
//     instance is left (a volume gone counts as detached).
//
// Two differences, for moto alone, each answered as EC2 would, with EC2's
// code and message, after one DescribeVolumes: EC2 refuses AttachVolume of a
// volume attached to another instance (VolumeInUse), while moto moves the
// attachment; and EC2 refuses DetachVolume naming an instance the volume is
// not attached to (InvalidAttachment.NotFound), while moto detaches the
// volume from whichever instance holds it (and drops the named instance's
// mapping at that device name, another volume's). EC2 also refuses a device
// name in use on the instance, which moto takes; like the driver's device
// manager, names handed out are held until the attachment shows.
type ebs struct {
	ec2 *ec2.Client
	// Device names handed out and not yet seen in an instance's mappings, per
	// instance, as the driver's device manager keeps them: two publishes to
	// one instance at once must not pick the same free name (EC2 refuses the
	// second; moto takes it and loses the first volume's mapping).
	mu       sync.Mutex
	inFlight map[string]map[string]string // instance -> device -> volume
	// How long to wait for an attachment's state, and how often to look.
	wait, every time.Duration
}

func newEBS(ctx context.Context) (*ebs, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	return &ebs{
		ec2: ec2.NewFromConfig(cfg), wait: 2 * time.Minute, every: time.Second,
		inFlight: map[string]map[string]string{},
	}, nil
}

func (e *ebs) name() string { return "ebs.csi.aws.com" }

// errNotFound is the driver's cloud.ErrNotFound.
var errNotFound = errors.New("resource was not found")

func code(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

func (e *ebs) instance(ctx context.Context, id string) (*types.Instance, error) {
	out, err := e.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		if code(err) == "InvalidInstanceID.NotFound" {
			return nil, errNotFound
		}
		return nil, fmt.Errorf("error listing AWS instances: %w", err)
	}
	for _, r := range out.Reservations {
		for i := range r.Instances {
			if aws.ToString(r.Instances[i].InstanceId) == id {
				return &r.Instances[i], nil
			}
		}
	}
	return nil, errNotFound
}

// device: the name the instance already has the volume under, or the first
// name free on it and not handed out to another volume, from the driver's
// list (xvdaa .. xvdzz), held until release.
func (e *ebs) device(inst *types.Instance, volume string) (path string, assigned bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := aws.ToString(inst.InstanceId)
	used := map[string]bool{}
	for _, m := range inst.BlockDeviceMappings {
		name := aws.ToString(m.DeviceName)
		if m.Ebs != nil && aws.ToString(m.Ebs.VolumeId) == volume {
			return name, true
		}
		used[name] = true
	}
	for name, v := range e.inFlight[id] {
		if v == volume {
			return name, false
		}
		used[name] = true
	}
	if e.inFlight[id] == nil {
		e.inFlight[id] = map[string]string{}
	}
	defer func() {
		if path != "" {
			e.inFlight[id][path] = volume
		}
	}()
	for a := 'a'; a <= 'z'; a++ {
		for b := 'a'; b <= 'z'; b++ {
			name := fmt.Sprintf("/dev/xvd%c%c", a, b)
			if !used[name] {
				return name, false
			}
		}
	}
	return "", false
}

func (e *ebs) publish(ctx context.Context, volume, node string, _ bool, _ csi.VolumeCapability_AccessMode_Mode) (map[string]string, error) {
	path, err := e.attach(ctx, volume, node)
	if err != nil {
		if errors.Is(err, errNotFound) {
			return nil, status.Errorf(codes.NotFound, "Instance %q not found", node)
		}
		return nil, status.Errorf(codes.Internal, "Could not attach volume %q to node %q: %v", volume, node, err)
	}
	return map[string]string{"devicePath": path}, nil
}

func (e *ebs) attach(ctx context.Context, volume, node string) (string, error) {
	inst, err := e.instance(ctx, node)
	if err != nil {
		return "", err
	}
	path, assigned := e.device(inst, volume)
	if path == "" {
		return "", errors.New("there are no device names left")
	}
	defer e.release(node, path)
	if !assigned {
		if err := e.refuseInUse(ctx, volume, node); err != nil {
			return "", fmt.Errorf("could not attach volume %q to node %q: %w", volume, node, err)
		}
		_, err := e.ec2.AttachVolume(ctx, &ec2.AttachVolumeInput{
			Device: aws.String(path), InstanceId: aws.String(node), VolumeId: aws.String(volume),
		})
		if err != nil {
			return "", fmt.Errorf("could not attach volume %q to node %q: %w", volume, node, err)
		}
	}
	if err := e.waitFor(ctx, volume, node, types.VolumeAttachmentStateAttached, path); err != nil {
		return "", err
	}
	return path, nil
}

// release forgets a device name handed out: once attached, the instance's
// mappings hold it; after a failure it is free again.
func (e *ebs) release(instance, path string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.inFlight[instance], path)
}

// refuseInUse answers for moto what EC2 answers AttachVolume of a volume
// attached to another instance (see the type's notes).
func (e *ebs) refuseInUse(ctx context.Context, volume, node string) error {
	out, err := e.ec2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{volume}})
	if err != nil || len(out.Volumes) == 0 {
		return nil // AttachVolume answers for itself
	}
	v := out.Volumes[0]
	if aws.ToBool(v.MultiAttachEnabled) {
		return nil
	}
	for _, a := range v.Attachments {
		if aws.ToString(a.InstanceId) != node && a.State != types.VolumeAttachmentStateDetached {
			return &smithy.GenericAPIError{
				Code:    "VolumeInUse",
				Message: fmt.Sprintf("%s is already attached to an instance", volume),
			}
		}
	}
	return nil
}

// refuseNotAttached answers for moto what EC2 answers DetachVolume naming an
// instance the volume is not attached to (see the type's notes).
func (e *ebs) refuseNotAttached(ctx context.Context, volume, node string) error {
	out, err := e.ec2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{volume}})
	if err != nil || len(out.Volumes) == 0 {
		return nil // DetachVolume answers for itself
	}
	for _, a := range out.Volumes[0].Attachments {
		if aws.ToString(a.InstanceId) == node {
			return nil
		}
	}
	return &smithy.GenericAPIError{
		Code:    "InvalidAttachment.NotFound",
		Message: fmt.Sprintf("The volume '%s' is not attached to instance '%s'", volume, node),
	}
}

func (e *ebs) unpublish(ctx context.Context, volume, node string) error {
	err := e.detach(ctx, volume, node)
	if errors.Is(err, errNotFound) {
		log.Printf("ControllerUnpublishVolume: attachment of %s to %s not found", volume, node)
		return nil
	}
	if err != nil {
		return status.Errorf(codes.Internal, "Could not detach volume %q from node %q: %v", volume, node, err)
	}
	return nil
}

func (e *ebs) detach(ctx context.Context, volume, node string) error {
	if _, err := e.instance(ctx, node); err != nil {
		return err
	}
	if err := e.refuseNotAttached(ctx, volume, node); err != nil {
		return errNotFound
	}
	_, err := e.ec2.DetachVolume(ctx, &ec2.DetachVolumeInput{
		InstanceId: aws.String(node), VolumeId: aws.String(volume),
	})
	if err != nil {
		switch code(err) {
		case "IncorrectState", "InvalidAttachment.NotFound", "InvalidVolume.NotFound":
			return errNotFound
		}
		return fmt.Errorf("could not detach volume %q from node %q: %w", volume, node, err)
	}
	return e.waitFor(ctx, volume, node, types.VolumeAttachmentStateDetached, "")
}

// waitFor polls DescribeVolumes until the volume's attachment to the
// instance is in state want (no attachment counts as detached), with the
// device path when one is given.
func (e *ebs) waitFor(ctx context.Context, volume, node string, want types.VolumeAttachmentState, path string) error {
	deadline := time.Now().Add(e.wait)
	for {
		out, err := e.ec2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{volume}})
		switch {
		case err != nil && code(err) == "InvalidVolume.NotFound":
			if want == types.VolumeAttachmentStateDetached {
				return nil
			}
			return err
		case err != nil:
			log.Printf("ignoring error from describe volume %s, will retry: %v", volume, err)
		case len(out.Volumes) > 0:
			v := out.Volumes[0]
			if !aws.ToBool(v.MultiAttachEnabled) && len(v.Attachments) > 1 {
				return fmt.Errorf("volume %q has multiple attachments", volume)
			}
			state := types.VolumeAttachmentStateDetached
			device := ""
			if i := slices.IndexFunc(v.Attachments, func(a types.VolumeAttachment) bool {
				return aws.ToString(a.InstanceId) == node
			}); i >= 0 {
				state = v.Attachments[i].State
				device = aws.ToString(v.Attachments[i].Device)
			}
			if state == want && (path == "" || device == path) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for volume %q to be %s on %q", volume, want, node)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(e.every):
		}
	}
}
