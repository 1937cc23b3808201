// Package inference answers inference.local: it recognises OpenAI and
// Anthropic API calls by method and path, picks a configured route, puts
// the operator's key and model on the request, and streams the backend's
// answer back event by event, translating between the two APIs when a
// route asks for it. It knows nothing of sockets, TLS or process
// identity: the supervisor terminates TLS, dials through its guarded
// dialer and completes the audit record.
package inference

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-sandbox/corral/internal/inference/translate"
)

// MaxBodyBytes is the largest request body accepted; beyond it is a 413.
const MaxBodyBytes = 10 << 20

// maxTranslatedResponse bounds a non-streamed answer that is read whole to
// be translated.
const maxTranslatedResponse = 64 << 20

// maxErrorBody bounds a backend error body, which is read whole.
const maxErrorBody = 1 << 20

// maxUsageScan bounds how much of a passed-through JSON answer is kept to
// read its usage.
const maxUsageScan = 4 << 20

// Options are the supervisor's hooks.
type Options struct {
	// Dial reaches a backend; nil uses a plain net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnRequest receives one Record per request, for the
	// inference.request audit event, with the request's context (which
	// says who asked).
	OnRequest func(context.Context, Record)
	// Getenv and ReadFile resolve keys and CA files; nil uses the os
	// package.
	Getenv   func(string) string
	ReadFile func(string) ([]byte, error)
	// Mask makes the Masker of a route's key. The supervisor passes
	// keymask.New, which uses the masked-secrets scrubber; this package
	// cannot import it (the policy it builds on imports this package).
	// nil passes answers on as the backend sent them, for tests and
	// benchmarks that hold no key worth protecting.
	Mask func(key string) (Masker, error)
}

// Masker keeps a route's key out of everything the router answers. A
// backend may reflect the credential it received (a debugging proxy, an
// error page quoting the request's headers) in any header or body, in any
// status, streamed or not, encoded or compressed; the workload must get a
// surrogate there instead, as it does for masked secrets.
type Masker interface {
	// ScrubHeader replaces the key in names and values of h.
	ScrubHeader(h http.Header)
	// Scrub appends data to dst with the key replaced, taking data as
	// whole: nothing follows it. The output is exactly as long as data.
	Scrub(dst, data []byte) []byte
	// ScrubBody scrubs a body read in pieces of any size.
	ScrubBody(body io.ReadCloser) io.ReadCloser
	// DecodeResponse undoes resp's content coding so its body can be
	// scrubbed, or says why it cannot.
	DecodeResponse(resp *http.Response) error
	// Redact removes the key from text bound for the audit log.
	Redact(text string) string
}

// Record describes one request for the audit log. It never holds the key.
type Record struct {
	Route        string
	Protocol     string
	ClientModel  string
	RoutedModel  string
	Status       int
	Duration     time.Duration
	TTFB         time.Duration
	InputTokens  int64
	OutputTokens int64
	BytesIn      int64
	BytesOut     int64
	Err          string
}

// Router is the http.Handler for inference.local. Its routes are replaced
// atomically by Swap; requests already under way finish on the routes they
// started with.
type Router struct {
	opts   Options
	routes atomic.Pointer[[]*route]
}

type route struct {
	Route
	key string
	// mask is nil for a route without a key (or without Options.Mask).
	mask      Masker
	authName  string
	base      *url.URL
	protos    map[string]bool
	timeout   time.Duration
	transport *http.Transport
	client    *http.Client
}

