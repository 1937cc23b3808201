package schema

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/policy"
)

func TestSchemaFileUpToDate(t *testing.T) {
	want, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "..", "schema", "policy.schema.json")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v — generate it with: go run ./internal/policy/schemagen > schema/policy.schema.json", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale — regenerate it from the module root with:\n\tgo run ./internal/policy/schemagen > schema/policy.schema.json\n(or: go generate ./internal/policy/schema)", path)
	}
}

func TestSchemaShape(t *testing.T) {
	b, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Generate()
	if !bytes.Equal(b, again) {
		t.Fatal("Generate() is not deterministic")
	}
	var s struct {
		Required             []string                   `json:"required"`
		AdditionalProperties *bool                      `json:"additionalProperties"`
		Properties           map[string]json.RawMessage `json:"properties"`
		Defs                 map[string]struct {
			AdditionalProperties *bool `json:"additionalProperties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Required) != 1 || s.Required[0] != "version" {
		t.Errorf("required = %v, want [version]", s.Required)
	}
	if s.AdditionalProperties == nil || *s.AdditionalProperties {
		t.Errorf("root allows additional properties")
	}
	for name, d := range s.Defs {
		if d.AdditionalProperties == nil || *d.AdditionalProperties {
			t.Errorf("$defs.%s allows additional properties", name)
		}
	}
	// Every top-level YAML key the loader accepts is in the schema.
	pt := reflect.TypeFor[policy.Policy]()
	for i := range pt.NumField() {
		name, _, _ := strings.Cut(pt.Field(i).Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if _, ok := s.Properties[name]; !ok {
			t.Errorf("schema lacks property %q", name)
		}
	}
}
