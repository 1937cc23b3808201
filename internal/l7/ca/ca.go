// Package ca is the certificate authority the egress proxy uses to terminate
// TLS on behalf of the upstream servers a sandbox talks to.
//
// Each sandbox gets its own CA, generated when the sandbox starts and never
// written anywhere: the private key lives only in this process's memory, so a
// leaked bundle or a crashed proxy cannot be turned into a CA that some other
// sandbox (or the host) trusts. The CA may sign only end-entity certificates
// (MaxPathLen 0) and lives no longer than the validity it is given.
//
// Leaf certificates are minted lazily, one per host the sandbox dials, with a
// fresh P-256 key each. Minting costs a key generation and a signature, so
// leaves are kept in a bounded LRU keyed by the normalised host. When many
// connections to a host start at once (a client opening a connection pool),
// the first caller mints and the others wait on that host's in-flight entry;
// the cache lock is never held while signing, so a slow mint for one host does
// not stall handshakes for others.
//
// The sandbox learns to trust the CA through Bundle, which appends the CA
// certificate to the host's system bundle (see SystemBundle) so that tools
// reading a single CA file keep trusting the public roots as well.
package ca

import (
	"bytes"
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/hostpattern"
)

// DefaultCacheSize is the number of leaves kept when New is given no size.
// A sandbox rarely talks to more than a few hundred distinct hosts, and a
// cached leaf costs about a kilobyte plus its key.
const DefaultCacheSize = 1024

const (
	// defaultValidity outlives any reasonable sandbox session while still
	// bounding how long a leaked CA certificate stays meaningful.
	defaultValidity = 30 * 24 * time.Hour
	// backdate absorbs clock skew between the proxy and the sandboxed
	// client, which otherwise rejects a certificate minted "in the future".
	backdate = time.Hour
	// renewBefore makes a cached leaf be replaced while it still has time
	// left, so a long-lived connection started on it does not outlast it.
	renewBefore = time.Hour
	// maxNameLen is the longest DNS name in presentation form (RFC 1035).
	maxNameLen = 253
	// maxLabelLen is the longest DNS label (RFC 1035).
	maxLabelLen = 63
)

// CA is a per-sandbox ephemeral certificate authority. Its private key only
// ever lives in this process's memory.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey

	mu       sync.Mutex
	capacity int
	lru      *list.List // of *entry, most recently used at the front
	entries  map[string]*list.Element
	inflight map[string]*call

	// mintHook, when set, runs at the start of every mint. Tests use it to
	// count mints and to hold a mint open; it is never set in production.
	mintHook func(host string)
}

type entry struct {
	host string
	cert *tls.Certificate
}

// call is one in-flight mint that later callers for the same host wait on.
type call struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

// New generates an ECDSA P-256 self-signed CA for the sandbox sandboxID,
// valid until validity from now (0 means 30 days). cacheSize bounds the leaf
// cache; cacheSize <= 0 means DefaultCacheSize.
func New(sandboxID string, validity time.Duration, cacheSize int) (*CA, error) {
	if validity < 0 {
		return nil, fmt.Errorf("ca: negative validity %v", validity)
	}
	if validity == 0 {
		validity = defaultValidity
	}
	if cacheSize <= 0 {
		cacheSize = DefaultCacheSize
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   "corral sandbox " + sandboxID,
			Organization: []string{"corral"},
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	// Leaves take their AuthorityKeyId from this, which lets clients that
	// hold several corral CAs pick the right one without trying each.
	if tmpl.SubjectKeyId, err = subjectKeyID(&key.PublicKey); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca: sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parse CA certificate: %w", err)
	}
	return &CA{
		cert:     cert,
		certPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:      key,
		capacity: cacheSize,
		lru:      list.New(),
		entries:  make(map[string]*list.Element),
		inflight: make(map[string]*call),
	}, nil
}

// CertPEM is the CA certificate in PEM.
func (c *CA) CertPEM() []byte {
	// A copy, so a caller that edits the bundle it builds from this cannot
	// change what later callers are handed.
	return bytes.Clone(c.certPEM)
}

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Len is the number of cached leaves (for tests and metrics).
func (c *CA) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Leaf returns a TLS certificate for host whose chain is the leaf followed by
// the CA. host is a DNS name, matched case-insensitively and without a
// trailing dot, or an IP literal, which gets an IP SAN instead of a DNS one.
// Leaves are minted on first use and cached; a cached leaf close to expiry is
// replaced.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	key, ip, err := normalizeHost(host)
	if err != nil {
		return nil, err
	}

	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*entry)
		if time.Until(e.cert.Leaf.NotAfter) > renewBefore {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			return e.cert, nil
		}
		// Dropped rather than kept as a fallback: handing out a leaf that
		// expires mid-connection fails later and more confusingly than a
		// mint error now.
		c.lru.Remove(el)
		delete(c.entries, key)
	}
	if cl, ok := c.inflight[key]; ok {
		c.mu.Unlock()
		<-cl.done
		return cl.cert, cl.err
	}
	cl := &call{done: make(chan struct{})}
	c.inflight[key] = cl
	c.mu.Unlock()

	cl.cert, cl.err = c.mint(key, ip)

	c.mu.Lock()
	delete(c.inflight, key)
	if cl.err == nil {
		c.entries[key] = c.lru.PushFront(&entry{host: key, cert: cl.cert})
		for c.lru.Len() > c.capacity {
			oldest := c.lru.Back()
			c.lru.Remove(oldest)
			delete(c.entries, oldest.Value.(*entry).host)
		}
	}
	c.mu.Unlock()
	// Closed after the cache is updated so that a waiter that comes back
	// for the same host finds the leaf cached rather than minting again.
	close(cl.done)
	return cl.cert, cl.err
}

