package plan

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Summary is the one-line description of the cage used in audit events,
// e.g. cage[ab12] fs=ro:/usr,rw:/work net=block state=none mem=512MiB ...
func (p *Plan) Summary(id string) string {
	var fs []string
	for _, m := range p.Mounts {
		if m.Kind != KindBind {
			continue
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		fs = append(fs, mode+":"+m.Target)
	}
	l := p.Limits
	return fmt.Sprintf("cage[%s] fs=%s net=%s state=%s mem=%s pids=%s cpu=%s walltime=%s seccomp=%s landlock=abi%d user=%d:%d",
		id, strings.Join(fs, ","), p.Network.Mode, p.State.Mode,
		orNone(l.MemoryBytes > 0, FormatBytes(l.MemoryBytes)),
		orNone(l.Pids > 0, fmt.Sprint(l.Pids)),
		orNone(l.CPUCores > 0, fmt.Sprint(l.CPUCores)),
		orNone(l.WalltimeMS > 0, (time.Duration(l.WalltimeMS)*time.Millisecond).String()),
		p.Seccomp.Profile, p.Landlock.ABI, p.User.UID, p.User.GID)
}

// sizeOpt shows a tmpfs's size cap, or for /dev its /dev/shm's.
func sizeOpt(m Mount) string {
	switch {
	case m.SizeBytes == 0:
		return ""
	case m.Kind == KindDev:
		return " shm size=" + FormatBytes(m.SizeBytes)
	}
	return " size=" + FormatBytes(m.SizeBytes)
}

func orNone(ok bool, s string) string {
	if ok {
		return s
	}
	return "none"
}

// FormatBytes writes n in the largest binary unit that divides it exactly,
// as limits are written in policies.
func FormatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// WriteText prints the plan for people: every mount in order, the Landlock
// and seccomp rules, the identity, the limits and how each is enforced.
func (p *Plan) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if !p.Caged {
		ew.printf("sandbox: DISABLED — the command runs with no isolation (walltime is still enforced)\n")
	}
	if len(p.Defaults) > 0 {
		ew.printf("from the built-in default: %s (left out of the policy file; a section it names replaces the default's whole, extends: none takes none)\n", strings.Join(p.Defaults, ", "))
	}
	ew.printf("workdir: %s\n", p.Workdir)
	ew.printf("hostname: %s\n", p.Hostname)
	ew.printf("namespaces: %s\n", strings.Join(p.Namespaces, " "))
	mode := "root: no user namespace; identity changed with setresuid"
	if p.Rootless {
		mode = "rootless: user namespace mapping the invoking user to itself"
	}
	ew.printf("privileges: %s\n", mode)
	ew.printf("user: uid=%d gid=%d groups=%v name=%s home=%s (%s)\n", p.User.UID, p.User.GID, p.User.Groups, p.User.Name, p.User.Home, p.User.Why)
	ew.printf("  all capabilities dropped (bounding, ambient, permitted), no_new_privs set\n")
	if p.Path != "" || len(p.PathDropped) > 0 {
		ew.printf("PATH: %s\n", p.Path)
		if len(p.PathDropped) > 0 {
			ew.printf("  left out, not inside the sandbox: %s\n", strings.Join(p.PathDropped, " "))
		}
	}

	ew.printf("\nmounts (in order; nothing else exists inside):\n")
	for i, m := range p.Mounts {
		switch m.Kind {
		case KindBind:
			access := "rw"
			if m.ReadOnly {
				access = "ro"
			}
			src := ""
			if m.Source != m.Target {
				src = " from " + m.Source
			}
			idmapped := ""
			if m.IDMap != nil {
				idmapped = ",idmap(" + m.IDMap.String() + ")"
			}
			ew.printf("  %2d. bind  %s %s%s nosuid,nodev%s  (%s)\n", i+1, access, m.Target, src, idmapped, m.Why)
		case KindTmpfs:
			ew.printf("  %2d. tmpfs rw %s mode=%04o uid=%d%s  (%s)\n", i+1, m.Target, m.Mode, m.UID, sizeOpt(m), m.Why)
		default:
			ew.printf("  %2d. %-5s %s%s  (%s)\n", i+1, m.Kind, m.Target, sizeOpt(m), m.Why)
		}
	}
	ew.printf("  then pivot_root into the new root, detach the host's, make / read-only\n")
	for _, s := range p.Skipped {
		ew.printf("  skipped %s: %s\n", s.Path, s.Reason)
	}

	ew.printf("\nlandlock: %s, ", p.Landlock.Compatibility)
	if p.Landlock.ABI > 0 {
		ew.printf("ABI %d\n", p.Landlock.ABI)
	} else {
		ew.printf("unavailable on this kernel\n")
	}
	for _, path := range p.Landlock.ReadOnly {
		ew.printf("  ro %s\n", path)
	}
	for _, path := range p.Landlock.ReadWrite {
		ew.printf("  rw %s\n", path)
	}
	for _, path := range p.Landlock.ListOnly {
		ew.printf("  list %s (directory entries only)\n", path)
	}
	if p.Landlock.ABI >= 6 {
		ew.printf("  scope: signals and abstract UNIX sockets cannot leave the sandbox's Landlock domain\n")
	}

	ew.printf("\nseccomp: profile %s, network mode %s, default action allow, TSYNC\n", p.Seccomp.Profile, p.Seccomp.NetMode)
	for _, r := range p.Seccomp.Rules {
		cond := ""
		if r.Condition != "" {
			cond = " when " + r.Condition
		}
		ew.printf("  %-14s %s%s  (%s)\n", r.Action, strings.Join(r.Syscalls, " "), cond, r.Reason)
	}

	ew.printf("\nlimits:\n")
	for _, e := range p.Limits.Enforcement {
		ew.printf("  %s\n", e)
	}
	if len(p.Limits.Enforcement) == 0 {
		ew.printf("  none\n")
	}

	ew.printf("\nnetwork: %s — %s\n", p.Network.Mode, p.Network.Description)
	if c := p.Network.Capture; c != nil {
		ew.printf("  capture address %s: DNS :%d, transparent :%d, HTTP proxy :%d, SOCKS5 :%d\n",
			c.Addr, c.DNSPort, c.TransparentPort, c.HTTPProxyPort, c.SOCKSPort)
		ew.printf("  nftables inside the sandbox's namespace:\n")
		for _, r := range c.Rules {
			ew.printf("    %s\n", r)
		}
		for _, e := range p.ProxyEnv() {
			ew.printf("  env %s\n", e)
		}
	}
	if u := p.Network.Uninspected; len(u) > 0 {
		ew.printf("  not inspected (decided on host, port and binary; over TLS on the SNI alone, so the server may be asked for any other name it serves at the same address — protocol: rest inspects): %s\n",
			strings.Join(u, " "))
	}
	for _, sec := range p.Network.Secrets {
		ew.printf("  secret %s: a surrogate inside; the real value only in %s of requests over TLS to %s\n",
			sec.Name, strings.Join(sec.Headers, ", "), strings.Join(sec.Hosts, ", "))
	}
	ew.printf("state: %s", p.State.Mode)
	if p.State.HostDir != "" {
		ew.printf(" (/scratch from %s)", p.State.HostDir)
	}
	ew.printf("\n")
	if len(p.Warnings) > 0 {
		ew.printf("\nwarnings:\n")
		for _, wn := range p.Warnings {
			ew.printf("  ! %s\n", wn)
		}
	}
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
