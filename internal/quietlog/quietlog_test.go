package quietlog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestFloodIsHeldBack(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil)))
	long := strings.Repeat("x", 60000)
	for range 10000 {
		log.Warn("request denied", "path", long)
	}
	log.Error("setup failed")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != burst+1 {
		t.Fatalf("%d lines written for 10000 warnings and an error, want %d", len(lines), burst+1)
	}
	if buf.Len() > 20*maxValue*2 {
		t.Errorf("%d bytes written: long values were not cut", buf.Len())
	}
	if !strings.Contains(lines[0], "more bytes]") {
		t.Errorf("a cut value does not say how much was cut: %.200s", lines[0])
	}
	if !strings.Contains(lines[burst], "setup failed") {
		t.Errorf("the error was held back: %s", lines[burst])
	}
}

func TestSuppressedCountReported(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil)).(*handler)
	now := time.Now()
	for range burst + 5 {
		h.st.take("m", now)
	}
	ok, n := h.st.take("m", now.Add(2*time.Second))
	if !ok || n != 5 {
		t.Fatalf("after the pause: ok=%v suppressed=%d, want true and 5", ok, n)
	}
}
