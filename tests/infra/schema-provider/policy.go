package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// The shapes the AWS provider's aws_iam_policy_document writes
// (internal/service/iam/policy_model.go): one value or a reverse-sorted list.
type policyDoc struct {
	Version    string             `json:",omitempty"`
	ID         string             `json:"Id,omitempty"`
	Statements []*policyStatement `json:"Statement,omitempty"`
}

type policyStatement struct {
	Sid          string                    `json:",omitempty"`
	Effect       string                    `json:",omitempty"`
	Actions      any                       `json:"Action,omitempty"`
	NotActions   any                       `json:"NotAction,omitempty"`
	Resources    any                       `json:"Resource,omitempty"`
	NotResources any                       `json:"NotResource,omitempty"`
	Principals   map[string]any            `json:"Principal,omitempty"`
	NotPrincipal map[string]any            `json:"NotPrincipal,omitempty"`
	Conditions   map[string]map[string]any `json:"Condition,omitempty"`
}

func oneOrMany(items []string) any {
	switch len(items) {
	case 0:
		return nil
	case 1:
		return items[0]
	}
	sorted := append([]string(nil), items...)
	sort.Sort(sort.Reverse(sort.StringSlice(sorted)))
	return sorted
}

func fieldsOf(v tftypes.Value) (map[string]tftypes.Value, error) {
	fields := map[string]tftypes.Value{}
	return fields, v.As(&fields)
}

func stringOf(v tftypes.Value) (string, error) {
	var s *string
	if err := v.As(&s); err != nil || s == nil {
		return "", err
	}
	return *s, nil
}

