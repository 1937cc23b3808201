package ca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newCA(t testing.TB, cacheSize int) *CA {
	t.Helper()
	c, err := New("sb-1234", 0, cacheSize)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func caPool(t testing.TB, c *CA) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.CertPEM()) {
		t.Fatal("CertPEM did not parse into a pool")
	}
	return pool
}

func TestCACertificate(t *testing.T) {
	before := time.Now()
	c := newCA(t, 0)
	ca := c.Certificate()
	if !strings.Contains(ca.Subject.CommonName, "sb-1234") {
		t.Errorf("CA CN %q does not name the sandbox", ca.Subject.CommonName)
	}
	if len(ca.Subject.Organization) != 1 || ca.Subject.Organization[0] != "corral" {
		t.Errorf("CA O = %q, want [corral]", ca.Subject.Organization)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero {
		t.Errorf("CA constraints: IsCA=%v valid=%v MaxPathLen=%d zero=%v",
			ca.IsCA, ca.BasicConstraintsValid, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if ca.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("CA KeyUsage = %v", ca.KeyUsage)
	}
	if len(ca.SubjectKeyId) == 0 {
		t.Error("CA has no SubjectKeyId")
	}
	if ca.SerialNumber.Sign() <= 0 || ca.SerialNumber.BitLen() > 128 {
		t.Errorf("CA serial %v not a positive 128-bit number", ca.SerialNumber)
	}
	if got := before.Sub(ca.NotBefore); got < 59*time.Minute || got > 61*time.Minute {
		t.Errorf("CA NotBefore is %v before now, want ~1h", got)
	}
	if got := ca.NotAfter.Sub(before); got < 30*24*time.Hour-time.Minute || got > 30*24*time.Hour+time.Minute {
		t.Errorf("default CA validity %v, want ~30 days", got)
	}
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Errorf("CA is not self-signed: %v", err)
	}
	pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("CA key is %T, want ECDSA P-256", ca.PublicKey)
	}

	c2, err := New("sb-1234", 2*time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := c2.Certificate().NotAfter.Sub(before); got < 2*time.Hour-time.Minute || got > 2*time.Hour+time.Minute {
		t.Errorf("CA validity %v, want ~2h", got)
	}
	if c2.Certificate().SerialNumber.Cmp(ca.SerialNumber) == 0 {
		t.Error("two CAs share a serial")
	}
	if _, err := New("sb", -time.Hour, 0); err == nil {
		t.Error("New accepted a negative validity")
	}
}

func TestCertPEMIsACopy(t *testing.T) {
	c := newCA(t, 0)
	p := c.CertPEM()
	p[0] = 'X'
	if !bytes.HasPrefix(c.CertPEM(), []byte("-----BEGIN CERTIFICATE-----")) {
		t.Fatal("editing CertPEM's result changed the CA's PEM")
	}
}

func TestLeafVerifies(t *testing.T) {
	c := newCA(t, 0)
	pool := caPool(t, c)
	for _, tc := range []struct {
		host string
		opts x509.VerifyOptions
		cn   string
	}{
		{host: "api.example.com", opts: x509.VerifyOptions{DNSName: "api.example.com"}, cn: "api.example.com"},
		{host: "API.Example.COM.", opts: x509.VerifyOptions{DNSName: "api.example.com"}, cn: "api.example.com"},
		{host: "*.example.com", opts: x509.VerifyOptions{DNSName: "x.example.com"}, cn: "*.example.com"},
		{host: "10.1.2.3", opts: x509.VerifyOptions{DNSName: "10.1.2.3"}, cn: "10.1.2.3"},
		{host: "2001:db8::1", opts: x509.VerifyOptions{DNSName: "2001:db8::1"}, cn: "2001:db8::1"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			cert, err := c.Leaf(tc.host)
			if err != nil {
				t.Fatalf("Leaf: %v", err)
			}
			if len(cert.Certificate) != 2 {
				t.Fatalf("chain length %d, want 2", len(cert.Certificate))
			}
			if !bytes.Equal(cert.Certificate[1], c.Certificate().Raw) {
				t.Error("second certificate in the chain is not the CA")
			}
			leaf := cert.Leaf
			if leaf == nil {
				t.Fatal("tls.Certificate.Leaf not set")
			}
			if !bytes.Equal(leaf.Raw, cert.Certificate[0]) {
				t.Error("Leaf does not match Certificate[0]")
			}
			if leaf.Subject.CommonName != tc.cn {
				t.Errorf("CN %q, want %q", leaf.Subject.CommonName, tc.cn)
			}
			pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
			if !ok || pub.Curve != elliptic.P256() {
				t.Errorf("leaf key is %T, want ECDSA P-256", leaf.PublicKey)
			}
			priv, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
			if !ok || !priv.PublicKey.Equal(leaf.PublicKey) {
				t.Error("PrivateKey does not match the leaf's public key")
			}
			if leaf.IsCA {
				t.Error("leaf is a CA")
			}
			if leaf.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("leaf KeyUsage = %v", leaf.KeyUsage)
			}
			if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
				t.Errorf("leaf ExtKeyUsage = %v", leaf.ExtKeyUsage)
			}
			if !bytes.Equal(leaf.AuthorityKeyId, c.Certificate().SubjectKeyId) {
				t.Error("leaf AuthorityKeyId does not match the CA's SubjectKeyId")
			}
			if !leaf.NotAfter.Equal(c.Certificate().NotAfter) {
				t.Errorf("leaf NotAfter %v, want the CA's %v", leaf.NotAfter, c.Certificate().NotAfter)
			}
			if d := time.Since(leaf.NotBefore); d < 59*time.Minute || d > 61*time.Minute {
				t.Errorf("leaf NotBefore is %v ago, want ~1h", d)
			}
			if ip := net.ParseIP(tc.host); ip != nil {
				if len(leaf.DNSNames) != 0 || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(ip) {
					t.Errorf("IP leaf SANs: DNS %q IP %v", leaf.DNSNames, leaf.IPAddresses)
				}
			} else if len(leaf.IPAddresses) != 0 || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != tc.cn {
				t.Errorf("DNS leaf SANs: DNS %q IP %v", leaf.DNSNames, leaf.IPAddresses)
			}

			opts := tc.opts
			opts.Roots = pool
			chains, err := leaf.Verify(opts)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if len(chains) != 1 || len(chains[0]) != 2 {
				t.Errorf("verified chains %d (first of length %d), want one of length 2", len(chains), len(chains[0]))
			}
		})
	}
}

