package socks5

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"testing"
)

func FuzzHandshake(f *testing.F) {
	greet := []byte{5, 1, 0}
	f.Add(append(greet, connectReq(atypDomain, []byte("example.com"), 443)...))
	f.Add(append(greet, connectReq(atypIPv4, []byte{192, 0, 2, 1}, 80)...))
	f.Add(append(greet, connectReq(atypIPv6, netip.MustParseAddr("2001:db8::1").AsSlice(), 22)...))
	f.Add(append(greet, 5, 2, 0, atypDomain, 0, 0, 80))
	f.Add([]byte{5, 2, 2, 0})
	f.Add([]byte{5, 0})
	f.Add([]byte{4, 1, 0, 80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var out bytes.Buffer
		tgt, err := handshake(struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(b), &out})
		// Replies are written by the caller; the handshake itself only
		// answers the method selection.
		if out.Len() > 2 {
			t.Fatalf("wrote %d bytes", out.Len())
		}
		if err != nil {
			var re *replyError
			if errors.As(err, &re) && re.code == RepSucceeded {
				t.Fatal("failure carries a success reply")
			}
			return
		}
		if tgt.port == 0 || (tgt.host == "") == !tgt.ip.IsValid() {
			t.Fatalf("accepted target %+v", tgt)
		}
		if tgt.ip.Is4In6() || tgt.ip.Zone() != "" {
			t.Fatalf("address not normalised: %v", tgt.ip)
		}
	})
}
