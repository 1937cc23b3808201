package inference

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzRewriteModel checks the byte-level model rewrite against
// encoding/json: the model found is the one a decoder reads, and after
// the rewrite every member but "model" decodes exactly as before.
func FuzzRewriteModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"a","messages":[{"role":"user","content":"hi"}]}`,
		`{"mod\u0065l":"a","model":"b"}`, `{"s":"\"}","model":null}`, ` {"x":[{"model":1}], "model" : "z" } `,
		`{"model":"a"} x`, `[]`, `"model"`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var before map[string]json.RawMessage
		isObject := json.Unmarshal(body, &before) == nil && before != nil
		model, spans := modelSpans(body)
		out := rewriteModel(body, spans, "NEW")
		if !isObject {
			if string(out) != string(body) {
				t.Fatalf("non-object %q rewritten to %q", body, out)
			}
			return
		}
		var want string
		_ = json.Unmarshal(before["model"], &want)
		if model != want {
			t.Fatalf("model %q, decoder reads %q, in %q", model, want, body)
		}
		var after map[string]json.RawMessage
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite of %q is not JSON: %q", body, out)
		}
		if _, ok := before["model"]; ok {
			if string(after["model"]) != `"NEW"` {
				t.Fatalf("model not rewritten: %q -> %q", body, out)
			}
			delete(before, "model")
			delete(after, "model")
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("other members changed: %q -> %q", body, out)
		}
	})
}