func TestLeafNotTrustedByOtherCA(t *testing.T) {
	c := newCA(t, 0)
	other := newCA(t, 0)
	cert, err := c.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cert.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: caPool(t, other)})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("leaf verified against another sandbox's CA: err = %v", err)
	}
}

// handshake runs a TLS handshake over an in-memory pipe between a server
// whose certificate comes from serve and a client that trusts only c.
func handshake(t *testing.T, c *CA, serverName string, serve func(*tls.ClientHelloInfo) (*tls.Certificate, error)) (clientErr, serverErr error) {
	t.Helper()
	cConn, sConn := net.Pipe()
	defer cConn.Close()
	defer sConn.Close()
	deadline := time.Now().Add(10 * time.Second)
	cConn.SetDeadline(deadline)
	sConn.SetDeadline(deadline)

	srv := tls.Server(sConn, &tls.Config{GetCertificate: serve})
	cli := tls.Client(cConn, &tls.Config{ServerName: serverName, RootCAs: caPool(t, c)})

	done := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err != nil {
			// Unblock a client still waiting on the server's flight.
			sConn.Close()
		}
		done <- err
	}()
	clientErr = cli.Handshake()
	if clientErr != nil {
		cConn.Close()
	}
	return clientErr, <-done
}

func TestTLSHandshake(t *testing.T) {
	c := newCA(t, 0)
	var asked []string
	clientErr, serverErr := handshake(t, c, "api.example.com", func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		asked = append(asked, hello.ServerName)
		return c.Leaf(hello.ServerName)
	})
	if clientErr != nil || serverErr != nil {
		t.Fatalf("handshake: client %v, server %v", clientErr, serverErr)
	}
	if len(asked) != 1 || asked[0] != "api.example.com" {
		t.Errorf("server was asked for %q", asked)
	}
}

func TestTLSHandshakeWrongName(t *testing.T) {
	c := newCA(t, 0)
	clientErr, _ := handshake(t, c, "other.example", func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return c.Leaf("api.example.com")
	})
	if clientErr == nil {
		t.Fatal("client accepted a leaf minted for another name")
	}
	var verr *tls.CertificateVerificationError
	var herr x509.HostnameError
	if !errors.As(clientErr, &verr) || !errors.As(clientErr, &herr) {
		t.Fatalf("client error %v (%T), want a hostname verification error", clientErr, clientErr)
	}
}

