package dns

import (
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/corral-sandbox/corral/internal/netclass"
)

// In learn mode every valid name gets a synthetic address (the gate then
// decides the connection); without it, a name no policy allows is
// NXDOMAIN. Invalid names stay refused either way.
func TestLearnAnswersEveryName(t *testing.T) {
	src := netip.MustParseAddrPort("198.19.255.254:5353")
	for _, learn := range []bool{false, true} {
		srv, _, _ := newServer(t, netclass.SyntheticPrefix)
		srv.Learn = learn
		srv.init()
		for _, tc := range []struct {
			name string
			want int
		}{
			{"unlisted.test.", map[bool]int{false: mdns.RcodeNameError, true: mdns.RcodeSuccess}[learn]},
			{"api.example.com.", mdns.RcodeSuccess},
			{"bad_name!.test.", mdns.RcodeNameError},
		} {
			q := new(mdns.Msg)
			q.SetQuestion(tc.name, mdns.TypeA)
			req, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			var r mdns.Msg
			if err := r.Unpack(srv.respond(req, src, true)); err != nil {
				t.Fatal(err)
			}
			if r.Rcode != tc.want {
				t.Errorf("learn %v: %s: rcode %s, want %s", learn, tc.name, mdns.RcodeToString[r.Rcode], mdns.RcodeToString[tc.want])
			}
			if r.Rcode == mdns.RcodeSuccess && len(r.Answer) != 1 {
				t.Errorf("learn %v: %s: answers %v", learn, tc.name, r.Answer)
			}
		}
	}
}
