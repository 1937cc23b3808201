package gatewaylink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// state is what a supervisor keeps of its link between runs, in a
// directory of its own under the state directory: the sandbox credential
// a join token was exchanged for (the join token is spent, so a restarted
// supervisor could not join again) and the last policy it loaded, its
// fallback when the gateway cannot be reached at start.
type state struct {
	dir string
}

// newState names the directory for the link given by url and the token
// the user handed over, so another gateway or another token file never
// picks up this one's credential or policy.
func newState(stateDir, url, token string) state {
	h := sha256.Sum256([]byte(url + "\x00" + token))
	return state{dir: filepath.Join(stateDir, "gateway", hex.EncodeToString(h[:12]))}
}

type credential struct {
	SandboxID string `json:"sandbox_id"`
	Token     string `json:"token"`
}

type cachedPolicy struct {
	Version int64  `json:"version"`
	YAML    []byte `json:"yaml"`
}

func (s state) credentialPath() string { return filepath.Join(s.dir, "credential.json") }
func (s state) policyPath() string     { return filepath.Join(s.dir, "policy.json") }

// loadCredential returns the saved credential, nil when there is none.
func (s state) loadCredential() (*credential, error) {
	var c credential
	if ok, err := s.read(s.credentialPath(), &c); !ok || err != nil {
		return nil, err
	}
	if c.Token == "" {
		return nil, fmt.Errorf("saved gateway credential %s has no token", s.credentialPath())
	}
	return &c, nil
}

func (s state) saveCredential(c credential) error { return s.write(s.credentialPath(), c) }

// loadPolicy returns the last policy loaded, nil when there is none.
func (s state) loadPolicy() (*cachedPolicy, error) {
	var p cachedPolicy
	if ok, err := s.read(s.policyPath(), &p); !ok || err != nil {
		return nil, err
	}
	return &p, nil
}

func (s state) savePolicy(p cachedPolicy) error { return s.write(s.policyPath(), p) }

func (s state) read(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read gateway state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("read gateway state %s: %w", path, err)
	}
	return true, nil
}

// write replaces path atomically, 0600: it may hold a credential, and a
// supervisor killed mid-write must not leave half a file for the next run.
func (s state) write(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode gateway state: %w", err)
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create gateway state directory: %w", err)
	}
	f, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("write gateway state: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write gateway state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write gateway state: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write gateway state: %w", err)
	}
	return nil
}
