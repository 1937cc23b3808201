// Package gatewayconf says which gateway the corral CLI talks to: the
// gateway's URL, the CA that vouches for it and the user's token, from
// flags, then the environment, then the file corral gateway login wrote.
// It imports no client code, so the lean corral can tell whether a command
// goes to a gateway without linking protobuf and Connect (package
// gatewayclient, in the full program, makes the calls).
package gatewayconf

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// The environment variables that name a gateway and its credential.
const (
	EnvURL       = "CORRAL_GATEWAY"
	EnvCA        = "CORRAL_GATEWAY_CA"
	EnvToken     = "CORRAL_GATEWAY_TOKEN"
	EnvTokenFile = "CORRAL_GATEWAY_TOKEN_FILE"
)

// Options are what the command line said (empty when not given).
type Options struct {
	URL    string
	CAFile string
}

// Target is a resolved gateway.
type Target struct {
	URL string
	// CAFile is the PEM file the gateway's certificate must verify
	// with; empty means the system's roots.
	CAFile string
	Token  string
	// TokenFrom names where the token came from, for error messages.
	TokenFrom string
}

// Configured reports whether a gateway is named anywhere: by the flag,
// the environment or a login file. Commands with a local variant use it
// to choose.
func Configured(o Options) (bool, error) {
	if o.URL != "" || os.Getenv(EnvURL) != "" {
		return true, nil
	}
	l, err := ReadLogin()
	if err != nil {
		return false, err
	}
	return l != nil, nil
}

// Resolve finds the gateway, its CA and the token. The login file's CA
// and token are used only for the gateway it was written for: a token is
// never sent to a gateway other than the one it was saved with, whatever
// --gateway or CORRAL_GATEWAY say.
func Resolve(o Options) (Target, error) {
	login, err := ReadLogin()
	if err != nil {
		return Target{}, err
	}
	raw := o.URL
	if raw == "" {
		raw = os.Getenv(EnvURL)
	}
	if raw == "" && login != nil {
		raw = login.URL
	}
	if raw == "" {
		return Target{}, errors.New("no gateway: pass --gateway URL, set " + EnvURL + ", or run corral gateway login")
	}
	u, err := NormalizeURL(raw)
	if err != nil {
		return Target{}, err
	}
	t := Target{URL: u}
	ours := login != nil && login.URL == u

	t.CAFile = o.CAFile
	if t.CAFile == "" {
		t.CAFile = os.Getenv(EnvCA)
	}
	if t.CAFile == "" && ours {
		t.CAFile = login.CAFile
	}

	switch {
	case os.Getenv(EnvToken) != "":
		t.Token, t.TokenFrom = strings.TrimSpace(os.Getenv(EnvToken)), "$"+EnvToken
	case os.Getenv(EnvTokenFile) != "":
		f := os.Getenv(EnvTokenFile)
		if t.Token, err = ReadToken(f); err != nil {
			return Target{}, fmt.Errorf("$%s: %w", EnvTokenFile, err)
		}
		t.TokenFrom = f
	case ours:
		t.Token, t.TokenFrom = login.Token, login.path
	default:
		msg := fmt.Sprintf("no token for the gateway at %s: run corral gateway login --gateway %s, or set %s or %s", u, u, EnvToken, EnvTokenFile)
		if login != nil {
			msg += fmt.Sprintf(" (the login in %s is for %s)", login.path, login.URL)
		}
		return Target{}, errors.New(msg)
	}
	return t, nil
}

// NormalizeURL checks a gateway URL and puts it in the one form the login
// file compares against: https, no trailing slash. A bare host:port gets
// https:// in front.
func NormalizeURL(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("gateway URL %q: %w", raw, err)
	}
	if u.Scheme != "https" {
		return "", fmt.Errorf("gateway URL %q: the gateway speaks TLS only; use https://HOST:PORT", raw)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("gateway URL %q: want https://HOST:PORT", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return u.String(), nil
}

// ReadToken reads a token from a file: its first line, without spaces.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("read token: %s is empty", path)
	}
	return tok, nil
}

// absCA makes a CA path absolute, so the login file works from any
// directory.
func absCA(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("gateway CA %s: %w", p, err)
	}
	return a, nil
}
