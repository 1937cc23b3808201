// Package keyecho is a model backend for tests that hands back the
// credential it received, in the way a mode names: the part a debugging
// proxy or an error page quoting the request would play, against which
// the inference router's scrubbing is tested.
package keyecho

import (
	"compress/flate"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Modes are the ways Handler reflects the key.
var Modes = []string{"ok-body", "ok-header", "ok-split", "sse", "err-header", "err-b64", "err-json", "err-hex", "err-deflate", "err-br", "err-cut"}

// Handler answers each request in the mode modeOf reads from it (one of
// Modes), with the key taken from its Authorization or X-Api-Key header.
func Handler(modeOf func(*http.Request) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode := modeOf(r)
		_, _ = io.Copy(io.Discard, r.Body)
		auth := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		key := strings.TrimPrefix(auth, "Bearer ")
		ok := func(content string) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}]}`, content)
		}
		switch mode {
		case "ok-body":
			ok("you authenticated with " + auth)
		case "ok-header":
			w.Header().Set("X-Debug-Auth", auth)
			w.Header().Set("X-Seen-"+key, "1")
			ok("hello")
		case "ok-split":
			// The key straddles the router's 32 KiB reads of a body
			// whose length it does not know.
			w.Header().Set("Content-Type", "text/plain")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, strings.Repeat("x", 32<<10-7)+auth+" end")
		case "sse":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", auth)
			fmt.Fprint(w, "data: [DONE]\n\n")
		case "err-header":
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", token="`+key+`"`)
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"bad key"}}`)
		case "err-b64":
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"bad credential %s %s"}}`, base64.StdEncoding.EncodeToString([]byte(auth)), base64.RawURLEncoding.EncodeToString([]byte("u:"+key)))
		case "err-json":
			var b strings.Builder
			for _, c := range key {
				fmt.Fprintf(&b, `\u%04x`, c)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"type":"invalid_request_error","message":"Incorrect API key provided: %s"}}`, b.String())
		case "err-hex":
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"error":{"message":"key digest input %s"}}`, hex.EncodeToString([]byte(key)))
		case "err-deflate":
			// Go's transport leaves a coding it did not ask for alone;
			// curl --compressed would undo it.
			w.Header().Set("Content-Encoding", "deflate")
			w.WriteHeader(http.StatusUnauthorized)
			z, _ := flate.NewWriter(w, flate.BestSpeed)
			fmt.Fprintf(z, `{"error":{"message":"bad key %s"}}`, key)
			_ = z.Close()
		case "err-br":
			// Labelled br but not brotli at all: whatever a coding the
			// router cannot undo holds must not pass, readable or not.
			w.Header().Set("Content-Encoding", "br")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"bad key %s"}}`, key)
		case "err-cut":
			// The key starts 20 bytes before the router's 1 MiB limit.
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, strings.Repeat("x", 1<<20-20)+key)
		default:
			http.Error(w, "keyecho: unknown mode "+mode, http.StatusBadRequest)
		}
	})
}
