package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/netclass"
)

// refused is the problem reported at path at for an allowed_ips entry that
// includes addresses the dialer refuses whatever the policy says.
func refused(at, entry, class, block, reason string) string {
	return at + ": " + refusedEntry(entry, class, block, reason)
}

func refusedEntry(entry, class, block, reason string) string {
	return fmt.Sprintf("%q includes %s addresses (%s); corral never connects to those, whatever allowed_ips say: %s — %s",
		entry, class, block, reason, forbiddenFix)
}

const (
	whyLoopback  = "they are this host's own services"
	whyLinkLocal = "they are the host's link neighbours, cloud metadata services among them"
	whyMetadata  = "they hand out the cloud instance's credentials"
	whyBenchmark = "the range holds the sandbox's synthetic DNS answers and capture address, which mean something only inside the sandbox"
)

// Each entry here loaded before policy validation shared the dialer's
// address table, though the dialer refuses every connection it promises
// (or, for the wide ranges, some of them).
func TestAllowedIPsTheDialerRefuses(t *testing.T) {
	at := "network_policies.p.endpoints[0].allowed_ips[0]"
	for _, tc := range []struct {
		entry string
		want  string // "" when the entry is valid
	}{
		{"198.18.1.1", refused(at, "198.18.1.1", "benchmark", "198.18.0.0/15", whyBenchmark)},
		{"198.19.255.254", refused(at, "198.19.255.254", "benchmark", "198.18.0.0/15", whyBenchmark)},
		{"198.18.0.0/16", refused(at, "198.18.0.0/16", "benchmark", "198.18.0.0/15", whyBenchmark)},
		{"64:ff9b::a9fe:a9fe", refused(at, "64:ff9b::a9fe:a9fe", "metadata", "64:ff9b::a9fe:a9fe/128, the NAT64 form of 169.254.169.254/32", whyMetadata)},
		{"64:ff9b::7f00:1", refused(at, "64:ff9b::7f00:1", "loopback", "64:ff9b::7f00:0/104, the NAT64 form of 127.0.0.0/8", whyLoopback)},
		{"64:ff9b::/96", refused(at, "64:ff9b::/96", "loopback", "64:ff9b::7f00:0/104, the NAT64 form of 127.0.0.0/8", whyLoopback)},
		{"2002:a9fe:a9fe::/48", refused(at, "2002:a9fe:a9fe::/48", "metadata", "2002:a9fe:a9fe::/48, the 6to4 form of 169.254.169.254/32", whyMetadata)},
		{"::127.0.0.1", refused(at, "::127.0.0.1", "loopback", "::7f00:0/104, the IPv4-compatible form of 127.0.0.0/8", whyLoopback)},
		{"::ffff:127.0.0.1", refused(at, "::ffff:127.0.0.1", "loopback", "::ffff:127.0.0.0/104, the IPv4-mapped form of 127.0.0.0/8", whyLoopback)},
		{"::ffff:198.18.0.1", refused(at, "::ffff:198.18.0.1", "benchmark", "::ffff:198.18.0.0/111, the IPv4-mapped form of 198.18.0.0/15", whyBenchmark)},
		{"100.100.100.200", refused(at, "100.100.100.200", "metadata", "100.100.100.200/32", whyMetadata)},
		{"192.0.0.192", refused(at, "192.0.0.192", "metadata", "192.0.0.192/32", whyMetadata)},
		{"127.0.0.0/8", refused(at, "127.0.0.0/8", "loopback", "127.0.0.0/8", whyLoopback)},
		{"169.254.169.254/32", refused(at, "169.254.169.254/32", "metadata", "169.254.169.254/32", whyMetadata)},
		// Wide ranges promise, among others, addresses the dialer refuses.
		{"0.0.0.0/0", refused(at, "0.0.0.0/0", "loopback", "127.0.0.0/8", whyLoopback)},
		{"::/0", refused(at, "::/0", "loopback", "::1/128", whyLoopback)},
		{"198.0.0.0/8", refused(at, "198.0.0.0/8", "benchmark", "198.18.0.0/15", whyBenchmark)},

		{"203.0.113.0/24", ""},
		{"10.0.0.0/8", ""},
		{"fd12::/16", ""},
		{"64:ff9b::a00:0/104", ""},
		{"::ffff:10.0.0.0/104", ""},
		{"198.20.0.0/14", ""},
	} {
		got := problems(t, endpointPolicy(fmt.Sprintf("allowed_ips: [%q]\nport: 443", tc.entry)))
		var want []string
		if tc.want != "" {
			want = []string{tc.want}
		}
		if !slices.Equal(got, want) {
			t.Errorf("allowed_ips: [%s]:\n got: %s\nwant: %s", tc.entry, strings.Join(got, "\n      "), tc.want)
		}
	}
}

// The short form and host literals go through the same check.
func TestShortFormAndHostTheDialerRefuses(t *testing.T) {
	got := problems(t, "version: 1\nnetwork: {allow: ['198.18.1.1:443', '[64:ff9b::a9fe:a9fe]:80']}\n")
	want := []string{
		refused("network.allow[0]", "198.18.1.1", "benchmark", "198.18.0.0/15", whyBenchmark),
		refused("network.allow[1]", "64:ff9b::a9fe:a9fe", "metadata", "64:ff9b::a9fe:a9fe/128, the NAT64 form of 169.254.169.254/32", whyMetadata),
	}
	if !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = problems(t, endpointPolicy("host: 198.18.1.1\nport: 80"))
	want = []string{`network_policies.p.endpoints[0].host: "198.18.1.1" is a benchmark address (198.18.0.0/15); corral never connects to those, whatever allowed_ips say: ` +
		whyBenchmark + ` — ` + forbiddenFix}
	if !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A single address loads exactly when the dialer's classifier would let
// allowed_ips open it.
func TestAllowedIPsAgreeWithClassifier(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	bases := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("96.0.0.0/3"), netip.MustParsePrefix("192.0.0.0/8"),
		netip.MustParsePrefix("::ffff:0.0.0.0/96"), netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("2002::/16"),
		netip.MustParsePrefix("::/96"), netip.MustParsePrefix("fd00:ec2::/120"), netip.MustParsePrefix("fe00::/7"), netip.MustParsePrefix("::/0"),
	}
	for range 50000 {
		base := bases[rnd.IntN(len(bases))]
		b := base.Addr().As16()
		first := 0
		if base.Addr().Is4() {
			first = 96
		}
		for bit := first + base.Bits(); bit < 128; bit++ {
			if rnd.IntN(2) == 1 {
				b[bit/8] |= 0x80 >> (bit % 8)
			}
		}
		ip := netip.AddrFrom16(b)
		if base.Addr().Is4() {
			ip = ip.Unmap()
		}
		class, internal := netclass.Classify(ip)
		_, msg, _ := parseIPRange(ip.String())
		if loads, dialable := msg == "", !internal || !netclass.NeverAllowed(class); loads != dialable {
			t.Fatalf("allowed_ips: [%s] loads: %v, but the dialer can open it: %v (%s)", ip, loads, dialable, class)
		}
	}
}
