package ca

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	keystore "github.com/pavlo-v-chernykh/keystore-go/v4"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// HostCAVariables name files of extra roots a host may trust beyond its
// system bundle (a corporate TLS-inspecting proxy's CA, say). The tools
// inside the sandbox are pointed at corral's bundle instead, so what these
// files hold is carried into it; otherwise a tool that trusted the extra
// CA on the host would stop trusting it inside.
var HostCAVariables = []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"}

// HostTrust returns the roots the host trusts as one PEM bundle: the system
// bundle as it is, then each certificate of the files the HostCAVariables
// in getenv name that the bundle does not hold yet. A variable naming a
// file that cannot be read or holds no certificate adds nothing and yields
// a warning; an unreadable system bundle is an error, as with SystemBundle.
//
// The system bundle is compared block by block, not parsed: it runs on
// every proxy-mode start, and parsing a distribution's 150 roots costs
// milliseconds.
func HostTrust(getenv func(string) string) (bundle []byte, warnings []string, err error) {
	systemPath, system, err := SystemBundle()
	if err != nil {
		return nil, nil, err
	}
	// Hosts often point every one of these variables at the system bundle
	// itself; reading it again for each cost every proxy-mode start
	// milliseconds.
	systemInfo, _ := os.Stat(systemPath)
	var seen map[string]bool
	out := system
	for _, v := range HostCAVariables {
		path := getenv(v)
		if path == "" {
			continue
		}
		if fi, err := os.Stat(path); err == nil && systemInfo != nil && os.SameFile(fi, systemInfo) {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("%s=%s is not carried into the sandbox's CA bundle: %v", v, path, err))
			continue
		}
		if bytes.Equal(data, system) {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
			for _, der := range pemCertificates(system) {
				seen[string(der)] = true
			}
			out = bytes.Clone(system)
		}
		added := 0
		for _, der := range pemCertificates(data) {
			if _, err := x509.ParseCertificate(der); err != nil {
				continue
			}
			added++
			if seen[string(der)] {
				continue
			}
			seen[string(der)] = true
			if len(out) > 0 && out[len(out)-1] != '\n' {
				out = append(out, '\n')
			}
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
		}
		if added == 0 {
			warnings = append(warnings, fmt.Sprintf("%s=%s is not carried into the sandbox's CA bundle: it holds no PEM certificate", v, path))
		}
	}
	return out, warnings, nil
}

// pemCertificates returns the DER of every CERTIFICATE block in data.
func pemCertificates(data []byte) [][]byte {
	var ders [][]byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return ders
		}
		if b.Type == "CERTIFICATE" {
			ders = append(ders, b.Bytes)
		}
	}
}

// ErrNotKept wraps why TrustStore wrote the store but could not keep the
// store of the roots for the next start.
var ErrNotKept = errors.New("the Java trust store of the host's roots was not kept for the next sandbox")

// keptStores bounds the stores TrustStore keeps, one per set of roots (the
// host's bundle, or that and a bundle a variable names); the oldest go
// first.
const keptStores = 8

// JKS framing (keystore-go encodes the entries): a header of magic,
// version and entry count, the entries, and a SHA-1 over the password
// (each byte as a UTF-16 unit), the whitener and everything before it.
const (
	jksMagic   = 0xfeedfeed
	jksVersion = 2
	jksHeader  = 12
)

var jksWhitener = []byte("Mighty Aphrodite")

// TrustStore writes the certificates of roots and then of own, each a PEM
// bundle, to w as a JKS trust store that Java accepts as
// javax.net.ssl.trustStore: Java keeps its own roots and ignores PEM
// bundles and the variables other tools read. JKS rather than PKCS#12
// because it is cheap to make: each certificate as it is and one SHA-1 over
// the file, where PKCS#12 wraps each in ASN.1, encrypts them and MACs the
// whole. Each entry gets its own alias, since Java would merge entries
// whose aliases collide.
//
// This runs on every proxy-mode start, and decoding a distribution's PEM
// roots into a store cost milliseconds of its CPU and a few hundred
// kilobytes of fresh memory. So the store of roots alone is kept in dir,
// named for roots' SHA-256 (roots change with the host's CA package, not
// between sandboxes), and each call streams its entries from there, adding
// own's and the framing: the entries stay as keystore-go encoded them, and
// only the header and digest are written here, which the library cannot do
// for entries it has not decoded. A kept store whose digest does not check
// (cut short, or changed) is made again. Like everything corral trusts in
// its state directory, dir and the stores in it must be corral's own and
// writable by nobody else (statedir.Owned); a dir that is not is neither
// read nor written. An error wrapping ErrNotKept means w holds the store
// and only the next start pays again.
func TrustStore(w io.Writer, password, dir string, roots []byte, own ...[]byte) error {
	sum := sha256.Sum256(roots)
	path := filepath.Join(dir, hex.EncodeToString(sum[:])+".jks")
	// One buffer for checking the kept store and for copying it.
	buf := make([]byte, 32<<10)
	var kept *keptStore
	var n int
	err := ownDir(dir)
	if err == nil {
		kept, n, err = openKept(path, password, buf)
	}
	if err != nil {
		ks := keystore.New(keystore.WithOrderedAliases())
		if err := addCertificates(ks, roots); err != nil {
			return err
		}
		keepErr := err
		if !errors.Is(err, errNotOurs) {
			keepErr = keep(ks, password, dir, path)
		}
		if keepErr != nil {
			if err := addCertificates(ks, own...); err != nil {
				return err
			}
			if err := store(ks, w, password); err != nil {
				return err
			}
			return fmt.Errorf("%w: %w", ErrNotKept, keepErr)
		}
		if kept, n, err = openKept(path, password, buf); err != nil {
			return fmt.Errorf("ca: Java trust store kept just now: %w", err)
		}
	}
	defer kept.Close()
	// own's entries, numbered after the roots', framed by the library.
	extra := keystore.New(keystore.WithOrderedAliases())
	if err := addCertificatesFrom(extra, n, own...); err != nil {
		return err
	}
	var ownStore bytes.Buffer
	if err := store(extra, &ownStore, password); err != nil {
		return err
	}
	ownEntries := ownStore.Bytes()[jksHeader : ownStore.Len()-sha1.Size]

	h := jksDigest(password)
	out := io.MultiWriter(w, h)
	if _, err := out.Write(jksHead(n + len(extra.Aliases()))); err != nil {
		return err
	}
	if _, err := kept.Seek(jksHeader, io.SeekStart); err != nil {
		return err
	}
	if n, err := io.CopyBuffer(out, io.LimitReader(kept, kept.entries), buf); err != nil || n != kept.entries {
		return fmt.Errorf("ca: copy the kept Java trust store: %d of %d bytes: %w", n, kept.entries, err)
	}
	if _, err := out.Write(ownEntries); err != nil {
		return err
	}
	_, err = w.Write(h.Sum(nil))
	return err
}