func TestLeafCached(t *testing.T) {
	c := newCA(t, 0)
	a1, err := c.Leaf("a.example")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.Leaf("A.EXAMPLE.")
	if err != nil {
		t.Fatal(err)
	}
	if a1 != a2 {
		t.Error("second Leaf for the same host minted a new certificate")
	}
	ip1, _ := c.Leaf("::ffff:10.0.0.1")
	ip2, _ := c.Leaf("10.0.0.1")
	if ip1 == nil || ip1 != ip2 {
		t.Error("spellings of one IP address got different leaves")
	}
	if got := c.Len(); got != 2 {
		t.Errorf("Len = %d, want 2", got)
	}
}

func TestLeafLRU(t *testing.T) {
	c := newCA(t, 2)
	leaf := func(h string) *tls.Certificate {
		t.Helper()
		cert, err := c.Leaf(h)
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}
	a := leaf("a.example")
	b := leaf("b.example")
	if leaf("a.example") != a {
		t.Fatal("a was not cached")
	}
	leaf("c.example")
	if got := c.Len(); got != 2 {
		t.Errorf("Len = %d after 3 hosts with cacheSize 2", got)
	}
	if leaf("a.example") != a {
		t.Error("recently used a was evicted")
	}
	if leaf("b.example") == b {
		t.Error("least recently used b was not evicted")
	}
	for i := range 20 {
		leaf(string(rune('a'+i)) + ".many.example")
		if got := c.Len(); got > 2 {
			t.Fatalf("Len = %d, exceeds cacheSize 2", got)
		}
	}
}

func TestLeafDefaultCacheSize(t *testing.T) {
	c := newCA(t, -5)
	if c.capacity != DefaultCacheSize {
		t.Errorf("capacity %d, want DefaultCacheSize", c.capacity)
	}
}

