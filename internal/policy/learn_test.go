package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestLearn(t *testing.T) {
	p, err := Parse([]byte("version: 1\nnetwork: {mode: proxy, learn: true}\n"), "t")
	if err != nil || !p.Network.Learn {
		t.Fatalf("learn in proxy mode: %v, %+v", err, p.Network)
	}
	if _, err := Parse([]byte("version: 1\nnetwork: {mode: block, learn: true}\n"), "t"); err == nil || !strings.Contains(err.Error(), "network.learn") {
		t.Errorf("learn in block mode: %v", err)
	}
	off, err := Parse([]byte("version: 1\nnetwork: {mode: proxy}\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	if d := off.StaticDiff(p); !slices.Contains(d, "network.learn") {
		t.Errorf("turning learn on is not a static change: %v", d)
	}
}
