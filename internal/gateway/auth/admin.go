package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/policy"
)

// CreateToken stores a new token of kind and returns its secret, which
// exists nowhere else afterwards. A sandbox token needs the sandbox it is
// bound to. A join token may grant secrets: the gateway secrets the
// sandbox joining with it may take from_gateway (none when none are
// given); other kinds grant none. The token never expires.
func CreateToken(ctx context.Context, st store.Store, kind store.TokenKind, name, sandboxID string, secrets ...string) (string, store.Token, error) {
	return CreateTokenUntil(ctx, st, kind, name, sandboxID, time.Time{}, secrets...)
}

// CreateTokenUntil is CreateToken for a token refused from expires on
// (zero: never).
func CreateTokenUntil(ctx context.Context, st store.Store, kind store.TokenKind, name, sandboxID string, expires time.Time, secrets ...string) (string, store.Token, error) {
	if len(secrets) > 0 && kind != store.TokenJoin {
		return "", store.Token{}, fmt.Errorf("only a join token grants secrets (--secret goes with --join), not a %s token", kind)
	}
	for _, s := range secrets {
		if !policy.ValidGatewaySecretName(s) {
			return "", store.Token{}, fmt.Errorf("--secret %q: not a gateway secret name (letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit)", s)
		}
	}
	switch kind {
	case store.TokenUser, store.TokenJoin:
		if sandboxID != "" {
			return "", store.Token{}, fmt.Errorf("a %s token is bound to no sandbox", kind)
		}
	case store.TokenSandbox:
		if sandboxID == "" {
			return "", store.Token{}, errors.New("a sandbox token needs the sandbox id")
		}
		if _, err := st.GetSandbox(ctx, sandboxID); err != nil {
			return "", store.Token{}, fmt.Errorf("sandbox %s: %w", sandboxID, err)
		}
	default:
		return "", store.Token{}, fmt.Errorf("unknown token kind %q", kind)
	}
	if name == "" {
		return "", store.Token{}, errors.New("a token needs a name (--name)")
	}
	secret := NewSecret(kind)
	t := store.Token{ID: NewID(), Name: name, Kind: kind, SandboxID: sandboxID, Hash: Hash(secret), Secrets: slices.Compact(slices.Sorted(slices.Values(secrets))), ExpiresAt: expires}
	if err := st.AddToken(ctx, t); err != nil {
		return "", store.Token{}, fmt.Errorf("store token: %w", err)
	}
	return secret, t, nil
}

// IssueClientCert writes a client certificate for user name into outDir
// (PKI.IssueClient) and records it in st, without which it does not
// authenticate; revoking the record refuses it. Certificates that cannot
// be recorded are removed again.
func IssueClientCert(ctx context.Context, st store.Store, p *PKI, name, outDir string) (string, store.ClientCert, error) {
	path, cert, err := p.IssueClient(name, outDir)
	if err != nil {
		return "", store.ClientCert{}, err
	}
	c := store.ClientCert{Serial: SerialOf(cert), Name: name, IssuedAt: time.Now(), ExpiresAt: cert.NotAfter}
	if err := st.AddClientCert(ctx, c); err != nil {
		os.Remove(path)
		os.Remove(strings.TrimSuffix(path, ".pem") + "-key.pem")
		return "", store.ClientCert{}, fmt.Errorf("record the client certificate: %w", err)
	}
	return path, c, nil
}
