// Package auth holds the gateway's identities: its CA and certificates,
// bearer tokens, the principal each request acts as, and the one table of
// which principal may call which procedure.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"strings"

	"github.com/corral-sandbox/corral/internal/gateway/store"
)

// Token secrets start with a prefix naming their kind, so a person or a
// secret scanner can tell a user's token from a sandbox's at a glance.
// The store's record, not the prefix, decides what a token may do.
var prefixes = map[store.TokenKind]string{
	store.TokenUser:    "cgw_u_",
	store.TokenSandbox: "cgw_s_",
	store.TokenJoin:    "cgw_j_",
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewSecret returns a fresh token secret of kind: its prefix and 160
// random bits.
func NewSecret(kind store.TokenKind) string {
	b := make([]byte, 20)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return prefixes[kind] + strings.ToLower(b32.EncodeToString(b))
}

// Hash is what the store keeps of a secret: its hex SHA-256. The secrets
// are random, so no slow hash is needed against guessing.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// NewID returns a short random identifier for a token or a sandbox.
func NewID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
