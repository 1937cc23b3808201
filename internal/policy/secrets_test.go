package policy

import (
	"slices"
	"strings"
	"testing"
)

// secretPolicy is a proxy-mode policy whose only endpoint terminates TLS
// for api.example.com, followed by a secrets section.
func secretPolicy(secrets string) string {
	return endpointPolicy(restEndpoint+"access: full") + "secrets:\n" + indent(secrets, "  ")
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestSecretRules(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"invalid name", secretPolicy("1TOKEN: {from_env: T, hosts: [api.example.com]}\nMY-TOKEN: {from_env: T, hosts: [api.example.com]}"), []string{
			`secrets.1TOKEN: "1TOKEN" is not a valid environment variable name — use letters, digits and underscores, not starting with a digit, e.g. GITHUB_TOKEN`,
			`secrets.MY-TOKEN: "MY-TOKEN" is not a valid environment variable name — use letters, digits and underscores, not starting with a digit, e.g. GITHUB_TOKEN`}},
		{"empty name", secretPolicy("'': {from_env: T, hosts: [api.example.com]}"), []string{
			`secrets[""]: "" is not a valid environment variable name — use letters, digits and underscores, not starting with a digit, e.g. GITHUB_TOKEN`}},
		{"reserved names", secretPolicy("PATH: {from_env: T, hosts: [api.example.com]}\nHTTPS_PROXY: {from_env: T, hosts: [api.example.com]}\nno_proxy: {from_env: T, hosts: [api.example.com]}\nSSL_CERT_FILE: {from_env: T, hosts: [api.example.com]}\nCORRAL_SANDBOX: {from_env: T, hosts: [api.example.com]}"), []string{
			`secrets.CORRAL_SANDBOX: CORRAL_SANDBOX is set by corral itself — choose another variable name`,
			`secrets.HTTPS_PROXY: HTTPS_PROXY is set by corral itself — choose another variable name`,
			`secrets.PATH: PATH is set by corral itself — choose another variable name`,
			`secrets.SSL_CERT_FILE: SSL_CERT_FILE is set by corral itself — choose another variable name`,
			`secrets.no_proxy: no_proxy is set by corral itself — choose another variable name`}},
		{"no source", secretPolicy("TOKEN: {hosts: [api.example.com]}"), []string{
			`secrets.TOKEN: secret TOKEN needs from_env, from_file or from_gateway — add from_env: NAME (a variable in corral's environment), from_file: /path/to/file or from_gateway: NAME (a secret held by the gateway)`}},
		{"both sources", secretPolicy("TOKEN: {from_env: T, from_file: /run/t, hosts: [api.example.com]}"), []string{
			`secrets.TOKEN: secret TOKEN has from_env and from_file set; a secret takes its value from exactly one source — keep one of them`}},
		{"gateway and env", secretPolicy("TOKEN: {from_env: T, from_gateway: gh-token, hosts: [api.example.com]}"), []string{
			`secrets.TOKEN: secret TOKEN has from_env and from_gateway set; a secret takes its value from exactly one source — keep one of them`}},
		{"all three sources", secretPolicy("TOKEN: {from_env: T, from_file: /run/t, from_gateway: gh, hosts: [api.example.com]}"), []string{
			`secrets.TOKEN: secret TOKEN has from_env and from_file and from_gateway set; a secret takes its value from exactly one source — keep one of them`}},
		{"bad from_gateway", secretPolicy("TOKEN: {from_gateway: ../gh, hosts: [api.example.com]}\nOTHER: {from_gateway: '" + strings.Repeat("x", 129) + "', hosts: [api.example.com]}"), []string{
			`secrets.OTHER.from_gateway: secret OTHER: "` + strings.Repeat("x", 129) + `" is not a valid gateway secret name — use the name the secret has at the gateway: letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit`,
			`secrets.TOKEN.from_gateway: secret TOKEN: "../gh" is not a valid gateway secret name — use the name the secret has at the gateway: letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit`}},
		{"bad from_env", secretPolicy("TOKEN: {from_env: $GH_TOKEN, hosts: [api.example.com]}"), []string{
			`secrets.TOKEN.from_env: "$GH_TOKEN" is not a valid environment variable name — write the variable name alone, without $ or =, e.g. GITHUB_TOKEN`}},
		{"relative from_file", secretPolicy("TOKEN: {from_file: secrets/token, hosts: [api.example.com]}"), []string{
			`secrets.TOKEN.from_file: path "secrets/token" is not absolute — write it as an absolute path starting with /, e.g. "/secrets/token"`}},
		{"no hosts", secretPolicy("TOKEN: {from_env: T, hosts: []}"), []string{
			`secrets.TOKEN.hosts: no hosts, so the secret could never be used — list the hosts that should receive the real value, e.g. [api.github.com]`}},
		{"bad hosts", secretPolicy("TOKEN: {from_env: T, hosts: ['', '*', 'https://api.example.com', localhost]}"), []string{
			`secrets.TOKEN.hosts[0]: empty host — give a host name such as api.github.com, or remove the entry`,
			`secrets.TOKEN.hosts[1]: "*" matches every host — name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access`,
			`secrets.TOKEN.hosts[2]: "https://api.example.com" is a URL, not a host — write only the host name, e.g. api.example.com`,
			`secrets.TOKEN.hosts[3]: "localhost" is a loopback name — ` + forbiddenFix}},
		{"bad headers", secretPolicy("TOKEN: {from_env: T, hosts: [api.example.com], headers: ['', 'X Api Key', 'x-api-key:', host, TRANSFER-ENCODING, te, Proxy-Connection, keep-alive, Connection, Content-Length, Upgrade, Trailer]}"), []string{
			`secrets.TOKEN.headers[0]: "" is not a valid header name — write a header name such as Authorization or X-Api-Key`,
			`secrets.TOKEN.headers[1]: "X Api Key" is not a valid header name — write a header name such as Authorization or X-Api-Key`,
			`secrets.TOKEN.headers[2]: "x-api-key:" is not a valid header name — write a header name such as Authorization or X-Api-Key`,
			`secrets.TOKEN.headers[3]: Host is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[4]: Transfer-Encoding is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[5]: Te is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[6]: Proxy-Connection is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[7]: Keep-Alive is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[8]: Connection is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[9]: Content-Length is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[10]: Upgrade is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`,
			`secrets.TOKEN.headers[11]: Trailer is a hop-by-hop or framing header, which the proxy does not pass through unchanged — use the header the API reads the credential from, such as Authorization`}},

		{"host without endpoint", secretPolicy("TOKEN: {from_env: T, hosts: [api.example.com, uploads.example.com]}"), []string{
			`secrets.TOKEN.hosts[1]: secret TOKEN could not be swapped in requests to "uploads.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for uploads.example.com with protocol: rest and tls: terminate`}},
		{"host only in network.allow", "version: 1\nnetwork: {allow: [api.example.com]}\nsecrets:\n  TOKEN: {from_env: T, hosts: [API.Example.com]}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.example.com with protocol: rest and tls: terminate`}},
		{"endpoint without protocol", endpointPolicy("host: api.example.com\nport: 443") + "secrets:\n  TOKEN: {from_env: T, hosts: [api.example.com]}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.example.com with protocol: rest and tls: terminate`}},
		{"endpoint tls passthrough", endpointPolicy("host: api.example.com\nport: 443\nprotocol: rest\ntls: passthrough\naccess: full") + "secrets:\n  TOKEN: {from_env: T, hosts: [api.example.com]}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.example.com with protocol: rest and tls: terminate`}},
		{"endpoint tls skip", endpointPolicy("host: api.example.com\nport: 8080\nprotocol: rest\ntls: skip\naccess: full") + "secrets:\n  TOKEN: {from_env: T, hosts: [api.example.com]}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "api.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for api.example.com with protocol: rest and tls: terminate`}},
		{"wildcard secret, narrower endpoint", secretPolicy("TOKEN: {from_env: T, hosts: ['*.example.com']}"), []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "*.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for *.example.com with protocol: rest and tls: terminate`}},
		{"wildcard secret, other wildcard endpoint", endpointPolicy("host: '**.example.com'\nport: 443\nprotocol: rest\ntls: terminate\naccess: full") + "secrets:\n  TOKEN: {from_env: T, hosts: ['*.example.com']}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "*.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for *.example.com with protocol: rest and tls: terminate`}},
		{"endpoint pattern does not match", endpointPolicy("host: '*.example.com'\nport: 443\nprotocol: rest\ntls: terminate\naccess: full") + "secrets:\n  TOKEN: {from_env: T, hosts: [example.com, a.b.example.com]}\n", []string{
			`secrets.TOKEN.hosts[0]: secret TOKEN could not be swapped in requests to "example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for example.com with protocol: rest and tls: terminate`,
			`secrets.TOKEN.hosts[1]: secret TOKEN could not be swapped in requests to "a.b.example.com": no endpoint with protocol: rest terminates TLS for it — add an endpoint for a.b.example.com with protocol: rest and tls: terminate`}},
		{"block mode", "version: 1\nnetwork: {mode: block}\nsecrets:\n  TOKEN: {from_env: T, hosts: [api.example.com]}\n", []string{
			`secrets: network mode block leaves no network, so no secret can ever be used — allow the secrets' hosts with network_policies endpoints using protocol: rest and tls: terminate, or remove secrets`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.src)
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
}

func TestSecretsCovered(t *testing.T) {
	for _, src := range []string{
		secretPolicy("GITHUB_TOKEN: {from_env: GH_TOKEN, hosts: [api.example.com]}"),
		secretPolicy("TOKEN: {from_file: /run/secrets/token, hosts: [API.example.com], headers: [x-api-key, Authorization]}"),
		// Covered by a pattern endpoint, with tls unset (auto-detect).
		endpointPolicy("host: '*.example.com'\nport: 443\nprotocol: rest\naccess: full") + "secrets:\n  T: {from_env: T, hosts: [api.example.com, '*.example.com']}\n",
		endpointPolicy("host: '**.example.com'\nport: 443\nprotocol: rest\ntls: terminate\naccess: full") + "secrets:\n  T: {from_env: T, hosts: [a.b.example.com, '**.example.com']}\n",
		endpointPolicy("host: 'api-*.example.com'\nport: 443\nprotocol: rest\ntls: terminate\naccess: full") + "secrets:\n  T: {from_env: T, hosts: [api-eu.example.com]}\n",
		// Another endpoint for the same host may pass through; one that
		// terminates is enough.
		"version: 1\nnetwork_policies:\n  a: {endpoints: [{host: api.example.com, port: 22}]}\n  b: {endpoints: [{host: api.example.com, port: 443, protocol: rest, tls: terminate, access: full}]}\nsecrets:\n  T: {from_env: T, hosts: [api.example.com]}\n",
		// Mixed-case env names are valid; only corral's own are reserved.
		secretPolicy("path: {from_env: T, hosts: [api.example.com]}\n_x1: {from_env: _Y, hosts: [api.example.com]}"),
		secretPolicy("GH: {from_gateway: gh-token.v2, hosts: [api.example.com]}\nGH2: {from_gateway: GH_token, hosts: [api.example.com]}"),
	} {
		if got := problems(t, src); got != nil {
			t.Errorf("%s: unexpected problems:\n%s", src, strings.Join(got, "\n"))
		}
	}
}

func TestSecretWarnings(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"proxy mode", secretPolicy("T: {from_env: T, hosts: [api.example.com]}"), nil},
		{"allow mode", "version: 1\nnetwork: {mode: allow}\nsecrets:\n  T: {from_env: T, hosts: [api.example.com]}\n", []string{
			`secrets: network mode allow bypasses the proxy: the workload gets surrogates that are never swapped for the real values, so requests using them will fail — use network.mode: proxy with TLS-terminating endpoints for the secrets' hosts, or remove secrets`}},
		{"sandbox disabled", "version: 1\nsandbox: disabled\nsecrets:\n  T: {from_env: T, hosts: [api.example.com]}\n", []string{
			`sandbox: disabled: the command runs without any confinement — remove it to run the command sandboxed`,
			`secrets: sandbox disabled: the workload gets surrogates that are never swapped for the real values, so requests using them will fail — enable the sandbox, or remove secrets`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { requireWarnings(t, tt.src, tt.want) })
	}
}

func TestSecretDefaults(t *testing.T) {
	p := mustParse(t, secretPolicy("A: {from_env: A, hosts: [API.Example.com]}\nB: {from_env: B, hosts: [api.example.com], headers: [x-api-key, X-API-KEY, authorization]}"))
	if got := p.Secrets["A"]; !slices.Equal(got.Headers, []string{"Authorization"}) || !slices.Equal(got.Hosts, []string{"api.example.com"}) {
		t.Errorf("A = %+v, want headers [Authorization] and a lower-case host", got)
	}
	if got := p.Secrets["B"].Headers; !slices.Equal(got, []string{"X-Api-Key", "Authorization"}) {
		t.Errorf("B headers = %q, want canonical and without duplicates", got)
	}
	before := p.SHA256()
	p.ApplyDefaults()
	if p.SHA256() != before {
		t.Errorf("ApplyDefaults is not idempotent for secrets")
	}
}

func TestSecretsHash(t *testing.T) {
	a := mustParse(t, secretPolicy("T: {from_env: T, hosts: [api.example.com]}\nU: {from_file: /run/u, hosts: [api.example.com]}"))
	// Same secrets: other key order, default header spelled out, other case.
	b := mustParse(t, secretPolicy("U: {hosts: [API.example.com], from_file: /run/u}\nT: {from_env: T, hosts: [api.example.com], headers: [authorization]}"))
	if a.SHA256() != b.SHA256() {
		ja, _ := a.CanonicalJSON()
		jb, _ := b.CanonicalJSON()
		t.Errorf("equivalent secrets hash differently:\n%s\n%s", ja, jb)
	}
	if a.SHA256() == mustParse(t, endpointPolicy(restEndpoint+"access: full")).SHA256() {
		t.Errorf("secrets do not change the hash")
	}
	for _, src := range []string{
		secretPolicy("T: {from_env: T2, hosts: [api.example.com]}\nU: {from_file: /run/u, hosts: [api.example.com]}"),
		secretPolicy("T: {from_env: T, hosts: [api.example.com], headers: [X-Token]}\nU: {from_file: /run/u, hosts: [api.example.com]}"),
		secretPolicy("T: {from_env: T, hosts: [api.example.com]}\nV: {from_file: /run/u, hosts: [api.example.com]}"),
	} {
		if mustParse(t, src).SHA256() == a.SHA256() {
			t.Errorf("different secrets have the same hash: %s", src)
		}
	}

	// Hashing applies defaults to a copy, never to the caller's slices.
	raw := &Policy{Version: 1, Secrets: map[string]Secret{"T": {FromEnv: "T", Hosts: []string{"API.example.com"}, Headers: []string{"x-token"}}}}
	raw.SHA256()
	if s := raw.Secrets["T"]; s.Hosts[0] != "API.example.com" || s.Headers[0] != "x-token" {
		t.Errorf("SHA256 mutated the secrets: %+v", s)
	}
}

func TestGatewaySecrets(t *testing.T) {
	p := mustParse(t, secretPolicy("A: {from_gateway: tok, hosts: [api.example.com]}\nB: {from_env: B, hosts: [api.example.com]}\nC: {from_gateway: tok, hosts: [api.example.com]}\nD: {from_gateway: another, hosts: [api.example.com]}"))
	if got := p.GatewaySecrets(); !slices.Equal(got, []string{"another", "tok"}) {
		t.Errorf("GatewaySecrets = %q, want [another tok]", got)
	}
	if got := mustParse(t, secretPolicy("B: {from_env: B, hosts: [api.example.com]}")).GatewaySecrets(); got != nil {
		t.Errorf("GatewaySecrets without from_gateway = %q", got)
	}
}

// Gateway secret names: a letter or digit, then letters, digits, dots,
// dashes and underscores, 128 bytes at most.
func TestValidGatewaySecretName(t *testing.T) {
	for name, want := range map[string]bool{
		"gh-token": true, "A.b_c-1": true, strings.Repeat("a", 128): true,
		strings.Repeat("a", 129): false, "": false, ".hidden": false, "-x": false, "a/b": false, "a b": false,
	} {
		if got := ValidGatewaySecretName(name); got != want {
			t.Errorf("ValidGatewaySecretName(%q) = %v, want %v", name, got, want)
		}
	}
}