// NewRouter validates cfg and resolves every route's key and CA now, so a
// missing key is a start-up error naming the route and the key's source.
func NewRouter(cfg Config, o Options) (*Router, error) {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.ReadFile == nil {
		o.ReadFile = os.ReadFile
	}
	if o.Dial == nil {
		o.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	r := &Router{opts: o}
	routes, err := r.build(cfg)
	if err != nil {
		return nil, err
	}
	r.routes.Store(&routes)
	return r, nil
}

// Swap replaces the routes (hot reload). On error the old routes stay.
func (r *Router) Swap(cfg Config) error {
	routes, err := r.build(cfg)
	if err != nil {
		return err
	}
	old := r.routes.Swap(&routes)
	for _, rt := range *old {
		// Connections still carrying a request are not idle and finish.
		rt.transport.CloseIdleConnections()
	}
	return nil
}

func (r *Router) build(cfg Config) ([]*route, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	out := make([]*route, 0, len(cfg.Routes))
	for _, c := range cfg.Routes {
		rt, err := r.buildRoute(c)
		if err != nil {
			return nil, fmt.Errorf("inference route %q: %w", c.Name, err)
		}
		out = append(out, rt)
	}
	return out, nil
}

func (r *Router) buildRoute(c Route) (*route, error) {
	rt := &route{Route: c, protos: map[string]bool{}, timeout: time.Duration(c.Timeout)}
	if rt.timeout == 0 {
		rt.timeout = DefaultTimeout
	}
	for _, p := range c.Protocols {
		rt.protos[p] = true
	}
	rt.base, _ = url.Parse(c.BaseURL)
	rt.authName, _ = authHeader(c)
	if !c.APIKey.IsZero() {
		var key string
		if c.APIKey.FromEnv != "" {
			key = r.opts.Getenv(c.APIKey.FromEnv)
		} else {
			b, err := r.opts.ReadFile(c.APIKey.FromFile)
			if err != nil {
				return nil, fmt.Errorf("api_key from %s: %w", c.APIKey, err)
			}
			key = string(b)
		}
		key = strings.TrimSpace(key)
		if key == "" {
			return nil, fmt.Errorf("api_key from %s is empty or unset", c.APIKey)
		}
		if strings.ContainsAny(key, "\r\n\x00") {
			return nil, fmt.Errorf("api_key from %s contains a line break", c.APIKey)
		}
		rt.key = key
		if r.opts.Mask != nil {
			m, err := r.opts.Mask(key)
			if err != nil {
				return nil, fmt.Errorf("api_key from %s cannot be kept out of the backend's answers (%w); a backend that checks no key needs no api_key", c.APIKey, err)
			}
			rt.mask = m
		}
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := r.opts.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca %s: no PEM certificate in it", c.CA)
		}
		tlsConf.RootCAs = pool
	}
	dial := r.opts.Dial
	rt.transport = &http.Transport{
		// Never an environment proxy: the backend is reached only the way
		// the supervisor dials.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err: err}
			}
			return conn, nil
		},
		TLSClientConfig:     tlsConf,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	rt.client = &http.Client{
		Transport: rt.transport,
		// A redirect could carry the key to another host.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return rt, nil
}

// dialError marks a failure to reach the backend at all (503), as opposed
// to a backend that answered wrongly (502).
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Detect maps method and path (query excluded) to a protocol, or "" for a
// request that is not an inference API call.
func Detect(method, path string) string {
	switch method {
	case http.MethodPost:
		switch path {
		case "/v1/chat/completions":
			return OpenAIChatCompletions
		case "/v1/completions":
			return OpenAICompletions
		case "/v1/responses":
			return OpenAIResponses
		case "/v1/messages":
			return AnthropicMessages
		case "/v1/embeddings":
			return OpenAIEmbeddings
		}
	case http.MethodGet:
		if path == "/v1/models" || (strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/")) {
			return ModelDiscovery
		}
	}
	return ""
}

// how a route serves a request
const (
	direct   = ""
	toOpenAI = "anthropic_to_openai"
	toClaude = "openai_to_anthropic"
)

func (rt *route) serves(protocol string) (how string, ok bool) {
	if rt.protos[protocol] {
		return direct, true
	}
	if rt.Translate {
		if protocol == AnthropicMessages && rt.protos[OpenAIChatCompletions] {
			return toOpenAI, true
		}
		if protocol == OpenAIChatCompletions && rt.protos[AnthropicMessages] {
			return toClaude, true
		}
	}
	return "", false
}

// httpError is an error answered by the router itself.
type httpError struct {
	status int
	typ    string
	msg    string
}

