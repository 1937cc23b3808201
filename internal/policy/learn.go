package policy

func init() {
	checks = append(checks, checkLearn)
}

// checkLearn: learn mode lets the proxy through what no policy allows, so
// it needs the proxy.
func checkLearn(p *Policy, r *report) {
	if p.Network.Learn && p.NetworkMode() != ModeProxy {
		r.errorf("network.learn", "set network.mode: proxy, or drop learn",
			"learn mode needs network mode proxy, not %s", p.NetworkMode())
	}
}