func stringsOf(v tftypes.Value) ([]string, error) {
	var elements []tftypes.Value
	if v.IsNull() {
		return nil, nil
	}
	if err := v.As(&elements); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(elements))
	for _, e := range elements {
		s, err := stringOf(e)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func blocksOf(v tftypes.Value) ([]map[string]tftypes.Value, error) {
	var elements []tftypes.Value
	if v.IsNull() {
		return nil, nil
	}
	if err := v.As(&elements); err != nil {
		return nil, err
	}
	out := make([]map[string]tftypes.Value, 0, len(elements))
	for _, e := range elements {
		f, err := fieldsOf(e)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func principalsOf(v tftypes.Value) (map[string]any, error) {
	blocks, err := blocksOf(v)
	if err != nil || len(blocks) == 0 {
		return nil, err
	}
	byType := map[string][]string{}
	for _, b := range blocks {
		t, err := stringOf(b["type"])
		if err != nil {
			return nil, err
		}
		ids, err := stringsOf(b["identifiers"])
		if err != nil {
			return nil, err
		}
		byType[t] = append(byType[t], ids...)
	}
	out := map[string]any{}
	for t, ids := range byType {
		out[t] = oneOrMany(ids)
	}
	return out, nil
}

func conditionsOf(v tftypes.Value) (map[string]map[string]any, error) {
	blocks, err := blocksOf(v)
	if err != nil || len(blocks) == 0 {
		return nil, err
	}
	out := map[string]map[string]any{}
	for _, b := range blocks {
		test, err := stringOf(b["test"])
		if err != nil {
			return nil, err
		}
		variable, err := stringOf(b["variable"])
		if err != nil {
			return nil, err
		}
		values, err := stringsOf(b["values"])
		if err != nil {
			return nil, err
		}
		if out[test] == nil {
			out[test] = map[string]any{}
		}
		out[test][variable] = oneOrMany(values)
	}
	return out, nil
}

func statementOf(b map[string]tftypes.Value) (*policyStatement, error) {
	st := &policyStatement{Effect: "Allow"}
	var err error
	if st.Sid, err = stringOf(b["sid"]); err != nil {
		return nil, err
	}
	if effect, err := stringOf(b["effect"]); err != nil {
		return nil, err
	} else if effect != "" {
		st.Effect = effect
	}
	lists := []struct {
		name string
		dest *any
	}{{"actions", &st.Actions}, {"not_actions", &st.NotActions}, {"resources", &st.Resources}, {"not_resources", &st.NotResources}}
	for _, l := range lists {
		items, err := stringsOf(b[l.name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		*l.dest = oneOrMany(items)
	}
	if st.Principals, err = principalsOf(b["principals"]); err != nil {
		return nil, err
	}
	if st.NotPrincipal, err = principalsOf(b["not_principals"]); err != nil {
		return nil, err
	}
	if st.Conditions, err = conditionsOf(b["condition"]); err != nil {
		return nil, err
	}
	return st, nil
}

// merge adds statements over a document: one with the Sid of an earlier
// statement replaces it, as source and override documents do.
func merge(doc *policyDoc, statements []*policyStatement, duplicatesAreErrors bool) error {
	for _, st := range statements {
		replaced := false
		for i, old := range doc.Statements {
			if st.Sid != "" && old.Sid == st.Sid {
				if duplicatesAreErrors {
					return fmt.Errorf("duplicate Sid %q in source_policy_documents", st.Sid)
				}
				doc.Statements[i] = st
				replaced = true
			}
		}
		if !replaced {
			doc.Statements = append(doc.Statements, st)
		}
	}
	return nil
}

func parseDocuments(v tftypes.Value) ([]*policyDoc, error) {
	texts, err := stringsOf(v)
	if err != nil {
		return nil, err
	}
	var docs []*policyDoc
	for _, text := range texts {
		var raw struct {
			Version   string
			Statement []*policyStatement
		}
		if err := json.Unmarshal([]byte(text), &raw); err != nil {
			return nil, fmt.Errorf("a policy document is not JSON: %w", err)
		}
		docs = append(docs, &policyDoc{Version: raw.Version, Statements: raw.Statement})
	}
	return docs, nil
}

// renderPolicyDocument computes json and minified_json of an
// aws_iam_policy_document: source documents first, then the statements, then
// the override documents, each later statement replacing an earlier one of
// the same Sid.
func renderPolicyDocument(config tftypes.Value) (tftypes.Value, error) {
	fields, err := fieldsOf(config)
	if err != nil {
		return config, err
	}
	doc := &policyDoc{Version: "2012-10-17"}
	if version, err := stringOf(fields["version"]); err != nil {
		return config, err
	} else if version != "" {
		doc.Version = version
	}
	if doc.ID, err = stringOf(fields["policy_id"]); err != nil {
		return config, err
	}
	sources, err := parseDocuments(fields["source_policy_documents"])
	if err != nil {
		return config, err
	}
	for _, src := range sources {
		if err := merge(doc, src.Statements, true); err != nil {
			return config, err
		}
	}
	blocks, err := blocksOf(fields["statement"])
	if err != nil {
		return config, err
	}
	var own []*policyStatement
	for i, b := range blocks {
		st, err := statementOf(b)
		if err != nil {
			return config, fmt.Errorf("statement %d: %w", i, err)
		}
		own = append(own, st)
	}
	if err := merge(doc, own, false); err != nil {
		return config, err
	}
	overrides, err := parseDocuments(fields["override_policy_documents"])
	if err != nil {
		return config, err
	}
	for _, o := range overrides {
		if err := merge(doc, o.Statements, false); err != nil {
			return config, err
		}
	}
	pretty, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return config, err
	}
	minified, err := json.Marshal(doc)
	if err != nil {
		return config, err
	}
	fields["json"] = tftypes.NewValue(tftypes.String, string(pretty))
	fields["minified_json"] = tftypes.NewValue(tftypes.String, string(minified))
	fields["id"] = tftypes.NewValue(tftypes.String, strconv.FormatUint(uint64(sha256.Sum256(pretty)[0])<<24|uint64(len(pretty)), 10))
	return tftypes.NewValue(config.Type(), fields), nil
}
