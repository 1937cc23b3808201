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
# requests too. Among its endpoints for this destination, one whose path
# selector matches the request is more specific than one without; an
# endpoint without protocol (plain L4) allows every request. Go has matched
# each candidate's path selector and rules against the request (see the
# package documentation); what is left here is which endpoint and which
# rule decide, and that deny rules win.

l7_key := allowing[0].policy

l7_candidates := [c |
	some c in allowing
	c.policy == l7_key
]

l7_selected := [c |
	some c in l7_candidates
	c.selected
]

l7_unselected := [c |
	some c in l7_candidates
	data.network_policies[c.policy].endpoints[c.endpoint].path == ""
]

l7_candidate := l7_selected[0] if count(l7_selected) > 0
else := l7_unselected[0] if count(l7_unselected) > 0

l7_verdict(name, c) := {"allow": true, "policy": name, "rule": "", "reason": "", "enforcement": "enforce"} if {
	data.network_policies[c.policy].endpoints[c.endpoint].protocol == ""
} else := {"allow": false, "policy": name, "rule": e.deny_rules[c.matching_deny_rules[0]].id, "reason": "l7_deny_rule", "enforcement": e.enforcement} if {
	e := data.network_policies[c.policy].endpoints[c.endpoint]
	count(c.matching_deny_rules) > 0
} else := {"allow": true, "policy": name, "rule": e.rules[c.matching_rules[0]].id, "reason": "", "enforcement": e.enforcement} if {
	e := data.network_policies[c.policy].endpoints[c.endpoint]
	count(c.matching_rules) > 0
} else := {"allow": false, "policy": name, "rule": "", "reason": "l7_no_matching_rule", "enforcement": data.network_policies[c.policy].endpoints[c.endpoint].enforcement}

default request_decision := {"allow": false, "policy": "", "rule": "", "reason": "no_matching_policy", "enforcement": "enforce"}

request_decision := l7_verdict(data.network_policies[l7_key].name, l7_candidate) if {
	l7_candidate
} else := {"allow": false, "policy": data.network_policies[l7_key].name, "rule": "", "reason": "l7_no_matching_endpoint", "enforcement": "enforce"} if {
	l7_key
} else := {"allow": false, "policy": decision.policy, "rule": "", "reason": decision.reason, "enforcement": "enforce"}