// keptStore is an open kept store and the length of its entries.
type keptStore struct {
	*os.File
	entries int64
}

// openKept opens the store kept at path once its header and digest check
// out (read through buf), and says how many entries it holds.
func openKept(path, password string, buf []byte) (*keptStore, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) (*keptStore, int, error) {
		f.Close()
		return nil, 0, fmt.Errorf("ca: kept Java trust store %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if err := statedir.Owned(path, fi, 0o022); err != nil {
		return fail(err)
	}
	var head [jksHeader]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return fail(err)
	}
	entries := fi.Size() - jksHeader - sha1.Size
	if binary.BigEndian.Uint32(head[0:]) != jksMagic || binary.BigEndian.Uint32(head[4:]) != jksVersion || entries < 0 {
		return fail(errors.New("not a JKS store"))
	}
	h := jksDigest(password)
	h.Write(head[:])
	if n, err := io.CopyBuffer(h, io.LimitReader(f, entries), buf); err != nil || n != entries {
		return fail(fmt.Errorf("read %d of %d bytes of entries: %w", n, entries, err))
	}
	var digest [sha1.Size]byte
	if _, err := io.ReadFull(f, digest[:]); err != nil {
		return fail(err)
	}
	if !bytes.Equal(digest[:], h.Sum(nil)) {
		return fail(errors.New("its digest does not match"))
	}
	return &keptStore{File: f, entries: entries}, int(binary.BigEndian.Uint32(head[8:])), nil
}

// errNotOurs marks a directory of kept stores that is not corral's own.
var errNotOurs = errors.New("not corral's own")

// ownDir checks dir, if it exists, as statedir.OwnedDir does.
func ownDir(dir string) error {
	err := statedir.OwnedDir(dir, 0o022)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", errNotOurs, err)
	}
	return err
}

// jksDigest starts a store's digest.
func jksDigest(password string) hash.Hash {
	h := sha1.New()
	for i := range len(password) {
		h.Write([]byte{0, password[i]})
	}
	h.Write(jksWhitener)
	return h
}

// jksHead is the header of a store of n entries.
func jksHead(n int) []byte {
	b := binary.BigEndian.AppendUint32(nil, jksMagic)
	b = binary.BigEndian.AppendUint32(b, jksVersion)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// addCertificates adds the certificates of bundle to ks, aliased by their
// number in ks.
func addCertificates(ks keystore.KeyStore, bundle ...[]byte) error {
	return addCertificatesFrom(ks, len(ks.Aliases()), bundle...)
}

// addCertificatesFrom adds the certificates of bundle to ks, aliased by
// their number counted from n.
func addCertificatesFrom(ks keystore.KeyStore, n int, bundle ...[]byte) error {
	for _, part := range bundle {
		for _, der := range pemCertificates(part) {
			err := ks.SetTrustedCertificateEntry("corral-"+strconv.Itoa(n), keystore.TrustedCertificateEntry{
				CreationTime: storeTime,
				Certificate:  keystore.Certificate{Type: "X.509", Content: der},
			})
			if err != nil {
				return fmt.Errorf("ca: Java trust store: %w", err)
			}
			n++
		}
	}
	return nil
}

func store(ks keystore.KeyStore, w io.Writer, password string) error {
	if err := ks.Store(w, []byte(password)); err != nil {
		return fmt.Errorf("ca: encode Java trust store: %w", err)
	}
	return nil
}

// keep writes ks to path whole or not at all (another sandbox may be
// reading it), then removes the oldest stores beyond keptStores.
func keep(ks keystore.KeyStore, password, dir, path string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".new-*")
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 32<<10)
	err = store(ks, bw, password)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type kept struct {
		name string
		at   time.Time
	}
	var stores []kept
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".jks") {
			stores = append(stores, kept{e.Name(), info.ModTime()})
		}
	}
	slices.SortFunc(stores, func(a, b kept) int { return b.at.Compare(a.at) })
	for _, old := range stores[min(len(stores), keptStores):] {
		if filepath.Join(dir, old.name) != path {
			os.Remove(filepath.Join(dir, old.name))
		}
	}
	return nil
}

// storeTime dates every entry, so one bundle always gives the same store.
var storeTime = time.Unix(0, 0)
