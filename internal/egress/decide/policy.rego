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

decision := {"allow": true, "policy": p.name, "key": c.policy, "reason": "", "allowed_ips": p.endpoints[c.endpoint].allowed_ips} if {
	c := allowing[0]
	p := data.network_policies[c.policy]
} else := {"allow": false, "policy": data.network_policies[input.candidates[0].policy].name, "reason": "binary_not_allowed", "allowed_ips": []}

# ---- HTTP requests on inspected connections ----
#
# The connection's policy (the first allowing one, as above) speaks for its
# requests too. Go has matched each candidate's path selector and rules
# against the request and ordered each policy's candidates so that those
# whose path selector matches come first, then those without a selector,
# then those whose selector does not match (see the package documentation):
# the first allowing candidate is the endpoint that decides, if it applies
# at all. What is left here is which rule decides and that deny rules win;
# an endpoint without protocol (plain L4) allows every request.

l7_verdict(name, c, e) := {"allow": true, "policy": name, "rule": "", "reason": "", "enforcement": "enforce"} if {
	e.protocol == ""
} else := {"allow": false, "policy": name, "rule": e.deny_rules[c.matching_deny_rules[0]].id, "reason": "l7_deny_rule", "enforcement": e.enforcement} if {
	count(c.matching_deny_rules) > 0
} else := {"allow": true, "policy": name, "rule": e.rules[c.matching_rules[0]].id, "reason": "", "enforcement": e.enforcement} if {
	count(c.matching_rules) > 0
} else := {"allow": false, "policy": name, "rule": "", "reason": "l7_no_matching_rule", "enforcement": e.enforcement}

default request_decision := {"allow": false, "policy": "", "rule": "", "reason": "no_matching_policy", "enforcement": "enforce"}

request_decision := l7_verdict(p.name, c, p.endpoints[c.endpoint]) if {
	c := allowing[0]
	c.applies
	p := data.network_policies[c.policy]
} else := {"allow": false, "policy": data.network_policies[allowing[0].policy].name, "rule": "", "reason": "l7_no_matching_endpoint", "enforcement": "enforce"} if {
	allowing[0]
} else := {"allow": false, "policy": decision.policy, "rule": "", "reason": decision.reason, "enforcement": "enforce"}
