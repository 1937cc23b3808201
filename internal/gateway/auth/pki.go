package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// PKI is the gateway's CA and server certificate, kept in DIR/tls.
type PKI struct {
	Dir    string
	CA     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	Server tls.Certificate
}

// CAFile is the PEM file clients and supervisors trust the gateway by.
func (p *PKI) CAFile() string { return filepath.Join(p.Dir, "ca.pem") }

const (
	caValidity     = 10 * 365 * 24 * time.Hour
	leafValidity   = 2 * 365 * 24 * time.Hour
	fileCA         = "ca.pem"
	fileCAKey      = "ca-key.pem"
	fileServer     = "server.pem"
	fileServerKey  = "server-key.pem"
	privateKeyMode = 0o600
)

// EnsurePKI loads the CA and server certificate from dir, making them on
// first start. The server certificate names localhost, 127.0.0.1, ::1,
// this host's name and every san; it is re-issued (by the same CA) when a
// name is missing, so adding --san needs no manual step.
func EnsurePKI(dir string, sans []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("tls dir: %w", err)
	}
	p := &PKI{Dir: dir}
	if err := p.loadOrMakeCA(); err != nil {
		return nil, err
	}
	names := serverNames(sans)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, fileServer), filepath.Join(dir, fileServerKey))
	if err == nil && covers(cert.Leaf, names) && cert.Leaf.CheckSignatureFrom(p.CA) == nil && time.Now().Before(cert.Leaf.NotAfter) {
		p.Server = cert
		return p, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	host, _ := os.Hostname()
	if _, err := p.issue(filepath.Join(dir, fileServer), filepath.Join(dir, fileServerKey), host, names, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if p.Server, err = tls.LoadX509KeyPair(filepath.Join(dir, fileServer), filepath.Join(dir, fileServerKey)); err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	return p, nil
}

func serverNames(sans []string) []string {
	names := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		names = append(names, h)
	}
	for _, s := range sans {
		if s != "" && !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	return names
}

func covers(c *x509.Certificate, names []string) bool {
	for _, n := range names {
		if c.VerifyHostname(n) != nil {
			return false
		}
	}
	return true
}

func (p *PKI) loadOrMakeCA() error {
	certPath, keyPath := filepath.Join(p.Dir, fileCA), filepath.Join(p.Dir, fileCAKey)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err == nil {
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return fmt.Errorf("CA key %s: not an ECDSA key", keyPath)
		}
		p.CA, p.caKey = pair.Leaf, key
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "corral gateway CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("CA certificate: %w", err)
	}
	// The key goes first: a CA certificate without its key on disk would
	// be loaded next time and fail.
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	p.CA, err = x509.ParseCertificate(der)
	p.caKey = key
	return err
}

// issue makes a leaf certificate signed by the CA for cn and names.
func (p *PKI) issue(certPath, keyPath, cn string, names []string, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key for %s: %w", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// One usage per certificate: a client certificate cannot serve
		// as the gateway, nor the server's as a user.
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", cn, err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, err
	}
	return cert, writePEM(certPath, "CERTIFICATE", der, 0o644)
}

// clientName is what a client certificate's user may be called. The name
// is also the certificate's and key's file name in the output directory,
// so it can hold no path separator and cannot start with a dot.
var clientName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// IssueClient writes a client certificate for user name, its key and the
// CA certificate into outDir, and returns the certificate's path and the
// certificate. It authenticates only once recorded in the store
// (IssueClientCert does both).
func (p *PKI) IssueClient(name, outDir string) (string, *x509.Certificate, error) {
	if name == "" {
		return "", nil, errors.New("a client certificate needs --name")
	}
	if !clientName.MatchString(name) || strings.Contains(name, "..") {
		return "", nil, fmt.Errorf("--name %q: use letters, digits, '.', '_', '@' and '-' (at most 64, starting with a letter or digit, no \"..\"): it names the user and the files written into --out", name)
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return "", nil, fmt.Errorf("output dir: %w", err)
	}
	certPath := filepath.Join(outDir, name+".pem")
	cert, err := p.issue(certPath, filepath.Join(outDir, name+"-key.pem"), name, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", nil, err
	}
	if err := writePEM(filepath.Join(outDir, fileCA), "CERTIFICATE", p.CA.Raw, 0o644); err != nil {
		return "", nil, err
	}
	return certPath, cert, nil
}

// ServerConfig is the TLS configuration of the gateway's listener: HTTP/2,
// and a client certificate is checked against the CA when one is given
// (bearer tokens are the other way in).
func (p *PKI) ServerConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(p.CA)
	return &tls.Config{
		Certificates: []tls.Certificate{p.Server},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	}
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, privateKeyMode)
}

// writePEM replaces path atomically, so a crash never leaves half a key.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// SerialOf is how the store names a certificate: its serial number in
// lower-case hex.
func SerialOf(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
