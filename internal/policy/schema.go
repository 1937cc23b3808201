package policy

import (
	"encoding/json"

	"github.com/invopop/jsonschema"
)

//go:generate sh -c "go run ./schemagen > ../../schema/policy.schema.json"

// SchemaID is the $id of the generated JSON Schema.
const SchemaID = "https://github.com/corral-sandbox/corral/schema/policy.schema.json"

// JSONSchema returns the policy's JSON Schema (draft 2020-12), generated
// from the Go types so that it cannot disagree with the loader about field
// names. The output is deterministic: properties follow field order and
// $defs are sorted by encoding/json.
func JSONSchema() ([]byte, error) {
	r := &jsonschema.Reflector{
		// Only version is required; everything else has a default.
		RequiredFromJSONSchemaTags: true,
		ExpandedStruct:             true,
	}
	s := r.Reflect(&Policy{})
	s.ID = SchemaID
	s.Title = "corral sandbox policy"
	s.Description = "Sandbox policy for corral: OpenShell v1 compatible, with corral extensions (limits, seccomp, state, network)."
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
