package secrets

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
)

// knownPrefixes are kept verbatim in surrogates because clients and
// servers dispatch on them (git credential helpers, SDKs validating token
// shape, secret scanners). They reveal only the token type.
var knownPrefixes = []string{
	"github_pat_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
	"glpat-",
	"sk-ant-api03-", "sk-ant-", "sk-proj-", "sk-",
	"xoxb-", "xoxp-", "xoxa-",
	"AKIA", "ASIA",
	"hf_", "npm_", "pypi-",
}

// minRandom bounds how guessable a surrogate is and how likely it is to
// occur in a header by chance.
const minRandom = 8

// The chance of a fresh surrogate failing a check is at most about 10^-8
// per try, so running out of tries means the checks cannot be met.
const maxTries = 16

func knownPrefix(v string) string {
	best := ""
	for _, p := range knownPrefixes {
		if len(p) > len(best) && strings.HasPrefix(v, p) {
			best = p
		}
	}
	return best
}

// newSurrogate returns a random string shaped like real. It must not be or
// contain any real value, nor overlap another surrogate, since Swap and
// ScrubEnv would then confuse one secret for another or hand a real value
// to the workload.
func newSurrogate(real string, others []*entry) (string, error) {
	prefix := knownPrefix(real)
	randomisable := 0
	for i := len(prefix); i < len(real); i++ {
		if class(real[i]) != "" {
			randomisable++
		}
	}
	if randomisable < minRandom {
		return "", fmt.Errorf("too little randomisable content: %d letters or digits after the prefix, at least %d are needed so the surrogate cannot be guessed or collide with ordinary header text", randomisable, minRandom)
	}
	for range maxTries {
		g := randomise(real, len(prefix))
		if acceptable(g, real, others) {
			return g, nil
		}
	}
	return "", errors.New("could not generate a surrogate distinct from the real values and other surrogates")
}

func acceptable(g, real string, others []*entry) bool {
	if g == real {
		return false
	}
	for _, o := range others {
		if strings.Contains(g, o.real) || strings.Contains(g, o.surrogate) ||
			strings.Contains(o.surrogate, g) || strings.Contains(o.real, g) {
			return false
		}
	}
	return true
}

func class(c byte) string {
	switch {
	case 'a' <= c && c <= 'z':
		return "abcdefghijklmnopqrstuvwxyz"
	case 'A' <= c && c <= 'Z':
		return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	case '0' <= c && c <= '9':
		return "0123456789"
	}
	return ""
}

// randomise replaces each ASCII letter or digit from index from on with a
// uniformly random one of its class; everything else stays in place so
// separators and non-ASCII bytes keep the token's shape.
func randomise(real string, from int) string {
	b := []byte(real)
	for i := from; i < len(b); i++ {
		if set := class(b[i]); set != "" {
			b[i] = set[uniform(len(set))]
		}
	}
	return string(b)
}

// uniform returns a uniform integer in [0, n) for n <= 256, rejecting the
// bytes that would bias a plain modulo.
func uniform(n int) int {
	limit := 256 - 256%n
	var buf [1]byte
	for {
		rand.Read(buf[:])
		if int(buf[0]) < limit {
			return int(buf[0]) % n
		}
	}
}
