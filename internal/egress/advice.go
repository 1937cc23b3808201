package egress

// Advice tells a refused client which pending policy chunk would allow
// its request and how to get it approved (the policy advisor). For is
// called on every refusal, so it must be a cheap lookup.
type Advice interface {
	// For returns the id of the pending chunk answering r, empty when
	// there is none yet, and the steps that lead to an approval.
	For(r Request) (chunk string, next []string)
}

// Learnable reports whether a connection was refused for reason only for
// want of a policy: what learn mode lets through and what a policy chunk
// can answer. Never a refusal about who the client is, what it claims, or
// where it goes (the dialer refuses internal addresses whatever the
// decision).
func Learnable(reason string) bool {
	return reason == ReasonNoPolicy || reason == ReasonBinary
}
