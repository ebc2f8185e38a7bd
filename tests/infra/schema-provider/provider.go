package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// server answers Terraform from the schema alone: it validates nothing beyond
// what Terraform checks against the schema, plans every unset computed
// attribute as unknown, reads data sources from a fixture file, and never
// creates anything.
type server struct {
	name      string
	version   string
	config    *tfprotov6.Schema
	resources map[string]*tfprotov6.Schema
	data      map[string]*tfprotov6.Schema
	fixtures  map[string]json.RawMessage
}

func newServer(f *providerFile) (*server, error) {
	s := &server{name: f.Provider, version: f.Version, resources: map[string]*tfprotov6.Schema{}, data: map[string]*tfprotov6.Schema{}}
	var err error
	if s.config, err = protoSchema(f.Config); err != nil {
		return nil, fmt.Errorf("provider %s: %w", f.Provider, err)
	}
	for name, ts := range f.Resources {
		if s.resources[name], err = protoSchema(ts); err != nil {
			return nil, fmt.Errorf("resource %s: %w", name, err)
		}
	}
	for name, ts := range f.Data {
		if s.data[name], err = protoSchema(ts); err != nil {
			return nil, fmt.Errorf("data source %s: %w", name, err)
		}
	}
	if path := os.Getenv("SCHEMA_PROVIDER_DATA"); path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("SCHEMA_PROVIDER_DATA: %w", err)
		}
		if err := json.Unmarshal(raw, &s.fixtures); err != nil {
			return nil, fmt.Errorf("SCHEMA_PROVIDER_DATA %s: %w", path, err)
		}
	}
	return s, nil
}

func errorDiag(summary string, err error) []*tfprotov6.Diagnostic {
	return []*tfprotov6.Diagnostic{{Severity: tfprotov6.DiagnosticSeverityError, Summary: summary, Detail: err.Error()}}
}

func (s *server) GetMetadata(context.Context, *tfprotov6.GetMetadataRequest) (*tfprotov6.GetMetadataResponse, error) {
	resp := &tfprotov6.GetMetadataResponse{ServerCapabilities: &tfprotov6.ServerCapabilities{PlanDestroy: true}}
	for _, name := range sortedKeys(s.resources) {
		resp.Resources = append(resp.Resources, tfprotov6.ResourceMetadata{TypeName: name})
	}
	for _, name := range sortedKeys(s.data) {
		resp.DataSources = append(resp.DataSources, tfprotov6.DataSourceMetadata{TypeName: name})
	}
	return resp, nil
}

func (s *server) GetProviderSchema(context.Context, *tfprotov6.GetProviderSchemaRequest) (*tfprotov6.GetProviderSchemaResponse, error) {
	return &tfprotov6.GetProviderSchemaResponse{
		ServerCapabilities: &tfprotov6.ServerCapabilities{PlanDestroy: true},
		Provider:           s.config,
		ResourceSchemas:    s.resources,
		DataSourceSchemas:  s.data,
	}, nil
}

func (s *server) GetResourceIdentitySchemas(context.Context, *tfprotov6.GetResourceIdentitySchemasRequest) (*tfprotov6.GetResourceIdentitySchemasResponse, error) {
	return &tfprotov6.GetResourceIdentitySchemasResponse{}, nil
}

func (s *server) ValidateProviderConfig(_ context.Context, req *tfprotov6.ValidateProviderConfigRequest) (*tfprotov6.ValidateProviderConfigResponse, error) {
	return &tfprotov6.ValidateProviderConfigResponse{PreparedConfig: req.Config}, nil
}

func (s *server) ConfigureProvider(context.Context, *tfprotov6.ConfigureProviderRequest) (*tfprotov6.ConfigureProviderResponse, error) {
	return &tfprotov6.ConfigureProviderResponse{}, nil
}

func (s *server) StopProvider(context.Context, *tfprotov6.StopProviderRequest) (*tfprotov6.StopProviderResponse, error) {
	return &tfprotov6.StopProviderResponse{}, nil
}

func (s *server) ValidateResourceConfig(context.Context, *tfprotov6.ValidateResourceConfigRequest) (*tfprotov6.ValidateResourceConfigResponse, error) {
	return &tfprotov6.ValidateResourceConfigResponse{}, nil
}

