package inference

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/corral-sandbox/corral/internal/yamlsafe"
)

// Protocols a route can speak, named as in the policy and the audit log.
const (
	OpenAIChatCompletions = "openai_chat_completions"
	OpenAICompletions     = "openai_completions"
	OpenAIResponses       = "openai_responses"
	OpenAIEmbeddings      = "openai_embeddings"
	AnthropicMessages     = "anthropic_messages"
	ModelDiscovery        = "model_discovery"
)

var knownProtocols = map[string]bool{
	OpenAIChatCompletions: true, OpenAICompletions: true, OpenAIResponses: true,
	OpenAIEmbeddings: true, AnthropicMessages: true, ModelDiscovery: true,
}

// Host is the name the router answers inside the sandbox.
const Host = "inference.local"

// Placeholder is the API key the workload is given: clients insist on one,
// and it is worthless anywhere, because the router always replaces it.
const Placeholder = "corral-inference-placeholder"

// DefaultTimeout bounds a whole request, stream included, when the route
// sets none: long enough for a slow local model writing a long answer.
const DefaultTimeout = 10 * time.Minute

// Route is one configured backend. The same YAML is read from the policy's
// inference section and from an --inference-routes file.
type Route struct {
	Name      string    `yaml:"name" json:"name"`
	BaseURL   string    `yaml:"base_url" json:"base_url"`
	Protocols []string  `yaml:"protocols" json:"protocols"`
	Model     string    `yaml:"model,omitempty" json:"model,omitempty"`
	APIKey    KeySource `yaml:"api_key,omitempty" json:"api_key,omitzero"`
	// Auth is bearer, x-api-key or header:NAME; empty picks x-api-key for
	// a route that speaks only Anthropic (or is api.anthropic.com) and
	// bearer otherwise.
	Auth      string            `yaml:"auth,omitempty" json:"auth,omitempty"`
	Headers   map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
	Timeout   Duration          `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	CA        string            `yaml:"ca,omitempty" json:"ca,omitempty"`
	Translate bool              `yaml:"translate,omitempty" json:"translate,omitempty"`
}

// Config is the inference section of a policy, or a routes file.
type Config struct {
	Routes []Route `yaml:"routes" json:"routes"`
	// Env false keeps OPENAI_*/ANTHROPIC_* out of the workload's
	// environment; nil means true.
	Env *bool `yaml:"env,omitempty" json:"env,omitempty"`
}

// WantsEnv says whether the workload gets the base URLs and placeholder
// keys: only when there is a route to reach, and unless turned off.
func (c Config) WantsEnv() bool {
	return len(c.Routes) > 0 && (c.Env == nil || *c.Env)
}

// Environ is what the workload's environment gets when WantsEnv: the
// SDKs' base URLs pointed at inference.local and placeholder keys, which
// the SDKs insist on and the router always replaces.
func (c Config) Environ() []string {
	if !c.WantsEnv() {
		return nil
	}
	return []string{
		"OPENAI_BASE_URL=https://" + Host + "/v1",
		"ANTHROPIC_BASE_URL=https://" + Host,
		"OPENAI_API_KEY=" + Placeholder,
		"ANTHROPIC_API_KEY=" + Placeholder,
	}
}

// KeySource says where a route's key is read from; the key text itself
// never appears in a policy or routes file.
type KeySource struct {
	FromEnv  string `yaml:"from_env,omitempty" json:"from_env,omitempty"`
	FromFile string `yaml:"from_file,omitempty" json:"from_file,omitempty"`
}

// IsZero reports a route without a key (a local server that needs none).
func (k KeySource) IsZero() bool { return k.FromEnv == "" && k.FromFile == "" }

func (k KeySource) String() string {
	switch {
	case k.FromEnv != "":
		return "environment variable " + k.FromEnv
	case k.FromFile != "":
		return "file " + k.FromFile
	}
	return "no key"
}

// UnmarshalYAML refuses a key written inline without quoting it back: the
// generic decoder's type error would print the scalar, which is the key.
func (k *KeySource) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: api_key must be {from_env: NAME} or {from_file: PATH}; the key itself never goes in the file", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if val.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: api_key.%s must be a string", val.Line, key.Value)
		}
		switch key.Value {
		case "from_env":
			k.FromEnv = val.Value
		case "from_file":
			k.FromFile = val.Value
		default:
			return fmt.Errorf("line %d: api_key: unknown field %q (use from_env or from_file)", key.Line, key.Value)
		}
	}
	return nil
}

// Duration is a time.Duration written as "30s" or "10m".
type Duration time.Duration

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: timeout %q: want a duration such as 30s or 10m", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timeout: want a duration string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("timeout %q: want a duration such as 30s or 10m", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// LoadRoutesFile reads an --inference-routes file (see ParseRoutes).
func LoadRoutesFile(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading inference routes: %w", err)
	}
	c, err := ParseRoutes(data)
	if err != nil {
		return Config{}, fmt.Errorf("inference routes %s: %w", path, err)
	}
	return c, nil
}

// ParseRoutes reads a routes document, from a file or the gateway:
// strict YAML (unknown fields are errors), validated. An empty document is
// an empty Config.
func ParseRoutes(data []byte) (Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := yamlsafe.DecodeNext(dec, &c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

var (
	routeName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// reservedHeaders are set by the router itself; a route header with one
// of these names would break framing or smuggle a second credential.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Te": true, "Trailer": true, "Upgrade": true,
}

// Validate checks every route; each message names the route, the field
// and how to fix it.
func (c Config) Validate() error {
	var errs []error
	seen := map[string]int{}
	for i, r := range c.Routes {
		at := fmt.Sprintf("inference routes[%d]", i)
		if r.Name != "" {
			at += fmt.Sprintf(" (%s)", r.Name)
		}
		fail := func(field, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s: %s", at, field, fmt.Sprintf(format, args...)))
		}
		switch {
		case r.Name == "":
			fail("name", "missing; give every route a name (letters, digits, . _ -)")
		case !routeName.MatchString(r.Name):
			fail("name", "%q: use letters, digits, . _ - only", r.Name)
		default:
			if j, dup := seen[r.Name]; dup {
				fail("name", "%q is also routes[%d]; names must be unique", r.Name, j)
			}
			seen[r.Name] = i
		}
		checkBaseURL(r.BaseURL, fail)
		if len(r.Protocols) == 0 {
			fail("protocols", "missing; list what the backend speaks, e.g. [openai_chat_completions, model_discovery]")
		}
		ps := map[string]bool{}
		for _, p := range r.Protocols {
			if !knownProtocols[p] {
				fail("protocols", "unknown protocol %q; known: %s", p, strings.Join(sortedProtocols(), ", "))
			}
			if ps[p] {
				fail("protocols", "%q listed twice", p)
			}
			ps[p] = true
		}
		if strings.HasPrefix(r.Model, "route:") {
			fail("model", "%q: the model is what the backend is sent; route: is how a client picks a route", r.Model)
		}
		if r.APIKey.FromEnv != "" && r.APIKey.FromFile != "" {
			fail("api_key", "set from_env or from_file, not both")
		}
		if _, err := authHeader(r); err != nil {
			fail("auth", "%v", err)
		}
		for name, v := range r.Headers {
			switch {
			case !headerName.MatchString(name):
				fail("headers", "%q is not a valid header name", name)
			case reservedHeaders[http.CanonicalHeaderKey(name)]:
				fail("headers", "%q is set by corral itself", name)
			case isCredentialHeader(name):
				fail("headers", "%q carries a credential; use api_key and auth instead", name)
			}
			if strings.ContainsAny(v, "\r\n\x00") {
				fail("headers", "value of %q contains a line break", name)
			}
		}
		if r.Timeout < 0 {
			fail("timeout", "must not be negative")
		}
		if r.Translate && !ps[OpenAIChatCompletions] && !ps[AnthropicMessages] {
			fail("translate", "translation needs %s or %s in protocols", OpenAIChatCompletions, AnthropicMessages)
		}
	}
	return errors.Join(errs...)
}

func checkBaseURL(raw string, fail func(field, format string, args ...any)) {
	if raw == "" {
		fail("base_url", "missing; e.g. https://api.openai.com/v1 or http://127.0.0.1:11434")
		return
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		fail("base_url", "%q does not parse as a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https":
		fail("base_url", "%q: scheme must be http or https", raw)
	case u.Host == "":
		fail("base_url", "%q has no host", raw)
	case u.User != nil:
		// Not quoted: the userinfo may hold a password.
		fail("base_url", "must not carry user:password; use api_key")
	case u.RawQuery != "" || u.Fragment != "":
		fail("base_url", "%q must not have a query or fragment; use headers", raw)
	}
}

func sortedProtocols() []string {
	return []string{AnthropicMessages, ModelDiscovery, OpenAIChatCompletions, OpenAICompletions, OpenAIEmbeddings, OpenAIResponses}
}

func isCredentialHeader(name string) bool {
	switch strings.ToLower(name) {
	case "authorization", "x-api-key", "api-key", "proxy-authorization":
		return true
	}
	return false
}

// authHeader is the header the route's key goes in, and whether it takes
// a "Bearer " prefix is decided by the caller from the name.
func authHeader(r Route) (string, error) {
	switch {
	case r.Auth == "bearer":
		return "Authorization", nil
	case r.Auth == "x-api-key":
		return "X-Api-Key", nil
	case strings.HasPrefix(r.Auth, "header:"):
		name := strings.TrimPrefix(r.Auth, "header:")
		if !headerName.MatchString(name) || reservedHeaders[http.CanonicalHeaderKey(name)] {
			return "", fmt.Errorf("%q: header:NAME needs a valid header name that corral does not set itself", r.Auth)
		}
		return http.CanonicalHeaderKey(name), nil
	case r.Auth != "":
		return "", fmt.Errorf("%q: use bearer, x-api-key or header:NAME", r.Auth)
	}
	u, _ := url.Parse(r.BaseURL)
	anthropicOnly := len(r.Protocols) > 0
	for _, p := range r.Protocols {
		if p != AnthropicMessages && p != ModelDiscovery {
			anthropicOnly = false
		}
	}
	if anthropicOnly || (u != nil && strings.HasSuffix(u.Hostname(), "anthropic.com")) {
		return "X-Api-Key", nil
	}
	return "Authorization", nil
}
