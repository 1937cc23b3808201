package yamlsafe

import (
	"bytes"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// A mapping key next to a merge key panics inside yaml.v3 v3.0.1 when the
// target is a struct; found by fuzzing the policy parser.
const crashing = "? {a: 1}\n: x\n<<: {}\n"

type target struct {
	A string `yaml:"a"`
}

func TestDecodeTurnsDecoderPanicIntoError(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(crashing), &doc); err != nil {
		t.Fatal(err)
	}
	var out target
	err := Decode(doc.Content[0], &out)
	if err == nil || !strings.Contains(err.Error(), "cannot handle") {
		t.Fatalf("Decode = %v, want the decoder's panic as an error", err)
	}
	if err := DecodeNext(yaml.NewDecoder(bytes.NewReader([]byte(crashing))), &out); err == nil {
		t.Fatal("DecodeNext accepted the crashing document")
	}
	var m map[string]yaml.Node
	if err := Unmarshal([]byte(crashing), &m); err == nil {
		t.Fatal("Unmarshal accepted the crashing document")
	}
}

func TestDecodePassesThroughOrdinaryResults(t *testing.T) {
	var out target
	if err := DecodeNext(yaml.NewDecoder(strings.NewReader("a: b\n")), &out); err != nil || out.A != "b" {
		t.Fatalf("DecodeNext = %v, %+v", err, out)
	}
	if err := DecodeNext(yaml.NewDecoder(strings.NewReader("a: [1]\n")), &out); err == nil {
		t.Fatal("a type error was lost")
	}
}
