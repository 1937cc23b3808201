package ca

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	keystore "github.com/pavlo-v-chernykh/keystore-go/v4"
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

// TrustStore writes the certificates of bundle, the parts of one PEM
// bundle in order, to w as a JKS trust store that Java
// accepts as javax.net.ssl.trustStore: Java keeps its own roots and
// ignores PEM bundles and the variables other tools read. JKS rather than
// PKCS#12 because it is cheap to make: each certificate as it is and one
// SHA-1 over the file, where PKCS#12 wraps each in ASN.1, encrypts them and
// MACs the whole. This runs on every proxy-mode start, where PKCS#12 was
// the largest part of the supervisor's CPU time. Each entry gets its own
// alias, since Java would merge entries whose aliases collide.
func TrustStore(w io.Writer, password string, bundle ...[]byte) error {
	ks := keystore.New(keystore.WithOrderedAliases())
	n := 0
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
	if err := ks.Store(w, []byte(password)); err != nil {
		return fmt.Errorf("ca: encode Java trust store: %w", err)
	}
	return nil
}

// storeTime dates every entry, so one bundle always gives the same store.
var storeTime = time.Unix(0, 0)