func pick(routes []*route, protocol, model string) (*route, string, *httpError) {
	if name, ok := strings.CutPrefix(model, "route:"); ok {
		for _, rt := range routes {
			if rt.Name == name {
				if how, ok := rt.serves(protocol); ok {
					return rt, how, nil
				}
				return nil, "", &httpError{http.StatusBadRequest, "no_compatible_route",
					fmt.Sprintf("route '%s' does not serve source protocol '%s'", name, protocol)}
			}
		}
		return nil, "", &httpError{http.StatusBadRequest, "route_not_found", fmt.Sprintf("no route configured for route '%s'", name)}
	}
	if model != "" {
		for _, rt := range routes {
			if rt.Model == model {
				if how, ok := rt.serves(protocol); ok {
					return rt, how, nil
				}
			}
		}
	}
	for _, rt := range routes {
		if rt.protos[protocol] {
			return rt, direct, nil
		}
	}
	for _, rt := range routes {
		if how, ok := rt.serves(protocol); ok {
			return rt, how, nil
		}
	}
	return nil, "", &httpError{http.StatusBadRequest, "no_compatible_route", fmt.Sprintf("no compatible route for source protocol '%s'", protocol)}
}

// recorder counts what reaches the client and when its first byte left.
// Once a route is picked it is also where the route's key is scrubbed
// from everything the client gets, whichever path wrote it.
type recorder struct {
	http.ResponseWriter
	start  time.Time
	status int
	n      int64
	ttfb   time.Duration
	rc     *http.ResponseController
	mask   Masker
	// scrubbed is reused from write to write.
	scrubbed []byte
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.mask != nil {
			w.mask.ScrubHeader(w.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write scrubs p as a whole. Every write is a unit the key cannot continue
// past: a whole body, one event of a stream, or a piece of a body that
// Masker.ScrubBody has already scrubbed as a stream. Scrubbing each event
// on its own is what lets an event stream flow event by event.
func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.ttfb == 0 && len(p) > 0 {
		w.ttfb = time.Since(w.start)
	}
	if w.mask != nil {
		// As long as p, so the count returned stays right.
		w.scrubbed = w.mask.Scrub(w.scrubbed[:0], p)
		p = w.scrubbed
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

func (w *recorder) flush() {
	// ErrNotSupported only means the writer buffers; nothing to do.
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(translate.ErrorBody(typ, msg))
}

// ServeHTTP answers one inference.local request. When a backend's stream
// breaks after the response has begun it panics with http.ErrAbortHandler,
// as httputil.ReverseProxy does, so the client sees a truncated response
// rather than a clean end.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	rw := &recorder{ResponseWriter: w, start: start}
	rw.rc = http.NewResponseController(w)
	rec := Record{Protocol: Detect(req.Method, req.URL.Path)}
	defer func() {
		rec.Status = rw.status
		rec.Duration = time.Since(start)
		rec.TTFB = rw.ttfb
		rec.BytesOut = rw.n
		if rw.mask != nil {
			rec.Err = rw.mask.Redact(rec.Err)
		}
		if r.opts.OnRequest != nil {
			r.opts.OnRequest(req.Context(), rec)
		}
	}()
	fail := func(e *httpError) {
		rec.Err = e.msg
		writeError(rw, e.status, e.typ, e.msg)
	}
	if rec.Protocol == "" {
		fail(&httpError{http.StatusForbidden, "forbidden", fmt.Sprintf(
			"%s %s is not an inference API call; inference.local answers POST /v1/chat/completions, /v1/completions, "+
				"/v1/responses, /v1/messages, /v1/embeddings and GET /v1/models", req.Method, req.URL.Path)})
		return
	}
	routes := *r.routes.Load()
	if len(routes) == 0 {
		fail(&httpError{http.StatusServiceUnavailable, "not_configured",
			"inference routing is not configured: add routes to the policy's inference: section " +
				"(routes: [{name, base_url, protocols, model, api_key: {from_env: NAME}}]) or start corral with --inference-routes FILE"})
		return
	}
	// The real writer, so net/http can close a connection whose body was cut off.
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxBodyBytes))
	rec.BytesIn = int64(len(body))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			fail(&httpError{http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes)})
			return
		}
		fail(&httpError{http.StatusBadRequest, "bad_request", "reading request body: " + err.Error()})
		return
	}
	if rec.Protocol == ModelDiscovery {
		rec.ClientModel = strings.TrimPrefix(req.URL.Path, "/v1/models/")
		if req.URL.Path == "/v1/models" {
			rec.ClientModel = ""
		}
		serveModels(rw, routes, req.URL.Path, fail)
		return
	}
	var spans [][2]int
	rec.ClientModel, spans = modelSpans(body)
	rt, how, herr := pick(routes, rec.Protocol, rec.ClientModel)
	if herr != nil {
		fail(herr)
		return
	}
	rec.Route = rt.Name
	rw.mask = rt.mask
	r.forward(rw, req, rt, how, body, spans, &rec, fail)
}

