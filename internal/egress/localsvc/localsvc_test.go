package localsvc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/localsvc"
	"github.com/corral-sandbox/corral/internal/l7/ca"
)

// The service speaks plain HTTP, HTTPS/1.1 and HTTP/2 on whatever
// connection it is handed, and its handler learns who is asking.
func TestServesEveryProtocol(t *testing.T) {
	authority, err := ca.New("test", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc := &localsvc.Service{Name: "policy.local", CA: authority, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := egress.RequestFrom(r.Context())
		if !ok {
			http.Error(w, "no request", 500)
			return
		}
		io.WriteString(w, r.Proto+" "+req.Identity.Binary+" "+r.URL.Path)
	})}
	pool := x509.NewCertPool()
	pool.AddCert(authority.Certificate())
	for _, tc := range []struct {
		name, scheme, want string
		h2                 bool
	}{
		{"plain", "http", "HTTP/1.1 /usr/bin/curl /v1/drafts", false},
		{"https", "https", "HTTP/1.1 /usr/bin/curl /v1/drafts", false},
		{"h2", "https", "HTTP/2.0 /usr/bin/curl /v1/drafts", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &http.Transport{
				TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "policy.local"},
				ForceAttemptHTTP2: tc.h2,
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					c, s := net.Pipe()
					go svc.ServeConn(context.Background(), s, egress.Request{Host: "policy.local", Identity: egress.Identity{Binary: "/usr/bin/curl"}})
					return c, nil
				},
			}
			if !tc.h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get(tc.scheme + "://policy.local/v1/drafts")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != tc.want {
				t.Errorf("got %q, want %q", body, tc.want)
			}
		})
	}
}
