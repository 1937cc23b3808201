// Package gatewayclient is where the corral CLI calls a gateway: it builds
// the Connect clients (gRPC over TLS, HTTP/2) for the gateway gatewayconf
// resolves and turns their errors into messages a user can act on. Only
// corral's full program links it (internal/fullbin).
//
// It imports nothing of the gateway's server side, so corral stays free of
// SQL drivers and Prometheus.
package gatewayclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
	"github.com/corral-sandbox/corral/internal/gatewayconf"
)

// Client holds the user-facing services of one gateway.
type Client struct {
	Target    gatewayconf.Target
	Sandboxes gatewayv1connect.SandboxServiceClient
	Policies  gatewayv1connect.PolicyServiceClient
	Logs      gatewayv1connect.LogServiceClient
	Secrets   gatewayv1connect.SecretServiceClient
	Routes    gatewayv1connect.RouteServiceClient

	transport *http.Transport
}

// New builds the clients for t; nothing is dialled until the first call.
func New(t gatewayconf.Target) (*Client, error) {
	tr, err := Transport(t.CAFile)
	if err != nil {
		return nil, err
	}
	hc := bearer{token: t.Token, hc: &http.Client{Transport: tr}}
	o := connect.WithGRPC()
	return &Client{
		Target:    t,
		Sandboxes: gatewayv1connect.NewSandboxServiceClient(hc, t.URL, o),
		Policies:  gatewayv1connect.NewPolicyServiceClient(hc, t.URL, o),
		Logs:      gatewayv1connect.NewLogServiceClient(hc, t.URL, o),
		Secrets:   gatewayv1connect.NewSecretServiceClient(hc, t.URL, o),
		Routes:    gatewayv1connect.NewRouteServiceClient(hc, t.URL, o),
		transport: tr,
	}, nil
}

// Transport is how anything of corral reaches a gateway: TLS verified with
// the CA in caFile (the system's roots when empty), HTTP/2 for gRPC and its
// streams, and pings, since watches, log follows and a supervisor's stream
// stay open for hours and a gateway host that vanishes sends no reset.
func Transport(caFile string) (*http.Transport, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("gateway CA: %w (check --gateway-ca or $%s)", err, gatewayconf.EnvCA)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("gateway CA %s: no PEM certificate in it (the gateway's CA is tls/ca.pem in its data directory)", caFile)
		}
		cfg.RootCAs = roots
	}
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: 5 * time.Second,
		ForceAttemptHTTP2:   true,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 10 * time.Second},
	}, nil
}

// Close hangs up, so the gateway does not wait on an idle connection.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

// transportError reports an error of the connection itself: nothing
// answered, or the connection broke.
func transportError(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

type bearer struct {
	token string
	hc    *http.Client
}

func (b bearer) Do(r *http.Request) (*http.Response, error) {
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.hc.Do(r)
}

// Invalid reports whether the gateway found the request itself wrong (a
// bad policy, a finished sandbox): the user's input, not the connection,
// the credential or the gateway.
func Invalid(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		return connect.IsWireError(err)
	}
	return false
}

// Explain turns an error of a call to the gateway into what the user
// should know and do. sandboxID names the sandbox the call was about, for
// NotFound; it may be empty.
func (c *Client) Explain(err error, sandboxID string) error {
	if err == nil {
		return nil
	}
	t := c.Target
	if errors.Is(err, context.Canceled) {
		return err
	}
	var cv *tls.CertificateVerificationError
	var hn x509.HostnameError
	var ua x509.UnknownAuthorityError
	if errors.As(err, &cv) || errors.As(err, &hn) || errors.As(err, &ua) {
		if t.CAFile == "" {
			return fmt.Errorf("the gateway at %s has a certificate the system's roots do not verify: %w — pass --gateway-ca FILE (the gateway's tls/ca.pem)", t.URL, err)
		}
		return fmt.Errorf("the CA file %s does not verify the gateway at %s: %w — check --gateway-ca (the gateway's CA is tls/ca.pem in its data directory) and --gateway", t.CAFile, t.URL, err)
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return fmt.Errorf("the server at %s does not speak TLS (%w) — check --gateway", t.URL, err)
	}
	wire := connect.IsWireError(err)
	if !wire && transportError(err) {
		return fmt.Errorf("cannot reach the gateway at %s: %w — is corral gateway running? check --gateway", t.URL, err)
	}
	if !wire && (connect.CodeOf(err) == connect.CodeDeadlineExceeded || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("the gateway at %s did not answer in time: %w — is corral gateway running? check --gateway", t.URL, err)
	}
	msg := connect.CodeOf(err).String()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	// A server that answers with a bare HTTP status is refusing the
	// token (401, 403) as much as a gateway is; its other statuses mean
	// it is not a gateway at all.
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return fmt.Errorf("the gateway at %s refused the token from %s (%s) — run corral gateway login", t.URL, t.TokenFrom, msg)
	case connect.CodePermissionDenied:
		return fmt.Errorf("the gateway at %s does not let the token from %s do this (%s) — use a user token (corral gateway token create --name NAME on the gateway's host)", t.URL, t.TokenFrom, msg)
	}
	if !wire {
		if connect.CodeOf(err) == connect.CodeUnavailable || connect.CodeOf(err) == connect.CodeUnknown {
			return fmt.Errorf("cannot reach the gateway at %s: %w — is corral gateway running? check --gateway", t.URL, err)
		}
		return fmt.Errorf("the server at %s does not answer as a corral gateway (%w) — check --gateway", t.URL, err)
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		if sandboxID != "" {
			return fmt.Errorf("no sandbox %s at the gateway %s (see corral sandbox list)", sandboxID, t.URL)
		}
		return fmt.Errorf("the gateway at %s: %s", t.URL, msg)
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		// The gateway's checker wrote these for the user: as is.
		return errors.New(msg)
	case connect.CodeUnimplemented:
		return fmt.Errorf("the gateway at %s does not offer this call (%s): is it older than this corral?", t.URL, msg)
	}
	return fmt.Errorf("the gateway at %s: %w", t.URL, err)
}