func (r *Router) forward(rw *recorder, req *http.Request, rt *route, how string, body []byte, spans [][2]int, rec *Record, fail func(*httpError)) {
	path, query := req.URL.Path, req.URL.RawQuery
	var includeUsage bool
	var err error
	switch how {
	case toOpenAI:
		body, _, err = translate.AnthropicToOpenAIRequest(body)
		path, query = "/v1/chat/completions", ""
	case toClaude:
		body, _, includeUsage, err = translate.OpenAIToAnthropicRequest(body)
		path, query = "/v1/messages", ""
	}
	if err != nil {
		fail(&httpError{http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("route '%s': %v", rt.Name, err)})
		return
	}
	rec.RoutedModel = rec.ClientModel
	if how != direct {
		rec.RoutedModel, spans = modelSpans(body)
	}
	if rt.Model != "" && len(spans) > 0 {
		body = rewriteModel(body, spans, rt.Model)
		rec.RoutedModel = rt.Model
	}

	ctx, cancel := context.WithTimeout(req.Context(), rt.timeout)
	defer cancel()
	var rd io.Reader
	if req.Method == http.MethodPost {
		rd = bytes.NewReader(body)
	}
	up, err := http.NewRequestWithContext(ctx, req.Method, upstreamURL(rt.base, path, query), rd)
	if err != nil {
		fail(&httpError{http.StatusBadGateway, "upstream_protocol_error", fmt.Sprintf("route '%s': building request: %v", rt.Name, err)})
		return
	}
	up.Header = forwardHeaders(req.Header, rt, how)
	resp, err := rt.client.Do(up)
	if err != nil {
		switch {
		case req.Context().Err() != nil:
			rec.Err = "client went away before the backend answered"
			rw.status = 499
		case errors.Is(err, context.DeadlineExceeded):
			fail(&httpError{http.StatusServiceUnavailable, "upstream_unavailable",
				fmt.Sprintf("route '%s': backend did not answer within %s", rt.Name, rt.timeout)})
		case isUnreachable(err):
			fail(&httpError{http.StatusServiceUnavailable, "upstream_unavailable",
				fmt.Sprintf("route '%s': backend unreachable: %v", rt.Name, err)})
		default:
			fail(&httpError{http.StatusBadGateway, "upstream_protocol_error",
				fmt.Sprintf("route '%s': backend protocol error: %v", rt.Name, err)})
		}
		return
	}
	if rt.mask != nil {
		// Compressed, the key would pass the scrubber unseen. The
		// transport undoes only the gzip it asked for; a backend may
		// send another coding unasked.
		if err := rt.mask.DecodeResponse(resp); err != nil {
			fail(&httpError{http.StatusBadGateway, "upstream_protocol_error",
				fmt.Sprintf("route '%s': %v; it could hold the route's key, so it is not passed on", rt.Name, err)})
			return
		}
	}
	defer resp.Body.Close()

	if resp.StatusCode >= 400 {
		r.backendError(rw, resp, rt, how, rec)
		return
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	h := rw.Header()
	copyHeaders(h, resp.Header)
	var u usage
	defer func() { rec.InputTokens, rec.OutputTokens = u.in, u.out }()
	switch {
	case sse:
		var tr translate.Stream
		switch how {
		case toOpenAI:
			tr = translate.NewOpenAIToAnthropicStream()
		case toClaude:
			tr = translate.NewAnthropicToOpenAIStream(includeUsage)
		}
		if tr != nil {
			h.Del("Content-Length")
		}
		rw.WriteHeader(resp.StatusCode)
		rw.flush()
		r.stream(req.Context(), rw, resp.Body, tr, &u, rec)
	case how != direct:
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxTranslatedResponse+1))
		if err == nil && len(data) > maxTranslatedResponse {
			err = errors.New("answer too large to translate")
		}
		if err != nil {
			h.Del("Content-Type")
			fail(&httpError{http.StatusBadGateway, "upstream_protocol_error", fmt.Sprintf("route '%s': reading answer: %v", rt.Name, err)})
			return
		}
		u.observe(data)
		if how == toOpenAI {
			data, err = translate.OpenAIToAnthropicResponse(data)
		} else {
			data, err = translate.AnthropicToOpenAIResponse(data)
		}
		if err != nil {
			fail(&httpError{http.StatusBadGateway, "upstream_protocol_error", fmt.Sprintf("route '%s': %v", rt.Name, err)})
			return
		}
		h.Set("Content-Type", "application/json")
		h.Del("Content-Length")
		rw.WriteHeader(resp.StatusCode)
		_, _ = rw.Write(data)
	default:
		rw.WriteHeader(resp.StatusCode)
		scan := strings.Contains(resp.Header.Get("Content-Type"), "json")
		if err := copyFlushing(rw, rt.scrubbed(resp.Body), scan, &u); err != nil {
			rec.Err = err.Error()
			if req.Context().Err() == nil {
				panic(http.ErrAbortHandler)
			}
		}
	}
}