func (s *server) UpgradeResourceState(_ context.Context, req *tfprotov6.UpgradeResourceStateRequest) (*tfprotov6.UpgradeResourceStateResponse, error) {
	schema, ok := s.resources[req.TypeName]
	if !ok || req.RawState == nil {
		return &tfprotov6.UpgradeResourceStateResponse{Diagnostics: errorDiag("unknown resource type", fmt.Errorf("%s", req.TypeName))}, nil
	}
	t := schema.ValueType()
	v, err := req.RawState.UnmarshalWithOpts(t, tfprotov6.UnmarshalOpts{ValueFromJSONOpts: tftypes.ValueFromJSONOpts{IgnoreUndefinedAttributes: true}})
	if err != nil {
		return &tfprotov6.UpgradeResourceStateResponse{Diagnostics: errorDiag("reading the state", err)}, nil
	}
	dv, err := tfprotov6.NewDynamicValue(t, v)
	if err != nil {
		return &tfprotov6.UpgradeResourceStateResponse{Diagnostics: errorDiag("reading the state", err)}, nil
	}
	return &tfprotov6.UpgradeResourceStateResponse{UpgradedState: &dv}, nil
}

func (s *server) ReadResource(_ context.Context, req *tfprotov6.ReadResourceRequest) (*tfprotov6.ReadResourceResponse, error) {
	return &tfprotov6.ReadResourceResponse{NewState: req.CurrentState, Private: req.Private}, nil
}

// PlanResourceChange plans what Terraform proposes, with every computed
// attribute left unset marked unknown, as a real provider does on create.
// It never asks for a replacement.
func (s *server) PlanResourceChange(_ context.Context, req *tfprotov6.PlanResourceChangeRequest) (*tfprotov6.PlanResourceChangeResponse, error) {
	schema, ok := s.resources[req.TypeName]
	if !ok {
		return &tfprotov6.PlanResourceChangeResponse{Diagnostics: errorDiag("unknown resource type", fmt.Errorf("%s", req.TypeName))}, nil
	}
	t := schema.ValueType()
	proposed, err := req.ProposedNewState.Unmarshal(t)
	if err != nil {
		return &tfprotov6.PlanResourceChangeResponse{Diagnostics: errorDiag("reading the proposed state", err)}, nil
	}
	prior, err := req.PriorState.Unmarshal(t)
	if err != nil {
		return &tfprotov6.PlanResourceChangeResponse{Diagnostics: errorDiag("reading the prior state", err)}, nil
	}
	planned := proposed
	if prior.IsNull() && !proposed.IsNull() {
		if planned, err = unknownComputed(schema.Block, proposed); err != nil {
			return &tfprotov6.PlanResourceChangeResponse{Diagnostics: errorDiag("planning", err)}, nil
		}
	}
	dv, err := tfprotov6.NewDynamicValue(t, planned)
	if err != nil {
		return &tfprotov6.PlanResourceChangeResponse{Diagnostics: errorDiag("planning", err)}, nil
	}
	return &tfprotov6.PlanResourceChangeResponse{PlannedState: &dv, PlannedPrivate: req.PriorPrivate}, nil
}

func (s *server) ApplyResourceChange(_ context.Context, req *tfprotov6.ApplyResourceChangeRequest) (*tfprotov6.ApplyResourceChangeResponse, error) {
	return &tfprotov6.ApplyResourceChangeResponse{Diagnostics: errorDiag("the schema-only provider cannot apply",
		fmt.Errorf("%s: it knows the %s provider's schema, nothing of its API", req.TypeName, s.name))}, nil
}

func (s *server) ImportResourceState(_ context.Context, req *tfprotov6.ImportResourceStateRequest) (*tfprotov6.ImportResourceStateResponse, error) {
	return &tfprotov6.ImportResourceStateResponse{Diagnostics: errorDiag("the schema-only provider cannot import", fmt.Errorf("%s", req.TypeName))}, nil
}

func (s *server) MoveResourceState(_ context.Context, req *tfprotov6.MoveResourceStateRequest) (*tfprotov6.MoveResourceStateResponse, error) {
	return &tfprotov6.MoveResourceStateResponse{Diagnostics: errorDiag("the schema-only provider cannot move state", fmt.Errorf("%s", req.TargetTypeName))}, nil
}

