package ca

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	keystore "github.com/pavlo-v-chernykh/keystore-go/v4"
)

// pemOf returns the certificate of a fresh CA named id, in PEM.
func pemOf(t *testing.T, id string) []byte {
	t.Helper()
	c, err := New(id, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c.CertPEM()
}

func TestHostTrust(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sysA, corp, other := pemOf(t, "system-a"), pemOf(t, "corp"), pemOf(t, "other")
	system := write("system.pem", sysA)
	saved := systemBundlePaths
	systemBundlePaths = []string{system}
	t.Cleanup(func() { systemBundlePaths = saved })

	env := map[string]string{
		"NODE_EXTRA_CA_CERTS": write("corp.pem", corp),
		// Already in the system bundle, and twice the corp CA: each root
		// is carried once.
		"SSL_CERT_FILE":      write("mixed.pem", append(append(bytes.Clone(sysA), corp...), other...)),
		"REQUESTS_CA_BUNDLE": system,
		"CURL_CA_BUNDLE":     filepath.Join(dir, "missing.pem"),
		"GIT_SSL_CAINFO":     write("junk.pem", []byte("not a certificate\n")),
	}
	bundle, warnings, err := HostTrust(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(bundle, sysA) {
		t.Errorf("bundle does not start with the system bundle as it is")
	}
	if got := len(pemCertificates(bundle)); got != 3 {
		t.Errorf("bundle holds %d certificates, want 3 (system, corp, other once each)", got)
	}
	for _, want := range [][]byte{corp, other} {
		if !bytes.Contains(bundle, want) {
			t.Errorf("bundle lacks %s", want[:40])
		}
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "CURL_CA_BUNDLE") || !strings.Contains(warnings[1], "GIT_SSL_CAINFO") {
		t.Errorf("warnings = %q, want one for the missing file and one for the file without certificates", warnings)
	}

	// Nothing beyond the system bundle: it is returned untouched.
	plain, warnings, err := HostTrust(func(k string) string {
		if k == "SSL_CERT_FILE" {
			return system
		}
		return ""
	})
	if err != nil || len(warnings) != 0 || !bytes.Equal(plain, sysA) {
		t.Errorf("HostTrust with only the system bundle = %q, %q, %v", plain, warnings, err)
	}
}

func TestTrustStore(t *testing.T) {
	one, two := pemOf(t, "one"), pemOf(t, "two")
	var store, again bytes.Buffer
	if err := TrustStore(&store, "changeit", one, two); err != nil {
		t.Fatal(err)
	}
	// One bundle, however it is cut into parts, gives one store.
	if err := TrustStore(&again, "changeit", append(bytes.Clone(one), two...)); err != nil || !bytes.Equal(again.Bytes(), store.Bytes()) {
		t.Errorf("one bundle gave two stores (err %v)", err)
	}
	ks := keystore.New()
	if err := ks.Load(bytes.NewReader(store.Bytes()), []byte("changeit")); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, alias := range ks.Aliases() {
		e, err := ks.GetTrustedCertificateEntry(alias)
		if err != nil {
			t.Fatalf("%s: %v", alias, err)
		}
		c, err := x509.ParseCertificate(e.Certificate.Content)
		if err != nil || e.Certificate.Type != "X.509" {
			t.Fatalf("%s: %s certificate: %v", alias, e.Certificate.Type, err)
		}
		names = append(names, alias+" "+c.Subject.CommonName)
	}
	slices.Sort(names)
	if want := []string{"corral-0 corral sandbox one", "corral-1 corral sandbox two"}; !slices.Equal(names, want) {
		t.Errorf("trust store holds %q, want %q", names, want)
	}
	// Java checks the store's digest with the password it is given.
	if err := keystore.New().Load(bytes.NewReader(store.Bytes()), []byte("another")); err == nil {
		t.Error("the store loads with the wrong password: it carries no digest")
	}
}
