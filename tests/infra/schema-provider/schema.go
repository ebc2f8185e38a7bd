package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// providerFile is what tests/infra/cdk_schema.py writes: one provider's schema
// in the shape of `terraform providers schema -json`, restricted to the types
// a configuration uses.
type providerFile struct {
	Provider  string                `json:"provider"`
	Version   string                `json:"version"`
	Config    typeSchema            `json:"provider_schema"`
	Resources map[string]typeSchema `json:"resource_schemas"`
	Data      map[string]typeSchema `json:"data_source_schemas"`
}

type typeSchema struct {
	Version int64     `json:"version"`
	Block   jsonBlock `json:"block"`
}

type jsonBlock struct {
	Attributes map[string]jsonAttribute `json:"attributes"`
	BlockTypes map[string]jsonNested    `json:"block_types"`
}

type jsonAttribute struct {
	Type      json.RawMessage `json:"type"`
	Required  bool            `json:"required"`
	Optional  bool            `json:"optional"`
	Computed  bool            `json:"computed"`
	Sensitive bool            `json:"sensitive"`
}

type jsonNested struct {
	NestingMode string    `json:"nesting_mode"`
	Block       jsonBlock `json:"block"`
	MinItems    int64     `json:"min_items"`
	MaxItems    int64     `json:"max_items"`
}

// loadSchema reads schema.json beside the executable: Terraform runs the
// provider from its package directory, where the set-up put both.
func loadSchema() (*providerFile, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(filepath.Dir(exe), "schema.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the provider schema: %w", err)
	}
	var f providerFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// ctyType turns the JSON type notation ("string", ["list", "string"],
// ["object", {...}]) into a tftypes.Type.
func ctyType(raw json.RawMessage) (tftypes.Type, error) {
	var name string
	if json.Unmarshal(raw, &name) == nil {
		switch name {
		case "string":
			return tftypes.String, nil
		case "number":
			return tftypes.Number, nil
		case "bool":
			return tftypes.Bool, nil
		case "dynamic":
			return tftypes.DynamicPseudoType, nil
		}
		return nil, fmt.Errorf("unknown type %q", name)
	}
	var pair []json.RawMessage
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return nil, fmt.Errorf("unknown type %s", raw)
	}
	if err := json.Unmarshal(pair[0], &name); err != nil {
		return nil, fmt.Errorf("unknown type %s", raw)
	}
	if name == "object" {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(pair[1], &fields); err != nil {
			return nil, err
		}
		types := map[string]tftypes.Type{}
		for k, v := range fields {
			t, err := ctyType(v)
			if err != nil {
				return nil, err
			}
			types[k] = t
		}
		return tftypes.Object{AttributeTypes: types}, nil
	}
	element, err := ctyType(pair[1])
	if err != nil {
		return nil, err
	}
	switch name {
	case "list":
		return tftypes.List{ElementType: element}, nil
	case "set":
		return tftypes.Set{ElementType: element}, nil
	case "map":
		return tftypes.Map{ElementType: element}, nil
	}
	return nil, fmt.Errorf("unknown type %s", raw)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func protoBlock(b jsonBlock) (*tfprotov6.SchemaBlock, error) {
	out := &tfprotov6.SchemaBlock{}
	for _, name := range sortedKeys(b.Attributes) {
		a := b.Attributes[name]
		t, err := ctyType(a.Type)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", name, err)
		}
		out.Attributes = append(out.Attributes, &tfprotov6.SchemaAttribute{
			Name: name, Type: t, Required: a.Required, Optional: a.Optional,
			Computed: a.Computed, Sensitive: a.Sensitive,
		})
	}
	for _, name := range sortedKeys(b.BlockTypes) {
		n := b.BlockTypes[name]
		inner, err := protoBlock(n.Block)
		if err != nil {
			return nil, fmt.Errorf("block %s: %w", name, err)
		}
		mode := tfprotov6.SchemaNestedBlockNestingModeList
		switch n.NestingMode {
		case "list":
		case "set":
			mode = tfprotov6.SchemaNestedBlockNestingModeSet
		default:
			return nil, fmt.Errorf("block %s: nesting mode %q", name, n.NestingMode)
		}
		out.BlockTypes = append(out.BlockTypes, &tfprotov6.SchemaNestedBlock{
			TypeName: name, Block: inner, Nesting: mode, MinItems: n.MinItems, MaxItems: n.MaxItems,
		})
	}
	return out, nil
}

func protoSchema(s typeSchema) (*tfprotov6.Schema, error) {
	b, err := protoBlock(s.Block)
	if err != nil {
		return nil, err
	}
	return &tfprotov6.Schema{Version: s.Version, Block: b}, nil
}
