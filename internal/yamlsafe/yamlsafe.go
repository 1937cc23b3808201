// Package yamlsafe runs gopkg.in/yaml.v3 decoding on untrusted input
// without letting the decoder's own panics escape.
//
// yaml.v3 recovers only the errors it raises itself; some inputs, such as
// a merge key ("<<") in a mapping that also has a mapping as a key, make
// it panic with a runtime error. Policies and model routes arrive from
// files, git refs and the gateway's API, so a crafted document must be an
// error, never a crash.
package yamlsafe

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Decode is n.Decode(out) with a decoder panic returned as an error.
func Decode(n *yaml.Node, out any) error {
	return guard(func() error { return n.Decode(out) })
}

// Unmarshal is yaml.Unmarshal(data, out) with a decoder panic returned as
// an error.
func Unmarshal(data []byte, out any) error {
	return guard(func() error { return yaml.Unmarshal(data, out) })
}

// DecodeNext is dec.Decode(out) with a decoder panic returned as an error.
func DecodeNext(dec *yaml.Decoder, out any) error {
	return guard(func() error { return dec.Decode(out) })
}

func guard(decode func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the YAML decoder cannot handle this document (%v); use plain text keys and merge keys (\"<<\") only in simple mappings", r)
		}
	}()
	return decode()
}
