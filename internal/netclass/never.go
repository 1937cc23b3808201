package netclass

import (
	"net/netip"
	"slices"
)

// Range is a block of addresses that are all of one never-allowed class.
type Range struct {
	Prefix netip.Prefix
	Class  Class
	// Of is the IPv4 block an IPv6 form (Form) carries; it is the zero
	// Prefix for a block written as itself.
	Of   netip.Prefix
	Form string
}

// neverRanges holds every block Classify puts in a never-allowed class,
// IPv6 forms carrying such IPv4 blocks included, grouped in the order of
// never, blocks written as themselves before translated forms.
var neverRanges = func() []Range {
	var out []Range
	for _, n := range never {
		for _, cr := range slices.Concat(v4Ranges, v6Ranges) {
			if cr.class == n.class {
				out = append(out, Range{Prefix: cr.prefix, Class: cr.class})
			}
		}
		for _, cr := range v4Ranges {
			if cr.class != n.class {
				continue
			}
			for _, e := range []embedding{mapped, nat64, sixToFour, v4Compat} {
				out = append(out, Range{Prefix: e.embed(cr.prefix), Class: cr.class, Of: cr.prefix, Form: e.name})
			}
		}
	}
	return out
}()

// NeverAllowedIn returns a block of never-allowed addresses that p
// overlaps, reporting false when there is none. An allowed_ips entry that
// overlaps one promises destinations the dialer always refuses.
func NeverAllowedIn(p netip.Prefix) (Range, bool) {
	p = p.Masked()
	for _, r := range neverRanges {
		if r.Prefix.Overlaps(p) {
			return r, true
		}
	}
	return Range{}, false
}
