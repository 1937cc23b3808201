package ca

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	keystore "github.com/pavlo-v-chernykh/keystore-go/v4"
)

// pemOf returns the certificate of a fresh CA named id, in PEM.
func pemOf(t testing.TB, id string) []byte {
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

// storeNames lists each entry of a JKS store as "alias subject-CN".
func storeNames(t *testing.T, store []byte) []string {
	t.Helper()
	ks := keystore.New()
	if err := ks.Load(bytes.NewReader(store), []byte("changeit")); err != nil {
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
	return names
}

func TestTrustStore(t *testing.T) {
	one, two, own := pemOf(t, "one"), pemOf(t, "two"), pemOf(t, "own")
	roots := append(bytes.Clone(one), two...)
	dir := filepath.Join(t.TempDir(), "kept")
	var first bytes.Buffer
	if err := TrustStore(&first, "changeit", dir, roots, own); err != nil {
		t.Fatal(err)
	}
	want := []string{"corral-0 corral sandbox one", "corral-1 corral sandbox two", "corral-2 corral sandbox own"}
	if got := storeNames(t, first.Bytes()); !slices.Equal(got, want) {
		t.Errorf("trust store holds %q, want %q", got, want)
	}
	// Byte for byte what keystore-go writes for the same certificates.
	lib := keystore.New(keystore.WithOrderedAliases())
	var libStore bytes.Buffer
	if err := addCertificates(lib, roots, own); err != nil {
		t.Fatal(err)
	}
	if err := store(lib, &libStore, "changeit"); err != nil || !bytes.Equal(libStore.Bytes(), first.Bytes()) {
		t.Errorf("the store differs from keystore-go's (err %v)", err)
	}
	// Java checks the store's digest with the password it is given.
	if err := keystore.New().Load(bytes.NewReader(first.Bytes()), []byte("another")); err == nil {
		t.Error("the store loads with the wrong password: it carries no digest")
	}

	// The roots' store was kept, and the next store starts from it: one
	// standing in for it shows in what is written.
	sum := sha256.Sum256(roots)
	kept := filepath.Join(dir, hex.EncodeToString(sum[:])+".jks")
	var stand bytes.Buffer
	if err := TrustStore(&stand, "changeit", t.TempDir(), pemOf(t, "stand-in")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, stand.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := TrustStore(&again, "changeit", dir, roots, own); err != nil {
		t.Fatal(err)
	}
	if got, want := storeNames(t, again.Bytes()), []string{"corral-0 corral sandbox stand-in", "corral-1 corral sandbox own"}; !slices.Equal(got, want) {
		t.Errorf("from the kept store: %q, want %q", got, want)
	}

	// A kept store cut short is made again, and kept again whole.
	if err := os.WriteFile(kept, stand.Bytes()[:stand.Len()/2], 0o600); err != nil {
		t.Fatal(err)
	}
	again.Reset()
	if err := TrustStore(&again, "changeit", dir, roots, own); err != nil || !bytes.Equal(again.Bytes(), first.Bytes()) {
		t.Errorf("with the kept store cut short: err %v, same store %v", err, bytes.Equal(again.Bytes(), first.Bytes()))
	}
	again.Reset()
	if err := TrustStore(&again, "changeit", dir, roots, own); err != nil || !bytes.Equal(again.Bytes(), first.Bytes()) {
		t.Errorf("after the store was made again: err %v, same store %v", err, bytes.Equal(again.Bytes(), first.Bytes()))
	}

	// So is one changed within.
	changed := bytes.Clone(stand.Bytes())
	changed[len(changed)/2] ^= 0xff
	if err := os.WriteFile(kept, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	again.Reset()
	if err := TrustStore(&again, "changeit", dir, roots, own); err != nil || !bytes.Equal(again.Bytes(), first.Bytes()) {
		t.Errorf("with the kept store changed: err %v, same store %v", err, bytes.Equal(again.Bytes(), first.Bytes()))
	}

	// Where nothing can be kept, the store is still written.
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	again.Reset()
	if err := TrustStore(&again, "changeit", blocked, roots, own); !errors.Is(err, ErrNotKept) || !bytes.Equal(again.Bytes(), first.Bytes()) {
		t.Errorf("where nothing can be kept: err %v (want ErrNotKept), same store %v", err, bytes.Equal(again.Bytes(), first.Bytes()))
	}
}

// A store from a kept one of many roots loads in Java's way (keystore-go
// checks the digest) with every certificate, own's last.
func TestTrustStoreOfManyRoots(t *testing.T) {
	var roots []byte
	for i := range 12 {
		roots = append(roots, pemOf(t, "root-"+strconv.Itoa(i))...)
	}
	own := pemOf(t, "own")
	dir := t.TempDir()
	for range 2 { // made, then from the kept store
		var out bytes.Buffer
		if err := TrustStore(&out, "changeit", dir, roots, own); err != nil {
			t.Fatal(err)
		}
		names := storeNames(t, out.Bytes())
		if len(names) != 13 || !slices.Contains(names, "corral-12 corral sandbox own") || !slices.Contains(names, "corral-11 corral sandbox root-11") {
			t.Fatalf("store holds %q", names)
		}
	}
}

// Each set of roots has a store of its own, up to keptStores of them, the
// newest kept.
func TestTrustStoreKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	var last []byte
	for i := range keptStores + 3 {
		last = pemOf(t, "roots-"+strconv.Itoa(i))
		if err := TrustStore(io.Discard, "changeit", dir, last); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(last)
	newest := hex.EncodeToString(sum[:]) + ".jks"
	found := false
	for _, e := range entries {
		found = found || e.Name() == newest
	}
	if len(entries) != keptStores || !found {
		t.Errorf("%d stores kept (want %d), the newest among them: %v", len(entries), keptStores, found)
	}
}

// A kept store is trusted as corral trusts the rest of its state: one
// others could write is not used (and is made again), and in a directory
// others could write nothing is read or kept.
func TestTrustStoreTrustsOnlyItsOwn(t *testing.T) {
	roots, own := pemOf(t, "root"), pemOf(t, "own")
	var want bytes.Buffer
	if err := TrustStore(&want, "changeit", t.TempDir(), roots, own); err != nil {
		t.Fatal(err)
	}
	var stand bytes.Buffer
	if err := TrustStore(&stand, "changeit", t.TempDir(), pemOf(t, "stand-in")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(roots)
	name := hex.EncodeToString(sum[:]) + ".jks"

	dir := filepath.Join(t.TempDir(), "kept")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), stand.Bytes(), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, name), 0o666); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := TrustStore(&got, "changeit", dir, roots, own); err != nil || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Errorf("a kept store others can write was used (err %v)", err)
	}

	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(open, name), stand.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if err := TrustStore(&got, "changeit", open, pemOf(t, "other"), own); !errors.Is(err, ErrNotKept) {
		t.Errorf("in a directory others can write: err %v, want ErrNotKept", err)
	}
	got.Reset()
	if err := TrustStore(&got, "changeit", open, roots, own); !errors.Is(err, ErrNotKept) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Errorf("a store in a directory others can write was used (err %v)", err)
	}
	if entries, _ := os.ReadDir(open); len(entries) != 1 {
		t.Errorf("corral wrote into a directory others can write: %d entries", len(entries))
	}

	// A symlink in the directory's place, even to a directory that would
	// pass, is not it: whoever placed the link chose what it reaches.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o700); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if err := TrustStore(&got, "changeit", link, roots, own); !errors.Is(err, ErrNotKept) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Errorf("a store reached through a symlinked directory was used (err %v)", err)
	}

	// As root: a store another uid owns, however its mode, is not used.
	if os.Geteuid() == 0 {
		theirs := filepath.Join(t.TempDir(), "theirs")
		if err := os.Mkdir(theirs, 0o700); err != nil {
			t.Fatal(err)
		}
		store := filepath.Join(theirs, name)
		if err := os.WriteFile(store, stand.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(store, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		got.Reset()
		if err := TrustStore(&got, "changeit", theirs, roots, own); err != nil || !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("a kept store another uid owns was used (err %v)", err)
		}
	}
}