func (s *server) UpgradeResourceIdentity(context.Context, *tfprotov6.UpgradeResourceIdentityRequest) (*tfprotov6.UpgradeResourceIdentityResponse, error) {
	return &tfprotov6.UpgradeResourceIdentityResponse{}, nil
}

func (s *server) ValidateDataResourceConfig(context.Context, *tfprotov6.ValidateDataResourceConfigRequest) (*tfprotov6.ValidateDataResourceConfigResponse, error) {
	return &tfprotov6.ValidateDataResourceConfigResponse{}, nil
}

// ReadDataSource returns the configuration with the fixture's values (from
// SCHEMA_PROVIDER_DATA, by data source type) in the computed attributes it
// leaves unset; aws_iam_policy_document is rendered as the AWS provider does.
func (s *server) ReadDataSource(_ context.Context, req *tfprotov6.ReadDataSourceRequest) (*tfprotov6.ReadDataSourceResponse, error) {
	schema, ok := s.data[req.TypeName]
	if !ok {
		return &tfprotov6.ReadDataSourceResponse{Diagnostics: errorDiag("unknown data source", fmt.Errorf("%s", req.TypeName))}, nil
	}
	t := schema.ValueType()
	config, err := req.Config.Unmarshal(t)
	if err != nil {
		return &tfprotov6.ReadDataSourceResponse{Diagnostics: errorDiag("reading the configuration", err)}, nil
	}
	var state tftypes.Value
	if req.TypeName == "aws_iam_policy_document" {
		state, err = renderPolicyDocument(config)
	} else {
		state, err = fillFromFixture(schema.Block, config, s.fixtures[req.TypeName])
	}
	if err != nil {
		return &tfprotov6.ReadDataSourceResponse{Diagnostics: errorDiag("data source "+req.TypeName, err)}, nil
	}
	dv, err := tfprotov6.NewDynamicValue(t, state)
	if err != nil {
		return &tfprotov6.ReadDataSourceResponse{Diagnostics: errorDiag("data source "+req.TypeName, err)}, nil
	}
	return &tfprotov6.ReadDataSourceResponse{State: &dv}, nil
}

func (s *server) CallFunction(_ context.Context, req *tfprotov6.CallFunctionRequest) (*tfprotov6.CallFunctionResponse, error) {
	return &tfprotov6.CallFunctionResponse{Error: &tfprotov6.FunctionError{Text: "no provider functions: " + req.Name}}, nil
}

func (s *server) GetFunctions(context.Context, *tfprotov6.GetFunctionsRequest) (*tfprotov6.GetFunctionsResponse, error) {
	return &tfprotov6.GetFunctionsResponse{}, nil
}

func (s *server) ValidateEphemeralResourceConfig(context.Context, *tfprotov6.ValidateEphemeralResourceConfigRequest) (*tfprotov6.ValidateEphemeralResourceConfigResponse, error) {
	return &tfprotov6.ValidateEphemeralResourceConfigResponse{}, nil
}

func (s *server) OpenEphemeralResource(_ context.Context, req *tfprotov6.OpenEphemeralResourceRequest) (*tfprotov6.OpenEphemeralResourceResponse, error) {
	return &tfprotov6.OpenEphemeralResourceResponse{Diagnostics: errorDiag("no ephemeral resources", fmt.Errorf("%s", req.TypeName))}, nil
}

func (s *server) RenewEphemeralResource(context.Context, *tfprotov6.RenewEphemeralResourceRequest) (*tfprotov6.RenewEphemeralResourceResponse, error) {
	return &tfprotov6.RenewEphemeralResourceResponse{}, nil
}

func (s *server) CloseEphemeralResource(context.Context, *tfprotov6.CloseEphemeralResourceRequest) (*tfprotov6.CloseEphemeralResourceResponse, error) {
	return &tfprotov6.CloseEphemeralResourceResponse{}, nil
}

func (s *server) GenerateResourceConfig(_ context.Context, req *tfprotov6.GenerateResourceConfigRequest) (*tfprotov6.GenerateResourceConfigResponse, error) {
	return &tfprotov6.GenerateResourceConfigResponse{Diagnostics: errorDiag("the schema-only provider cannot generate configuration", fmt.Errorf("%s", req.TypeName))}, nil
}
