package gatewayconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Login is what corral gateway login saves: one gateway, the CA that
// vouches for it and the user's token for it.
type Login struct {
	URL    string `json:"url"`
	CAFile string `json:"ca_file,omitempty"`
	Token  string `json:"token"`

	path string
}

// LoginPath is $XDG_CONFIG_HOME/corral/gateway.json, by default
// ~/.config/corral/gateway.json.
func LoginPath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if !filepath.IsAbs(dir) { // the XDG spec says to ignore a relative one
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find the login file: %w", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "corral", "gateway.json"), nil
}

// ReadLogin returns the saved login, or nil when there is none (also when
// there is no home directory to hold one). A login
// file others can read is refused: it holds a token.
func ReadLogin() (*Login, error) {
	path, err := LoginPath()
	if err != nil {
		// Without a home nobody could have logged in (corral run's
		// sandboxes and services often have none).
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the gateway login: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read the gateway login: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("the gateway login %s holds a token but others may read it (mode %04o): chmod 600 %s, or log in again",
			path, fi.Mode().Perm(), path)
	}
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var l Login
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("the gateway login %s is damaged (%v): run corral gateway login again", path, err)
	}
	if l.URL, err = NormalizeURL(l.URL); err != nil || l.Token == "" {
		return nil, fmt.Errorf("the gateway login %s is incomplete: run corral gateway login again", path)
	}
	l.path = path
	return &l, nil
}

// WriteLogin saves l, replacing any earlier login, as a 0600 file in a
// 0700 directory, and returns its path. The CA path is made absolute.
func WriteLogin(l Login) (string, error) {
	path, err := LoginPath()
	if err != nil {
		return "", err
	}
	if l.URL, err = NormalizeURL(l.URL); err != nil {
		return "", err
	}
	if l.CAFile, err = absCA(l.CAFile); err != nil {
		return "", err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	// MkdirAll leaves an existing directory as it is.
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&l); err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	// A temporary file and a rename: a crash leaves the old login or the
	// new one, and the token is never in a file with looser permissions.
	tmp, err := os.CreateTemp(dir, ".gateway-*.json")
	if err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("save the gateway login: %w", err)
	}
	return path, nil
}

// RemoveLogin deletes the saved login and returns its path and whether
// there was one.
func RemoveLogin() (string, bool, error) {
	path, err := LoginPath()
	if err != nil {
		return "", false, err
	}
	err = os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return path, false, nil
	}
	if err != nil {
		return path, false, fmt.Errorf("remove the gateway login: %w", err)
	}
	return path, true, nil
}
