// Package secretbox seals the gateway's secrets at rest with AES-256-GCM
// under a key kept in the gateway's data directory, so a copy of the
// database alone (a backup, a PostgreSQL dump) reveals no credential.
package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// KeySize is the key length: AES-256.
const KeySize = 32

// Box seals and opens values under one key.
type Box struct {
	aead cipher.AEAD
}

// New returns a Box for key, which must be KeySize bytes.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secret key: %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return &Box{aead: aead}, nil
}

// LoadOrCreate reads the key at path, or makes a random one there (mode
// 0600) when the file does not exist. A key file readable by others is
// refused rather than used, since it would unseal every secret.
func LoadOrCreate(path string) (*Box, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("make secret key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create secret key: %w", err)
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			return nil, fmt.Errorf("write secret key %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("write secret key %s: %w", path, err)
		}
		return New(key)
	}
	if err != nil {
		return nil, fmt.Errorf("read secret key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secret key %s has mode %v: it must be readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	}
	return New(key)
}

// Seal encrypts value for the secret called name. The name is bound as
// additional data, so a sealed value copied to another name's row does not
// open.
func (b *Box) Seal(name string, value []byte) ([]byte, error) {
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %s: %w", name, err)
	}
	return b.aead.Seal(nonce, nonce, value, []byte(name)), nil
}

// Open decrypts what Seal made for name.
func (b *Box) Open(name string, sealed []byte) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n+b.aead.Overhead() {
		return nil, fmt.Errorf("open secret %s: sealed value too short", name)
	}
	v, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("open secret %s: wrong key or tampered value", name)
	}
	return v, nil
}