// stream relays an event stream one event at a time, translating each if
// tr is set, flushing after each so the client's first token arrives when
// the backend's does.
func (r *Router) stream(clientCtx context.Context, rw *recorder, body io.Reader, tr translate.Stream, u *usage, rec *Record) {
	rd := translate.NewSSEReader(body)
	unflushed := false
	for {
		ev, err := rd.Next()
		// An event cut off by a broken stream is not passed on: it may end
		// in a piece of the key, which no scrubber can recognise, and an
		// event-stream client discards an unfinished event anyway.
		if err == nil {
			if bytes.Contains(ev.Data, []byte(`"usage"`)) {
				u.observe(ev.Data)
			}
			out := ev.Raw
			if tr != nil {
				var terr error
				if out, terr = tr.Event(ev); terr != nil {
					err = terr
				}
			}
			if len(out) > 0 {
				if _, werr := rw.Write(out); werr != nil {
					rec.Err = "client went away mid-stream"
					return
				}
				unflushed = true
			}
			// Flush before the next read could block; when the next event
			// is already here, both go out in one write.
			if unflushed && !rd.Pending() {
				rw.flush()
				unflushed = false
			}
		}
		if errors.Is(err, io.EOF) {
			if tr != nil {
				if out := tr.End(false); len(out) > 0 {
					_, _ = rw.Write(out)
					rw.flush()
				}
			}
			return
		}
		if err != nil {
			if clientCtx.Err() != nil {
				rec.Err = "client went away mid-stream"
				return
			}
			rec.Err = "backend stream broke: " + err.Error()
			if tr != nil {
				// A translated stream can say so in the client's protocol.
				_, _ = rw.Write(tr.End(true))
				rw.flush()
				return
			}
			panic(http.ErrAbortHandler)
		}
	}
}

var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func copyFlushing(rw *recorder, body io.Reader, scan bool, u *usage) error {
	var kept bytes.Buffer
	bp := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(bp)
	buf := bp[:]
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if scan && kept.Len()+n <= maxUsageScan {
				kept.Write(buf[:n])
			}
			if _, werr := rw.Write(buf[:n]); werr != nil {
				return fmt.Errorf("client went away: %w", werr)
			}
			if err == nil {
				// At the end the handler's return flushes anyway.
				rw.flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if scan {
				u.observe(kept.Bytes())
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("backend answer broke: %w", err)
		}
	}
}

func (r *Router) backendError(rw *recorder, resp *http.Response, rt *route, how string, rec *Record) {
	// Scrubbed before it is cut short: a key cut in two is no longer
	// recognisable, and its first part would get through.
	data, _ := io.ReadAll(io.LimitReader(rt.scrubbed(resp.Body), maxErrorBody))
	rec.Err = fmt.Sprintf("backend answered %d", resp.StatusCode)
	if how != direct {
		msg := translate.BackendErrorMessage(data)
		if msg == "" {
			msg = fmt.Sprintf("backend answered %d", resp.StatusCode)
		}
		typ := "api_error"
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			typ = "authentication_error"
		case http.StatusTooManyRequests:
			typ = "rate_limit_error"
		case http.StatusBadRequest:
			typ = "invalid_request_error"
		}
		writeError(rw, resp.StatusCode, typ, msg)
		return
	}
	copyHeaders(rw.Header(), resp.Header)
	rw.Header().Del("Content-Length")
	rw.WriteHeader(resp.StatusCode)
	_, _ = rw.Write(data)
}

