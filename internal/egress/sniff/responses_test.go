package sniff

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The response follower grants a WebSocket only for a real 101 that
// answers the WebSocket request, wherever the bytes are split, and never
// for a 101 hidden in a body or answering another request.
func TestResponsesFollowFraming(t *testing.T) {
	const ok101 = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	get, ws, head := exchange{method: "GET"}, exchange{method: "GET", websocket: true}, exchange{method: "HEAD"}
	tests := []struct {
		name   string
		reqs   []exchange
		stream string
		want   []bool // outcomes told, in order
	}{
		{"accepted", []exchange{ws}, ok101, []bool{true}},
		{"after a response", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc" + ok101, []bool{true}},
		{"after chunks", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n" + ok101, []bool{true}},
		{"after interim", []exchange{ws}, "HTTP/1.1 100 Continue\r\n\r\n" + ok101, []bool{true}},
		{"HEAD has no body", []exchange{head, ws}, "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n" + ok101, []bool{true}},
		{"refused with 200", []exchange{ws}, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", []bool{false}},
		{"refused with 426", []exchange{ws}, "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n", []bool{false}},
		{"101 inside a body", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(ok101)) + "\r\n\r\n" + ok101 + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", []bool{false}},
		{"101 inside a chunk", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(ok101)), 16) + "\r\n" + ok101 + "\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", []bool{false}},
		{"101 to a plain request", []exchange{get, ws}, ok101, []bool{false}},
		{"101 without Upgrade", []exchange{ws}, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n", []bool{false}},
		{"101 to h2c", []exchange{ws}, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", []bool{false}},
		{"HTTP/1.0 101", []exchange{ws}, strings.Replace(ok101, "HTTP/1.1", "HTTP/1.0", 1), []bool{false}},
		{"both framings", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n" + ok101, []bool{false}},
		{"conflicting lengths", []exchange{get, ws}, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n" + ok101, []bool{false}},
		{"body until close", []exchange{get, ws}, "HTTP/1.1 200 OK\r\n\r\n" + ok101, nil},
		{"folded header", []exchange{ws}, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n Connection: Upgrade\r\n\r\n", []bool{false}},
		{"answer before the request", nil, ok101, nil},
	}
	for _, tt := range tests {
		for _, step := range []int{1, 7, len(tt.stream)} {
			var told []bool
			var r *responses
			// Letting the relay splice what unwatched allows must change
			// nothing the follower concludes.
			for _, skipping := range []bool{false, true} {
				told = nil
				r = &responses{outcome: func(a bool) { told = append(told, a) }}
				for _, ex := range tt.reqs {
					r.expect(ex)
				}
				follow(r, []byte(tt.stream), step, skipping)
				if !slices.Equal(told, tt.want) {
					t.Errorf("%s (fed %d bytes at a time, bodies skipped: %v): told %v, want %v", tt.name, step, skipping, told, tt.want)
				}
			}
			// Whatever is still waiting is refused when the server ends.
			r.end()
			if n := len(tt.reqs); n > 0 && tt.reqs[n-1].websocket && len(told) != 1 {
				t.Errorf("%s: the WebSocket request was told %d times", tt.name, len(told))
			}
		}
	}
}

// FuzzResponses: how the server's bytes are split never changes what the
// follower concludes, a WebSocket request is answered at most once, and
// only a 101 grants one.
func FuzzResponses(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"), uint8(3), uint8(2))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), uint8(5), uint8(2))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, step, wsAt uint8) {
		reqs := make([]exchange, 3)
		for i := range reqs {
			reqs[i] = exchange{method: "GET", websocket: i == int(wsAt%3)}
		}
		run := func(step int, skipping bool) []bool {
			var told []bool
			r := &responses{outcome: func(a bool) { told = append(told, a) }}
			for _, ex := range reqs {
				r.expect(ex)
			}
			follow(r, stream, step, skipping)
			r.end()
			return told
		}
		whole := run(len(stream)+1, false)
		if split := run(int(step%16)+1, false); !slices.Equal(whole, split) {
			t.Fatalf("fed whole: %v, fed %d bytes at a time: %v", whole, step%16+1, split)
		}
		if skipped := run(int(step%16)+1, true); !slices.Equal(whole, skipped) {
			t.Fatalf("fed whole: %v, with bodies skipped: %v", whole, skipped)
		}
		if len(whole) > 1 {
			t.Fatalf("one WebSocket request was answered %d times", len(whole))
		}
		if len(whole) == 1 && whole[0] && !strings.Contains(string(stream), " 101") {
			t.Fatalf("a WebSocket was granted without a 101 in %q", stream)
		}
	})
}

// follow gives r the server's stream step bytes at a time. skipping does
// what the relay does: bytes unwatched allows are skipped, not fed, and
// once it allows everything the rest is never shown.
func follow(r *responses, stream []byte, step int, skipping bool) {
	for len(stream) > 0 {
		if skipping {
			u := r.unwatched()
			if u < 0 {
				return
			}
			if u > 0 {
				n := min(u, int64(len(stream)))
				r.skip(n)
				stream = stream[n:]
				continue
			}
		}
		n := min(step, len(stream))
		r.feed(stream[:n])
		stream = stream[n:]
	}
}
