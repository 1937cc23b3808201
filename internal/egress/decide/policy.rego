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
# endpoint without protocol (plain L4) allows every request.

l7_key := allowing[0].policy

l7_endpoints := [e |
	some c in allowing
	c.policy == l7_key
	e := data.network_policies[c.policy].endpoints[c.endpoint]
]

l7_selected := [e |
	some e in l7_endpoints
	e.path != ""
	glob.match(e.path, ["/"], input.http.path)
]

l7_unselected := [e |
	some e in l7_endpoints
	e.path == ""
]

l7_endpoint := l7_selected[0] if count(l7_selected) > 0
else := l7_unselected[0] if count(l7_unselected) > 0

method_matches(m) if m == "*"

method_matches(m) if m == input.http.method

path_matches(p) if p == "**"

path_matches(p) if glob.match(p, ["/"], input.http.path)

# Every value of a named parameter must match one of its globs, so that a
# repeated parameter cannot smuggle a second, unchecked value.
query_matches(q) if {
	every name, globs in q {
		values := object.get(input.http.query, name, [])
		count(values) > 0
		every v in values {
			some g in globs
			glob.match(g, null, v)
		}
	}
}

request_matches(m) if {
	method_matches(m.method)
	path_matches(m.path)
	query_matches(m.query)
}

l7_verdict(name, e) := {"allow": true, "policy": name, "rule": "", "reason": "", "enforcement": "enforce"} if {
	e.protocol == ""
} else := {"allow": false, "policy": name, "rule": e.deny_rules[i].id, "reason": "l7_deny_rule", "enforcement": e.enforcement} if {
	i := min({j | some j, m in e.deny_rules; request_matches(m)})
} else := {"allow": true, "policy": name, "rule": e.rules[i].id, "reason": "", "enforcement": e.enforcement} if {
	i := min({j | some j, r in e.rules; request_matches(r)})
} else := {"allow": false, "policy": name, "rule": "", "reason": "l7_no_matching_rule", "enforcement": e.enforcement}

default request_decision := {"allow": false, "policy": "", "rule": "", "reason": "no_matching_policy", "enforcement": "enforce"}

request_decision := l7_verdict(data.network_policies[l7_key].name, l7_endpoint) if {
	l7_endpoint
} else := {"allow": false, "policy": data.network_policies[l7_key].name, "rule": "", "reason": "l7_no_matching_endpoint", "enforcement": "enforce"} if {
	l7_key
} else := {"allow": false, "policy": decision.policy, "rule": "", "reason": decision.reason, "enforcement": "enforce"}
