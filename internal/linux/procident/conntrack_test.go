package procident

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// When two connections that differ only in destination are redirected to
// one listener, conntrack gives the second a new source port; the original
// tuple must still be found from what the listener sees.
func TestOriginalTupleThroughNATClash(t *testing.T) {
	dir := t.TempDir()
	table := `ipv4     2 udp      17 29 src=198.19.255.254 dst=8.8.8.8 sport=5353 dport=53 src=127.0.0.1 dst=198.19.255.254 sport=53 dport=5353 mark=0 zone=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=198.19.255.254 dst=198.18.0.1 sport=40000 dport=7000 src=127.0.0.1 dst=198.19.255.254 sport=15001 dport=40000 [ASSURED] mark=0 zone=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=198.19.255.254 dst=198.18.0.2 sport=40000 dport=7000 src=127.0.0.1 dst=198.19.255.254 sport=15001 dport=5611 [ASSURED] mark=0 zone=0 use=2
ipv6     10 tcp      6 431999 ESTABLISHED src=fd00:c0ff::1 dst=2001:db8::1 sport=41000 dport=80 src=::1 dst=fd00:c0ff::1 sport=15001 dport=41000 [ASSURED] mark=0 zone=0 use=2
`
	if err := os.WriteFile(filepath.Join(dir, "nf_conntrack"), []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	snap := &snapshot{original: map[tuple]tuple{}}
	snap.readConntrack(filepath.Join(dir, "nf_conntrack"))
	for _, tc := range []struct {
		local, remote, wantSrc, wantDst string
	}{
		{"127.0.0.1:15001", "198.19.255.254:40000", "198.19.255.254:40000", "198.18.0.1:7000"},
		{"127.0.0.1:15001", "198.19.255.254:5611", "198.19.255.254:40000", "198.18.0.2:7000"},
		{"[::1]:15001", "[fd00:c0ff::1]:41000", "[fd00:c0ff::1]:41000", "[2001:db8::1]:80"},
	} {
		o, ok := snap.original[tuple{ap(tc.local), ap(tc.remote)}]
		if !ok || o.a != ap(tc.wantSrc) || o.b != ap(tc.wantDst) {
			t.Errorf("original(%s, %s) = %s, %s, %v; want %s, %s", tc.local, tc.remote, o.a, o.b, ok, tc.wantSrc, tc.wantDst)
		}
	}
	if _, ok := snap.original[tuple{ap("127.0.0.1:15001"), ap("198.19.255.254:9")}]; ok {
		t.Error("found a tuple for a connection conntrack does not know")
	}
}