func isUnreachable(err error) bool {
	var de *dialError
	var dns *net.DNSError
	return errors.As(err, &de) || errors.As(err, &dns)
}

// scrubbed is body with the route's key scrubbed as it streams, for a
// body relayed in pieces whose boundaries could cut the key in two.
func (rt *route) scrubbed(body io.ReadCloser) io.ReadCloser {
	if rt.mask == nil {
		return body
	}
	return rt.mask.ScrubBody(body)
}

func upstreamURL(base *url.URL, path, query string) string {
	u := *base
	bp := strings.TrimSuffix(u.Path, "/")
	// base_url is usually written as clients write it: OpenAI's with /v1,
	// Anthropic's without; either way the path is not doubled.
	if strings.HasSuffix(bp, "/v1") {
		path = strings.TrimPrefix(path, "/v1")
	}
	u.Path = bp + path
	u.RawPath = ""
	u.RawQuery = query
	return u.String()
}

// hopByHop are connection-level headers (RFC 9110 section 7.6.1) plus
// those the router or the transport sets itself.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Host": true, "Content-Length": true,
}

// connectionTokens are the headers a Connection header names as
// hop-by-hop (nil, allocating nothing, when there is none).
func connectionTokens(h http.Header) map[string]bool {
	var drop map[string]bool
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if drop == nil {
				drop = map[string]bool{}
			}
			drop[http.CanonicalHeaderKey(strings.TrimSpace(tok))] = true
		}
	}
	return drop
}

func forwardHeaders(in http.Header, rt *route, how string) http.Header {
	drop := connectionTokens(in)
	out := make(http.Header, len(in))
	for k, vs := range in {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case hopByHop[ck], drop[ck], strings.HasPrefix(ck, "Proxy-"), isCredentialHeader(ck), ck == rt.authName,
			// The transport asks for and undoes compression itself, so
			// usage can be read from the answer.
			ck == "Accept-Encoding",
			// The body has been read whole already.
			ck == "Expect",
			how == toOpenAI && strings.HasPrefix(ck, "Anthropic-"):
			continue
		}
		out[ck] = append([]string(nil), vs...)
	}
	for k, v := range rt.Headers {
		out.Set(k, v)
	}
	if how != direct {
		out.Set("Content-Type", "application/json")
	}
	if how == toClaude && out.Get("Anthropic-Version") == "" {
		out.Set("Anthropic-Version", "2023-06-01")
	}
	if rt.key != "" {
		if rt.authName == "Authorization" {
			out.Set("Authorization", "Bearer "+rt.key)
		} else {
			out.Set(rt.authName, rt.key)
		}
	}
	return out
}

func copyHeaders(dst, src http.Header) {
	drop := connectionTokens(src)
	for k, vs := range src {
		if hopByHop[k] || drop[k] || strings.HasPrefix(k, "Proxy-") {
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
}

func serveModels(rw *recorder, routes []*route, path string, fail func(*httpError)) {
	var data []map[string]any
	seen := map[string]bool{}
	for _, rt := range routes {
		id := rt.Model
		if id == "" {
			id = "route:" + rt.Name
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		// Both SDKs' model shapes in one object.
		data = append(data, map[string]any{"id": id, "object": "model", "type": "model", "created": 0,
			"created_at": "1970-01-01T00:00:00Z", "owned_by": "corral:" + rt.Name, "display_name": id})
	}
	var v any
	if want, ok := strings.CutPrefix(path, "/v1/models/"); ok {
		for _, m := range data {
			if m["id"] == want {
				v = m
			}
		}
		if v == nil {
			fail(&httpError{http.StatusNotFound, "not_found_error", fmt.Sprintf("no route serves model '%s'", want)})
			return
		}
	} else {
		list := map[string]any{"object": "list", "data": data, "has_more": false}
		if len(data) > 0 {
			list["first_id"], list["last_id"] = data[0]["id"], data[len(data)-1]["id"]
		}
		v = list
	}
	b, _ := json.Marshal(v)
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusOK)
	_, _ = rw.Write(b)
}
