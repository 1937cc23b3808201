// Package schema generates the policy's JSON Schema from the Go types. It
// lives apart from package policy so that corral itself does not link (and
// initialise at every start) the reflection library it needs.
package schema

import (
	"encoding/json"
	"reflect"

	"github.com/invopop/jsonschema"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/policy"
)

//go:generate sh -c "go run ../schemagen > ../../../schema/policy.schema.json"

// SchemaID is the $id of the generated JSON Schema.
const SchemaID = "https://github.com/corral-sandbox/corral/schema/policy.schema.json"

// Generate returns the policy's JSON Schema (draft 2020-12), generated
// from the Go types so that it cannot disagree with the loader about field
// names. The output is deterministic: properties follow field order and
// $defs are sorted by encoding/json.
func Generate() ([]byte, error) {
	r := &jsonschema.Reflector{
		// Only version is required; everything else has a default.
		RequiredFromJSONSchemaTags: true,
		ExpandedStruct:             true,
		// A route's timeout is written as a Go duration string.
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			if t == reflect.TypeFor[inference.Duration]() {
				return &jsonschema.Schema{Type: "string", Description: "A Go duration such as 30s or 10m.", Examples: []any{"30s", "10m"}}
			}
			return nil
		},
	}
	s := r.Reflect(&policy.Policy{})
	s.ID = SchemaID
	s.Title = "corral sandbox policy"
	s.Description = "Sandbox policy for corral: OpenShell v1 compatible, with corral extensions (limits, seccomp, state, network)."
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
