package main

import (
	"encoding/json"
	"fmt"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// unknownComputed marks every computed attribute the configuration leaves
// null as unknown, in the block and in its nested blocks.
func unknownComputed(block *tfprotov6.SchemaBlock, v tftypes.Value) (tftypes.Value, error) {
	if v.IsNull() || !v.IsKnown() {
		return v, nil
	}
	fields := map[string]tftypes.Value{}
	if err := v.As(&fields); err != nil {
		return v, err
	}
	for _, a := range block.Attributes {
		if a.Computed && fields[a.Name].IsNull() {
			fields[a.Name] = tftypes.NewValue(a.Type, tftypes.UnknownValue)
		}
	}
	for _, b := range block.BlockTypes {
		nested := fields[b.TypeName]
		if nested.IsNull() || !nested.IsKnown() {
			continue
		}
		var elements []tftypes.Value
		if err := nested.As(&elements); err != nil {
			return v, fmt.Errorf("block %s: %w", b.TypeName, err)
		}
		for i, e := range elements {
			planned, err := unknownComputed(b.Block, e)
			if err != nil {
				return v, fmt.Errorf("block %s: %w", b.TypeName, err)
			}
			elements[i] = planned
		}
		fields[b.TypeName] = tftypes.NewValue(nested.Type(), elements)
	}
	return tftypes.NewValue(v.Type(), fields), nil
}

// fillFromFixture sets the computed attributes the configuration leaves null
// to the fixture's values (a JSON object of attribute values), if any.
func fillFromFixture(block *tfprotov6.SchemaBlock, config tftypes.Value, fixture json.RawMessage) (tftypes.Value, error) {
	if len(fixture) == 0 {
		return config, nil
	}
	var given map[string]json.RawMessage
	if err := json.Unmarshal(fixture, &given); err != nil {
		return config, fmt.Errorf("fixture: %w", err)
	}
	fields := map[string]tftypes.Value{}
	if err := config.As(&fields); err != nil {
		return config, err
	}
	for name, raw := range given {
		attr := findAttribute(block, name)
		if attr == nil {
			return config, fmt.Errorf("fixture: no attribute %q", name)
		}
		if !attr.Computed || !fields[name].IsNull() {
			continue
		}
		v, err := tftypes.ValueFromJSONWithOpts(raw, attr.Type, tftypes.ValueFromJSONOpts{})
		if err != nil {
			return config, fmt.Errorf("fixture %s: %w", name, err)
		}
		fields[name] = v
	}
	return tftypes.NewValue(config.Type(), fields), nil
}

func findAttribute(block *tfprotov6.SchemaBlock, name string) *tfprotov6.SchemaAttribute {
	for _, a := range block.Attributes {
		if a.Name == name {
			return a
		}
	}
	return nil
}
