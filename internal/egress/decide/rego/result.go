package rego

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

// The rules' results are accepted only in their documented shapes, so that
// rules returning anything else deny instead of being half understood.

// parseDecision's second result is the deciding policy's key in
// network_policies, if the rules report it.
func parseDecision(v ast.Value) (egress.Decision, string, error) {
	var d egress.Decision
	obj, ok := v.(ast.Object)
	if !ok {
		return d, "", fmt.Errorf("decision is %v, not an object", ast.ValueName(v))
	}
	allow, ok := field(obj, keyAllow).(ast.Boolean)
	if !ok {
		return d, "", errors.New("decision.allow is not a boolean")
	}
	var policyName, reason, key ast.String
	for _, f := range []struct {
		key *ast.Term
		dst *ast.String
	}{{keyPolicy, &policyName}, {keyReason, &reason}, {keyKey, &key}} {
		switch x := field(obj, f.key).(type) {
		case nil:
		case ast.String:
			*f.dst = x
		default:
			return d, "", fmt.Errorf("decision.%v is %v, not a string", f.key.Value, ast.ValueName(x))
		}
	}
	switch x := field(obj, keyAllowedIPs).(type) {
	case nil:
	case *ast.Array:
		for i := range x.Len() {
			s, ok := x.Elem(i).Value.(ast.String)
			if !ok {
				return d, "", errors.New("decision.allowed_ips holds a value that is not a string")
			}
			pfx, err := parsePrefix(string(s))
			if err != nil {
				return d, "", fmt.Errorf("decision.allowed_ips: %w", err)
			}
			d.AllowedIPs = append(d.AllowedIPs, pfx)
		}
	default:
		return d, "", fmt.Errorf("decision.allowed_ips is %v, not an array", ast.ValueName(x))
	}
	d.Allow, d.Policy = bool(allow), string(policyName)
	if !d.Allow {
		d.Reason = string(reason)
		if d.Reason == "" {
			d.Reason = egress.ReasonNoPolicy
		}
	}
	return d, string(key), nil
}

func field(obj ast.Object, key *ast.Term) ast.Value {
	if t := obj.Get(key); t != nil {
		return t.Value
	}
	return nil
}

// parseRequestDecision accepts only the documented shape of
// request_decision.
func parseRequestDecision(v ast.Value) (egress.HTTPDecision, error) {
	var d egress.HTTPDecision
	obj, ok := v.(ast.Object)
	if !ok {
		return d, fmt.Errorf("request_decision is %v, not an object", ast.ValueName(v))
	}
	allow, ok := field(obj, keyAllow).(ast.Boolean)
	if !ok {
		return d, errors.New("request_decision.allow is not a boolean")
	}
	var policyName, rule, reason, enforcement ast.String
	for _, f := range []struct {
		key *ast.Term
		dst *ast.String
	}{{keyPolicy, &policyName}, {keyRule, &rule}, {keyReason, &reason}, {keyEnforcement, &enforcement}} {
		switch x := field(obj, f.key).(type) {
		case nil:
		case ast.String:
			*f.dst = x
		default:
			return d, fmt.Errorf("request_decision.%v is %v, not a string", f.key.Value, ast.ValueName(x))
		}
	}
	switch enforcement {
	case "", policy.EnforcementEnforce:
	case policy.EnforcementAudit:
		d.Audit = true
	default:
		return d, fmt.Errorf("request_decision.enforcement is %q", string(enforcement))
	}
	d.Allow, d.Policy, d.Rule = bool(allow), string(policyName), string(rule)
	if !d.Allow {
		d.Reason = string(reason)
		if d.Reason == "" {
			d.Reason = egress.ReasonL7NoRule
		}
	}
	return d, nil
}

// parsePrefix reads an allowed_ips entry of the rules' result: an address
// or a CIDR, which user rules may spell either way.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}
