package sniff

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
)

func FuzzClientHelloSNI(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*.bin"))
	for _, path := range seeds {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(captureClientHello(f, &tls.Config{ServerName: "fuzz.example", MaxVersion: tls.VersionTLS12}))
	f.Add(hello(sniExt("a.example", "b.example")))
	f.Add(hello())
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		sni, complete, err := ClientHelloSNI(b)
		if err != nil && complete {
			t.Fatal("complete with an error")
		}
		if !complete {
			return
		}
		if sni != "" && !validName(sni) {
			t.Fatalf("returned invalid name %q", sni)
		}
		// Peek stops at the first complete answer, so more bytes must not
		// change it.
		sni2, complete2, err2 := ClientHelloSNI(append(b[:len(b):len(b)], 0x16, 3, 3, 0, 1, 0))
		if sni2 != sni || !complete2 || err2 != nil {
			t.Fatalf("appending changed %q to %q %v %v", sni, sni2, complete2, err2)
		}
	})
}

func FuzzHTTPHost(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
		"GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"POST /api HTTP/1.0\nHost: [2001:db8::1]\nContent-Length: 2\n\nhi",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"SSH-2.0-OpenSSH_9.6\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		host, complete, err := HTTPHost(b)
		if err != nil && complete {
			t.Fatal("complete with an error")
		}
		if !complete {
			return
		}
		if host == "" {
			t.Fatal("complete without a host")
		}
		host2, complete2, err2 := HTTPHost(append(b[:len(b):len(b)], "Host: other.example\r\n\r\n"...))
		if host2 != host || !complete2 || err2 != nil {
			t.Fatalf("appending changed %q to %q %v %v", host, host2, complete2, err2)
		}
	})
}
