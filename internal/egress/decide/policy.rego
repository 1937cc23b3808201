# Baked-in egress rules for corral. The input and data documents are
# described in the Go package documentation (internal/egress/decide).
#
# The engine's index has already matched every candidate endpoint's host
# pattern or address, and its ports, against the request; doing that here
# would scan all endpoints on every connection. What is left to the rules is
# who may connect and which policy speaks for the decision.
package corral.egress

# A policy without binaries applies to every process.
binary_allowed(patterns) if count(patterns) == 0

# The process's executable, any ancestor or a script named on its command
# line may carry the binding (input.exec.paths holds all of them), so that
# `node /usr/local/bin/claude` is bound by the script rather than by node.
binary_allowed(patterns) if {
	some b in patterns
	b in input.exec.paths
}

binary_allowed(patterns) if {
	some b in patterns
	contains(b, "*")
	some p in input.exec.paths
	glob.match(b, ["/"], p)
}

# Candidates arrive ordered by policy name, so when several policies allow a
# connection the one reported is stable across runs.
allowing := [c |
	some c in input.candidates
	binary_allowed(data.network_policies[c.policy].binaries)
]

default decision := {"allow": false, "policy": "", "reason": "no_matching_policy", "allowed_ips": []}

decision := {"allow": true, "policy": p.name, "reason": "", "allowed_ips": p.endpoints[c.endpoint].allowed_ips} if {
	c := allowing[0]
	p := data.network_policies[c.policy]
} else := {"allow": false, "policy": data.network_policies[input.candidates[0].policy].name, "reason": "binary_not_allowed", "allowed_ips": []}
