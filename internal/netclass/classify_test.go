package netclass

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		ip       string
		class    Class
		internal bool
	}{
		// IPv4
		{"8.8.8.8", ClassPublic, false},
		{"1.1.1.1", ClassPublic, false},
		{"203.0.113.7", ClassDocumentation, false},
		{"198.51.100.1", ClassDocumentation, false},
		{"192.0.2.1", ClassDocumentation, false},
		{"127.0.0.1", ClassLoopback, true},
		{"127.255.255.254", ClassLoopback, true},
		{"10.0.0.5", ClassPrivate, true},
		{"172.16.0.1", ClassPrivate, true},
		{"172.31.255.255", ClassPrivate, true},
		{"172.32.0.1", ClassPublic, false},
		{"192.168.1.1", ClassPrivate, true},
		{"100.64.0.1", ClassCGNAT, true},
		{"100.127.255.255", ClassCGNAT, true},
		{"100.128.0.1", ClassPublic, false},
		{"169.254.1.1", ClassLinkLocal, true},
		{"169.254.169.254", ClassMetadata, true},
		{"100.100.100.200", ClassMetadata, true},
		{"192.0.0.192", ClassMetadata, true},
		{"0.0.0.0", ClassUnspecified, true},
		{"0.1.2.3", ClassUnspecified, true},
		{"224.0.0.1", ClassMulticast, true},
		{"239.255.255.250", ClassMulticast, true},
		{"255.255.255.255", ClassBroadcast, true},
		{"240.0.0.1", ClassReserved, true},
		{"198.18.0.1", ClassBenchmark, true},
		{"198.19.255.254", ClassBenchmark, true},
		{"198.20.0.1", ClassPublic, false},
		{"192.0.0.8", ClassIETFProtocol, true},

		// IPv6
		{"2606:4700::1111", ClassPublic, false},
		{"2001:db8::1", ClassDocumentation, false},
		{"::", ClassUnspecified, true},
		{"::1", ClassLoopback, true},
		{"fe80::1", ClassLinkLocal, true},
		{"fe80::1%eth0", ClassLinkLocal, true},
		{"fd00:ec2::254", ClassMetadata, true},
		{"fd00::1", ClassULA, true},
		{"fc00::1", ClassULA, true},
		{"fec0::1", ClassSiteLocal, true},
		{"ff02::1", ClassMulticast, true},
		{"2001::1", ClassTeredo, true},
		{"2001:2::1", ClassIETFProtocol, true},
		{"100::1", ClassReserved, true},
		{"64:ff9b:1::a00:1", ClassReserved, true},

		// IPv4-mapped
		{"::ffff:127.0.0.1", ClassLoopback, true},
		{"::ffff:7f00:1", ClassLoopback, true},
		{"::ffff:10.0.0.5", ClassPrivate, true},
		{"::ffff:169.254.169.254", ClassMetadata, true},
		{"::ffff:0.0.0.0", ClassUnspecified, true},
		{"::ffff:8.8.8.8", ClassPublic, false},
		{"::ffff:198.18.0.1", ClassBenchmark, true},

		// NAT64
		{"64:ff9b::127.0.0.1", ClassLoopback, true},
		{"64:ff9b::a9fe:a9fe", ClassMetadata, true},
		{"64:ff9b::10.1.2.3", ClassPrivate, true},
		{"64:ff9b::100.64.0.1", ClassCGNAT, true},
		{"64:ff9b::8.8.8.8", ClassPublic, false},

		// 6to4
		{"2002:7f00:1::1", ClassLoopback, true},
		{"2002:a9fe:a9fe::", ClassMetadata, true},
		{"2002:c0a8:101::1", ClassPrivate, true},
		{"2002:808:808::1", ClassPublic, false},

		// IPv4-compatible (deprecated)
		{"::127.0.0.1", ClassLoopback, true},
		{"::10.0.0.1", ClassPrivate, true},
		{"::8.8.8.8", ClassReserved, true},
	} {
		ip := netip.MustParseAddr(tc.ip)
		class, internal := Classify(ip)
		if class != tc.class || internal != tc.internal {
			t.Errorf("Classify(%s) = %s, %v; want %s, %v", tc.ip, class, internal, tc.class, tc.internal)
		}
	}
	if c, internal := Classify(netip.Addr{}); !internal || c != ClassInvalid {
		t.Errorf("zero Addr: %s %v", c, internal)
	}
}

func TestNeverAllowed(t *testing.T) {
	for _, c := range []Class{ClassLoopback, ClassLinkLocal, ClassMetadata, ClassUnspecified, ClassBenchmark} {
		if !NeverAllowed(c) {
			t.Errorf("%s may be allowed", c)
		}
	}
	for _, c := range []Class{ClassPrivate, ClassCGNAT, ClassULA, ClassPublic} {
		if NeverAllowed(c) {
			t.Errorf("%s can never be allowed", c)
		}
	}
}
