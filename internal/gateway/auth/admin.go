package auth

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// CreateToken stores a new token of kind and returns its secret, which
// exists nowhere else afterwards. A sandbox token needs the sandbox it is
// bound to.
func CreateToken(ctx context.Context, st store.Store, kind store.TokenKind, name, sandboxID string) (string, store.Token, error) {
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
	t := store.Token{ID: NewID(), Name: name, Kind: kind, SandboxID: sandboxID, Hash: Hash(secret)}
	if err := st.AddToken(ctx, t); err != nil {
		return "", store.Token{}, fmt.Errorf("store token: %w", err)
	}
	return secret, t, nil
}
