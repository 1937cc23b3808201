package e2e

import (
	"encoding/binary"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// gRPC's own Node client (@grpc/grpc-js) calls a gRPC service on the lab
// through an inspected endpoint whose rules allow one method: the call
// allowed gets its reply and its status, which gRPC sends in HTTP/2
// trailers, and the other method is refused before it reaches the server.

var addrGRPC = netip.MustParseAddr("203.0.113.55")

const labProto = `syntax = "proto3";
package lab;
service Greeter {
  rpc SayHello (HelloRequest) returns (HelloReply);
  rpc Secret (HelloRequest) returns (HelloReply);
}
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }
`

const grpcClient = `const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');
const lab = grpc.loadPackageDefinition(loader.loadSync(process.env.W + '/lab.proto')).lab;
// Default roots: Node's, plus NODE_EXTRA_CA_CERTS (the sandbox's bundle).
const c = new lab.Greeter('grpc.test:443', grpc.credentials.createSsl());
const call = (m) => new Promise((done) => c[m]({name: 'sandbox'}, {deadline: Date.now() + 20000},
  (err, r) => done(err ? 'GRPC_ERR ' + m + ' ' + err.code : 'GRPC_OK ' + m + ' ' + r.message)));
(async () => {
  console.log(await call('SayHello'));
  console.log(await call('Secret'));
  c.close();
})();
`

// greeter answers lab.Greeter's methods in gRPC's wire format: one
// length-prefixed protobuf message each way (field 1, a string) and the
// status in trailers.
func greeter(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if r.ProtoMajor != 2 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") || len(body) < 5 {
			http.Error(w, "want one gRPC message over HTTP/2", http.StatusUnsupportedMediaType)
			return
		}
		msg := body[5:]
		name := ""
		if len(msg) >= 2 && msg[0] == 0x0a && int(msg[1]) <= len(msg)-2 {
			name = string(msg[2 : 2+int(msg[1])])
		}
		reply := "hello " + name + " from " + strings.TrimPrefix(r.URL.Path, "/lab.Greeter/")
		out := append([]byte{0x0a, byte(len(reply))}, reply...)
		frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(out)))
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		w.Write(append(frame, out...))
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("Grpc-Message", "")
	})
}

func TestGRPCClient(t *testing.T) {
	requireRoot(t)
	sdks := os.Getenv("CORRAL_NODE_SDKS")
	if _, err := os.Stat(filepath.Join(sdks, "node_modules", "@grpc", "grpc-js", "package.json")); sdks == "" || err != nil {
		requireFeature(t, "@grpc/grpc-js is not installed under CORRAL_NODE_SDKS (.ci/run installs it)")
	}
	lab := netlab.Start(t, netlab.Host{Name: "grpc.test", Addr: addrGRPC})
	lab.Serve("grpc.test", greeter(t))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "lab.proto"), []byte(labProto), 0o644)
		writeOwned(t, m, filepath.Join(fx.W, "client.js"), []byte(grpcClient), 0o644)
		r := runCorral(t, fx, runOpts{
			args: []string{"/usr/bin/node", filepath.Join(fx.W, "client.js")},
			policy: basePolicy(`network_policies:
  grpc:
    endpoints:
      - host: grpc.test
        port: 443
        protocol: rest
        rules:
          - allow: {method: POST, path: /lab.Greeter/SayHello}
    binaries: [{path: /usr/bin/node}]
`),
			flags: []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", labCAFile(t, fx, lab),
				"--env", "W=" + fx.W, "--env", "NODE_PATH=" + filepath.Join(sdks, "node_modules")},
			timeout: 90 * time.Second,
		})
		if !strings.Contains(r.stdout, "GRPC_OK SayHello hello sandbox from SayHello\n") {
			t.Errorf("the allowed gRPC call did not get its reply and status\n%s", r)
			for _, s := range lab.HTTPRequests() {
				t.Logf("lab saw %s %s %s %v body %d", s.Proto, s.Method, s.Path, s.Header, len(s.Body))
			}
		}
		// grpc-js maps the 403 corral answers to PERMISSION_DENIED (7).
		if !strings.Contains(r.stdout, "GRPC_ERR Secret 7\n") {
			t.Errorf("the gRPC method the rules do not allow was not refused as PERMISSION_DENIED\n%s", r)
		}
		r.requireEvent(t, "http.request", map[string]any{"host": "grpc.test", "method": "POST", "path": "/lab.Greeter/Secret", "decision": "deny"})
		for _, s := range lab.HTTPRequests() {
			if s.Path == "/lab.Greeter/Secret" {
				t.Errorf("the refused method reached the server")
			}
		}
	})
}