func TestLeafRemintedNearExpiry(t *testing.T) {
	// A CA that lives less than an hour makes every leaf "near expiry".
	c, err := New("sb", 30*time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mints atomic.Int32
	c.mintHook = func(string) { mints.Add(1) }
	a1, err := c.Leaf("a.example")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.Leaf("a.example")
	if err != nil {
		t.Fatal(err)
	}
	if a1 == a2 || mints.Load() != 2 {
		t.Errorf("leaf within an hour of expiry was served from cache (mints %d)", mints.Load())
	}
	if got := c.Len(); got != 1 {
		t.Errorf("Len = %d after re-mint, want 1", got)
	}
}

func TestLeafConcurrentMintOnce(t *testing.T) {
	c := newCA(t, 0)
	var mints atomic.Int32
	c.mintHook = func(string) {
		mints.Add(1)
		// Keep the mint open long enough that the other callers arrive
		// while it is in flight rather than after it is cached.
		time.Sleep(50 * time.Millisecond)
	}
	const n = 50
	certs := make([]*tls.Certificate, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			certs[i], errs[i] = c.Leaf("new.example.com")
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if certs[i] != certs[0] {
			t.Fatalf("caller %d got a different certificate", i)
		}
	}
	if got := mints.Load(); got != 1 {
		t.Errorf("minted %d times, want 1", got)
	}
	if got := c.Len(); got != 1 {
		t.Errorf("Len = %d, want 1", got)
	}
}

func TestLeafMintsDifferentHostsConcurrently(t *testing.T) {
	c := newCA(t, 0)
	bStarted := make(chan struct{})
	c.mintHook = func(host string) {
		switch host {
		case "b.example":
			close(bStarted)
		case "a.example":
			// If minting a held a lock that b needs, b could not start.
			select {
			case <-bStarted:
			case <-time.After(5 * time.Second):
				t.Error("mint for b.example blocked behind the mint for a.example")
			}
		}
	}
	aDone := make(chan error, 1)
	go func() {
		_, err := c.Leaf("a.example")
		aDone <- err
	}()
	// Give a a head start so that it is mid-mint when b arrives.
	time.Sleep(20 * time.Millisecond)
	if _, err := c.Leaf("b.example"); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
}

func TestLeafErrorNotCached(t *testing.T) {
	c, err := New("sb", time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Pretend the CA has expired so every mint fails.
	c.cert.NotAfter = time.Now().Add(-2 * time.Hour)
	if _, err := c.Leaf("a.example"); err == nil {
		t.Fatal("Leaf minted under an expired CA")
	}
	if got := c.Len(); got != 0 {
		t.Errorf("Len = %d after a failed mint, want 0", got)
	}
	if _, err := c.Leaf("a.example"); err == nil {
		t.Fatal("failed mint was cached as a success")
	}
}

func TestLeafRejectsBadHosts(t *testing.T) {
	c := newCA(t, 0)
	for _, h := range []string{
		"",
		".",
		"exa mple.com",
		"example.com/path",
		"user@example.com",
		"example.com:443",
		"ex\x00ample.com",
		"bücher.example",
		"[::1]",
		"a..example",
		".example",
		strings.Repeat("a", 64) + ".example",
		strings.Repeat("abcdefghi.", 25) + "abcd", // 254 bytes
	} {
		if cert, err := c.Leaf(h); err == nil {
			t.Errorf("Leaf(%q) = %v, want an error", h, cert.Leaf.DNSNames)
		}
	}
	if got := c.Len(); got != 0 {
		t.Errorf("Len = %d after only bad hosts", got)
	}
	for _, h := range []string{
		"a-b_c.example",
		strings.Repeat("abcdefghi.", 25) + "abc", // 253 bytes
		strings.Repeat("abcdefghi.", 25) + "abc.",
	} {
		if _, err := c.Leaf(h); err != nil {
			t.Errorf("Leaf(%q): %v", h, err)
		}
	}
}

func TestBundle(t *testing.T) {
	c := newCA(t, 0)
	system := newCA(t, 0) // stands in for a public root
	sysPEM := system.CertPEM()
	if !bytes.HasSuffix(sysPEM, []byte("\n")) {
		t.Fatal("test assumes PEM ends in a newline")
	}
	for name, sys := range map[string][]byte{
		"trailing newline":    sysPEM,
		"no trailing newline": bytes.TrimRight(sysPEM, "\n"),
	} {
		t.Run(name, func(t *testing.T) {
			in := bytes.Clone(sys)
			b := bytes.Join(c.Bundle(in), nil)
			if !bytes.Equal(in, sys) {
				t.Error("Bundle modified its argument")
			}
			if !bytes.HasPrefix(b, sys) || !bytes.HasSuffix(b, c.CertPEM()) {
				t.Error("bundle is not system followed by the CA")
			}
			if bytes.Contains(b, []byte("\n\n")) {
				t.Error("bundle has a blank line between system and the CA")
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				t.Fatal("bundle did not parse")
			}
			for _, ca := range []*CA{c, system} {
				leaf, err := ca.Leaf("api.example.com")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
					t.Errorf("bundle pool does not trust %s: %v", ca.Certificate().Subject, err)
				}
			}
		})
	}
	if !bytes.Equal(bytes.Join(c.Bundle(nil), nil), c.CertPEM()) {
		t.Error("Bundle(nil) is not the CA PEM alone")
	}
}

func TestSystemBundle(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	second := filepath.Join(dir, "second.pem")
	third := filepath.Join(dir, "third.pem")
	if err := os.WriteFile(second, []byte("second"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(third, []byte("third"), 0o644); err != nil {
		t.Fatal(err)
	}
	saved := systemBundlePaths
	t.Cleanup(func() { systemBundlePaths = saved })

	systemBundlePaths = []string{missing, second, third}
	path, pem, err := SystemBundle()
	if err != nil || path != second || string(pem) != "second" {
		t.Errorf("SystemBundle() = %q, %q, %v; want the first existing path", path, pem, err)
	}

	systemBundlePaths = []string{missing}
	path, pem, err = SystemBundle()
	if err != nil || path != "" || pem != nil {
		t.Errorf("SystemBundle() with none present = %q, %q, %v; want empty", path, pem, err)
	}

	// A directory where the bundle should be is an error, not a miss.
	systemBundlePaths = []string{dir, second}
	if _, _, err := SystemBundle(); err == nil {
		t.Error("SystemBundle skipped an unreadable bundle")
	}
}

func TestSystemBundleDefaultPaths(t *testing.T) {
	want := []string{
		"/etc/ssl/certs/ca-certificates.crt",
		"/etc/pki/tls/certs/ca-bundle.crt",
		"/etc/ssl/ca-bundle.pem",
		"/etc/ssl/cert.pem",
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	}
	if len(systemBundlePaths) != len(want) {
		t.Fatalf("systemBundlePaths = %q", systemBundlePaths)
	}
	for i := range want {
		if systemBundlePaths[i] != want[i] {
			t.Errorf("systemBundlePaths[%d] = %q, want %q", i, systemBundlePaths[i], want[i])
		}
	}
}
