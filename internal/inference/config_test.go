package inference

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRoutesFile(t *testing.T) {
	c, err := LoadRoutesFile(writeFile(t, `
routes:
  - name: local
    base_url: http://127.0.0.1:11434/v1
    protocols: [openai_chat_completions, model_discovery]
    model: qwen2.5-coder
    translate: true
    timeout: 90s
  - name: claude
    base_url: https://api.anthropic.com
    protocols: [anthropic_messages]
    api_key: {from_file: /run/keys/anthropic}
    headers: {anthropic-beta: x}
env: false
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 2 || c.Routes[0].Timeout != Duration(90*time.Second) || !c.Routes[0].Translate ||
		c.Routes[1].APIKey.FromFile != "/run/keys/anthropic" || c.WantsEnv() {
		t.Errorf("%+v", c)
	}
	if a, _ := authHeader(c.Routes[1]); a != "X-Api-Key" {
		t.Errorf("anthropic default auth %q", a)
	}
	if a, _ := authHeader(c.Routes[0]); a != "Authorization" {
		t.Errorf("openai default auth %q", a)
	}
	if env := c.Environ(); env != nil {
		t.Errorf("env: false still sets %v", env)
	}
	c.Env = nil
	if env := strings.Join(c.Environ(), " "); env != "OPENAI_BASE_URL=https://inference.local/v1 ANTHROPIC_BASE_URL=https://inference.local "+
		"OPENAI_API_KEY="+Placeholder+" ANTHROPIC_API_KEY="+Placeholder {
		t.Errorf("environ %q", env)
	}
	empty, err := LoadRoutesFile(writeFile(t, ""))
	if err != nil || len(empty.Routes) != 0 || empty.WantsEnv() {
		t.Errorf("empty file: %+v %v", empty, err)
	}
	if _, err := LoadRoutesFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestValidateMessages(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"routes: [{name: a, base_url: http://h, protocols: [openai_chat_completions], colour: red}]", "field colour not found"},
		{"routes: [{base_url: http://h, protocols: [openai_chat_completions]}]", "routes[0]: name: missing"},
		{"routes: [{name: a, base_url: http://h, protocols: [x]}, {name: a, base_url: http://h, protocols: [openai_embeddings]}]", "unknown protocol \"x\""},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings]}, {name: a, base_url: http://h, protocols: [openai_embeddings]}]", "routes[1] (a): name: \"a\" is also routes[0]"},
		{"routes: [{name: a, base_url: ftp://h, protocols: [openai_embeddings]}]", "scheme must be http or https"},
		{"routes: [{name: a, base_url: 'http://h?k=v', protocols: [openai_embeddings]}]", "query"},
		{"routes: [{name: a, base_url: http://h, protocols: []}]", "protocols: missing"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], auth: basic}]", "auth: \"basic\""},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], auth: 'header:Host'}]", "header:NAME"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], headers: {Authorization: x}}]", "carries a credential"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], headers: {Content-Length: '1'}}]", "set by corral itself"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], timeout: soon}]", "want a duration"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], translate: true}]", "translate: translation needs"},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], model: 'route:b'}]", "model: \"route:b\""},
		{"routes: [{name: a, base_url: http://h, protocols: [openai_embeddings], api_key: {from_env: A, from_file: B}}]", "not both"},
		// A list key beside a merge key panics inside yaml.v3; the gateway
		// parses routes from its API, so this must be an error.
		{"routes: [{? [a] : 1, <<: {name: a}}]", "cannot handle"},
	} {
		_, err := LoadRoutesFile(writeFile(t, tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n  error %v\n  want it to say %q", tc.yaml, err, tc.want)
		}
	}
}

func TestUpstreamURL(t *testing.T) {
	for _, tc := range [][3]string{
		{"https://api.openai.com/v1", "/v1/chat/completions", "https://api.openai.com/v1/chat/completions"},
		{"https://api.openai.com/v1/", "/v1/models", "https://api.openai.com/v1/models"},
		{"https://api.anthropic.com", "/v1/messages", "https://api.anthropic.com/v1/messages"},
		{"http://127.0.0.1:8080/openai/v1", "/v1/embeddings", "http://127.0.0.1:8080/openai/v1/embeddings"},
		{"http://127.0.0.1:8080/proxy", "/v1/messages", "http://127.0.0.1:8080/proxy/v1/messages"},
	} {
		r := Route{BaseURL: tc[0]}
		rt := &route{Route: r}
		rt.base, _ = url.Parse(tc[0])
		if got := upstreamURL(rt.base, tc[1], ""); got != tc[2] {
			t.Errorf("%s + %s = %s, want %s", tc[0], tc[1], got, tc[2])
		}
	}
}

func TestRewriteModel(t *testing.T) {
	for _, tc := range [][2]string{
		{`{"model":"a","x":1}`, `{"model":"NEW","x":1}`},
		{"{\n  \"messages\": [ {\"model\": \"keep\"} ],\n  \"model\" :\t\"a\"\n}", "{\n  \"messages\": [ {\"model\": \"keep\"} ],\n  \"model\" :\t\"NEW\"\n}"},
		{`{"model":"a","model":"b"}`, `{"model":"NEW","model":"NEW"}`},
		{`{"model":null}`, `{"model":"NEW"}`},
		{`{"x":"model"}`, `{"x":"model"}`},
		{`{"model":"a"`, `{"model":"a"`},
		{`{"model":"a"} trailing`, `{"model":"a"} trailing`},
		{`{"mod\u0065l":"a", "m":[1,{"model":"x"}],"n":-1.5e3,"t":true}`, `{"mod\u0065l":"NEW", "m":[1,{"model":"x"}],"n":-1.5e3,"t":true}`},
		{`{"s":"a\"}model","model":"b"}`, `{"s":"a\"}model","model":"NEW"}`},
		{` { } `, ` { } `},
	} {
		_, spans := modelSpans([]byte(tc[0]))
		if got := string(rewriteModel([]byte(tc[0]), spans, "NEW")); got != tc[1] {
			t.Errorf("%q -> %q, want %q", tc[0], got, tc[1])
		}
	}
}
