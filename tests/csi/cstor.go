package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cstor keeps which nodes each volume is published to. A single-node
// volume is published to one node at a time: publishing it to another
// node while it is still published to the first one is refused with
// FAILED_PRECONDITION (CSI spec, ControllerPublishVolume errors), until the
// first node's unpublish. Multi-node volumes may be published to many.
type cstor struct {
	mu        sync.Mutex
	published map[string][]string // volume id -> node ids
	state     string
}

func newCstor(state string) (*cstor, error) {
	c := &cstor{published: map[string][]string{}, state: state}
	if state == "" {
		return c, nil
	}
	data, err := os.ReadFile(state)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &c.published); err != nil {
		return nil, fmt.Errorf("%s: %w", state, err)
	}
	return c, nil
}

func (c *cstor) name() string { return "cstor.csi.openebs.io" }

func singleNode(mode csi.VolumeCapability_AccessMode_Mode) bool {
	switch mode {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return false
	}
	return true
}

func (c *cstor) publish(_ context.Context, volume, node string, _ bool, mode csi.VolumeCapability_AccessMode_Mode) (map[string]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes := c.published[volume]
	if slices.Contains(nodes, node) {
		return map[string]string{"iqn": iqn(volume)}, nil
	}
	if singleNode(mode) && len(nodes) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"volume %s is published to node %s; a single-node volume is published to one node at a time", volume, nodes[0])
	}
	c.published[volume] = append(nodes, node)
	if err := c.save(); err != nil {
		c.published[volume] = nodes
		return nil, status.Errorf(codes.Internal, "saving the published state: %v", err)
	}
	return map[string]string{"iqn": iqn(volume)}, nil
}

func (c *cstor) unpublish(_ context.Context, volume, node string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes := c.published[volume]
	rest := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == node })
	if len(rest) == len(nodes) {
		return nil // not published there: already done
	}
	if len(rest) == 0 {
		delete(c.published, volume)
	} else {
		c.published[volume] = rest
	}
	if err := c.save(); err != nil {
		c.published[volume] = nodes
		return status.Errorf(codes.Internal, "saving the published state: %v", err)
	}
	return nil
}

// save writes the state whole, through a temporary file, so a crash leaves
// the old state or the new one.
func (c *cstor) save() error {
	if c.state == "" {
		return nil
	}
	data, err := json.Marshal(c.published)
	if err != nil {
		return err
	}
	tmp := c.state + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.state)
}

func iqn(volume string) string { return "iqn.2016-09.com.openebs.cstor:" + volume }