// mint signs a new leaf for the normalised host; ip is non-nil for IP hosts.
func (c *CA) mint(host string, ip net.IP) (*tls.Certificate, error) {
	if c.mintHook != nil {
		c.mintHook(host)
	}
	now := time.Now()
	if !now.Add(-backdate).Before(c.cert.NotAfter) {
		return nil, fmt.Errorf("ca: CA certificate expired at %v", c.cert.NotAfter)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca: generate leaf key for %q: %w", host, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-backdate),
		// A leaf cannot usefully outlive its issuer, and tying the two
		// together means a CA rotation is the only expiry to reason about.
		NotAfter:              c.cert.NotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		// x509 would copy this from the issuer anyway; it is spelled out
		// because the proxy's clients rely on it to pick the issuer.
		AuthorityKeyId: c.cert.SubjectKeyId,
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("ca: sign leaf for %q: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parse leaf for %q: %w", host, err)
	}
	return &tls.Certificate{
		Certificate: [][]byte{der, c.cert.Raw},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}

// normalizeHost returns the cache key for host and, for an IP literal, the
// address. IPs are keyed by their canonical form so that spellings of one
// address share a leaf.
func normalizeHost(host string) (string, net.IP, error) {
	if host == "" {
		return "", nil, errors.New("ca: empty host")
	}
	if hostpattern.MayBeAddr(host) {
		if ip := net.ParseIP(host); ip != nil {
			return ip.String(), ip, nil
		}
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if name == "" {
		return "", nil, fmt.Errorf("ca: invalid host %q", host)
	}
	if len(name) > maxNameLen {
		return "", nil, fmt.Errorf("ca: host %q longer than %d bytes", host, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		switch b := name[i]; {
		case 'a' <= b && b <= 'z', '0' <= b && b <= '9', b == '.', b == '-', b == '_', b == '*':
		default:
			return "", nil, fmt.Errorf("ca: host %q contains %q", host, b)
		}
	}
	// Empty or overlong labels cannot come from a real SNI, and Go's own
	// verifier would never match such a SAN, so the leaf would be useless.
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > maxLabelLen {
			return "", nil, fmt.Errorf("ca: host %q has an empty or overlong label", host)
		}
	}
	return name, nil, nil
}

// randomSerial returns a random 128-bit serial number. RFC 5280 requires
// serials to be unique per issuer, and randomness is the only way to get that
// without persisting a counter for a CA that is never persisted.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("ca: generate serial: %w", err)
	}
	return n, nil
}

// subjectKeyID derives a key identifier from the public key (RFC 7093
// method 1: SHA-256 of the subjectPublicKey bits, truncated to 160 bits). For
// an EC key those bits are the uncompressed point.
func subjectKeyID(pub *ecdsa.PublicKey) ([]byte, error) {
	k, err := pub.ECDH()
	if err != nil {
		return nil, fmt.Errorf("ca: encode CA public key: %w", err)
	}
	sum := sha256.Sum256(k.Bytes())
	return sum[:20], nil
}

// systemBundlePaths lists where distributions keep the PEM bundle of trusted
// roots, most common first; a variable so tests can point it elsewhere.
var systemBundlePaths = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Alpine, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/ssl/cert.pem",                                 // Alpine, macOS-style layouts
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // RHEL 7+
}

// SystemBundle returns the host's PEM CA bundle and the path it was read
// from, trying well-known locations in order. It returns ("", nil, nil) when
// none exists, so callers can fall back to trusting only the sandbox CA.
func SystemBundle() (path string, pem []byte, err error) {
	for _, p := range systemBundlePaths {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			// A bundle that exists but cannot be read is reported rather
			// than skipped: silently falling through to another path could
			// hand the sandbox a different set of roots than the host uses.
			return p, nil, fmt.Errorf("ca: read system bundle: %w", err)
		}
		return p, b, nil
	}
	return "", nil, nil
}

// Bundle returns system followed by the CA certificate, with a newline
// between when system does not end in one (PEM parsers need the CA's BEGIN
// line to start a line of its own), as parts to write one after another:
// joined, the host's few hundred kilobytes of roots were copied on every
// start, into heap that made set-up's garbage collection come sooner.
func (c *CA) Bundle(system []byte) [][]byte {
	parts := [][]byte{system}
	if len(system) > 0 && system[len(system)-1] != '\n' {
		parts = append(parts, []byte{'\n'})
	}
	return append(parts, c.CertPEM())
}
