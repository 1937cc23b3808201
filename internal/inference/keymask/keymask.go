// Package keymask keeps an inference route's key out of the router's
// answers with the scrubber that keeps masked secrets out of responses:
// the key, in every form that scrubber knows (raw, percent- and
// JSON-escaped, hex, base64), becomes a surrogate of the same shape. It is
// a package of its own because package inference cannot import the
// secrets package, whose policy types import package inference.
package keymask

import (
	"net/http"

	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/l7/secrets"
	"github.com/corral-sandbox/corral/internal/policy"
)

// New returns the Masker of key, for inference.Options.Mask. A key the
// scrubber cannot mask safely (shorter than 8 bytes, which ordinary text
// would contain, or holding spaces) is an error: the route must not run
// with a key its answers could hand to the workload.
func New(key string) (inference.Masker, error) {
	const name = "api_key"
	set, err := secrets.Load([]policy.SecretScope{{Name: name, Source: policy.Secret{FromEnv: name}}},
		func(string) string { return key })
	if err != nil {
		return nil, err
	}
	return mask{set}, nil
}

// mask's Scrub is the set's, which scrubs text as a whole: the router
// scrubs only units (a body, an event) that no value continues past.
type mask struct{ *secrets.Set }

// DecodeResponse is the one the inspector uses for a scoped host's
// responses: gzip and deflate are undone, any other coding is an error.
func (mask) DecodeResponse(resp *http.Response) error { return secrets.DecodeResponse(resp) }
