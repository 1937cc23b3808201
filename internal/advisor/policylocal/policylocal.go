// Package policylocal answers http://policy.local/ inside a sandbox: the
// agent's read-only view of its policy, its denials and the advisor's
// drafts, an advisory check, and the one thing it may ask for — a
// proposal, validated like the advisor's own and never applied until a
// person approves it. Every answer comes from the supervisor; nothing is
// forwarded. Requests are rate-limited per sandbox, proposals more
// tightly.
package policylocal

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/advisor/check"
	"github.com/corral-sandbox/corral/internal/advisor/drafts"
	"github.com/corral-sandbox/corral/internal/advisor/service"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

// Host is the name the handler answers inside the sandbox.
const Host = "policy.local"

// SkillPath is where the skill file is inside the sandbox.
const SkillPath = "/run/corral/skills/policy-advisor.md"

// Skill is the agent's guide to the deny → inspect → propose → wait loop.
//
//go:embed skill.md
var Skill []byte

// Limits.
const (
	// RequestsPerSec and RequestBurst bound all requests of a sandbox.
	RequestsPerSec = 10
	RequestBurst   = 20
	// ProposalsPerMin bounds proposals (burst of the same size).
	ProposalsPerMin = 5
	// MaxBody bounds a request body.
	MaxBody = 64 << 10
	// MaxWait bounds one long-poll; the agent asks again.
	MaxWait = 5 * time.Minute
)

// Handler serves policy.local for one sandbox.
type Handler struct {
	Advisor *service.Service
	Policy  *reload.Reloader
	// Identify returns the connection's request (the caller's binary and
	// pid) for a request served through the egress (egress.RequestFrom);
	// nil or false leaves the caller unknown.
	Identify func(ctx context.Context) (egress.Request, bool)
	// Now is time.Now when nil.
	Now func() time.Time

	once      sync.Once
	mux       *http.ServeMux
	requests  *bucket
	proposals *bucket
}

var _ http.Handler = (*Handler)(nil)

func (h *Handler) init() {
	h.once.Do(func() {
		now := h.Now
		if now == nil {
			now = time.Now
		}
		h.requests = newBucket(RequestBurst, RequestsPerSec, now)
		h.proposals = newBucket(ProposalsPerMin, ProposalsPerMin/60.0, now)
		m := http.NewServeMux()
		m.HandleFunc("GET /v1/policy/current", h.current)
		m.HandleFunc("GET /v1/denials", h.denials)
		m.HandleFunc("GET /v1/drafts", h.drafts)
		m.HandleFunc("POST /v1/check", h.check)
		m.HandleFunc("POST /v1/proposals", h.propose)
		m.HandleFunc("GET /v1/proposals/{id}/wait", h.wait)
		m.HandleFunc("GET /v1/skill", h.skill)
		m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fail(w, http.StatusNotFound, "no such endpoint; GET /v1/skill describes them")
		})
		h.mux = m
	})
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.init()
	w.Header().Set("Cache-Control", "no-store")
	if !h.requests.take() {
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusTooManyRequests, fmt.Sprintf("policy.local answers at most %d requests a second per sandbox", RequestsPerSec))
		return
	}
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) caller(r *http.Request) (binary string) {
	if h.Identify == nil {
		return ""
	}
	if req, ok := h.Identify(r.Context()); ok {
		return req.Identity.Binary
	}
	return ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func fail(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// SecretView is a secret as the agent may see it: by name, with where it
// is used, never where its value comes from.
type SecretView struct {
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers,omitempty"`
}

func (h *Handler) current(w http.ResponseWriter, _ *http.Request) {
	snap := h.Policy.Current()
	p := snap.Policy.Policy
	secrets := map[string]SecretView{}
	for name, s := range p.Secrets {
		secrets[name] = SecretView{Hosts: s.Hosts, Headers: s.Headers}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"version":          snap.Version,
		"sha256":           snap.Policy.SHA256,
		"network":          p.Network,
		"network_policies": p.NetworkPolicies,
		"secrets":          secrets,
	})
}

// Denial is one aggregated denial as the agent and corral draft show it.
type Denial struct {
	Host       string    `json:"host"`
	Port       uint16    `json:"port,omitempty"`
	Binary     string    `json:"binary,omitempty"`
	Count      uint64    `json:"count"`
	FirstSeen  time.Time `json:"first_seen"`
	LastSeen   time.Time `json:"last_seen"`
	Reason     string    `json:"reason,omitempty"`
	Cmdline    string    `json:"cmdline,omitempty"`
	Requests   uint64    `json:"requests,omitempty"`
	DraftChunk string    `json:"draft_chunk,omitempty"`
}

// DenialOf converts an aggregate entry.
func DenialOf(e aggregate.Entry) Denial {
	return Denial{Host: e.Host, Port: e.Port, Binary: e.Binary, Count: e.Count, FirstSeen: e.FirstSeen, LastSeen: e.LastSeen,
		Reason: e.Reason, Cmdline: e.Cmdline, Requests: e.Requests}
}

func (h *Handler) denials(w http.ResponseWriter, r *http.Request) {
	n := 20
	if v := r.URL.Query().Get("last"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			fail(w, http.StatusBadRequest, "last: want a positive number")
			return
		}
	}
	var out []Denial
	for _, e := range h.Advisor.Denials(min(n, aggregate.DefaultMaxKeys)) {
		d := DenialOf(e)
		d.DraftChunk, _ = h.Advisor.For(egress.Request{Host: e.Host, Port: e.Port, Identity: egress.Identity{Binary: e.Binary}})
		out = append(out, d)
	}
	writeJSON(w, http.StatusOK, map[string]any{"denials": out})
}

// DraftView is a draft as the agent sees it.
type DraftView struct {
	ID            string        `json:"id"`
	State         drafts.State  `json:"state"`
	Author        string        `json:"author"`
	Stage         int           `json:"stage"`
	Addition      string        `json:"addition"`
	Rationale     string        `json:"rationale"`
	SecurityNotes []string      `json:"security_notes,omitempty"`
	Verdict       check.Verdict `json:"verdict"`
	Allows        string        `json:"allows"`
	Expires       time.Time     `json:"expires,omitzero"`
	Guidance      string        `json:"guidance,omitempty"`
	LoadedVersion int           `json:"loaded_version,omitempty"`
	Approve       string        `json:"approve,omitempty"`
}

// View converts a draft.
func View(d drafts.Draft) DraftView {
	y, _ := d.Chunk.YAML()
	v := DraftView{ID: d.ID, State: d.State, Author: d.Chunk.Author, Stage: int(d.Chunk.Stage), Addition: string(y),
		Rationale: d.Chunk.Rationale, SecurityNotes: d.Chunk.SecurityNotes, Verdict: d.Check.Verdict,
		Allows: d.Check.Summary.String(), Guidance: d.Guidance}
	if d.State == drafts.Pending {
		v.Expires = d.Expires
		v.Approve = "a person runs: corral draft approve " + d.ID
	}
	if d.Loaded != nil {
		v.LoadedVersion = d.Loaded.Version
	}
	return v
}

func (h *Handler) drafts(w http.ResponseWriter, r *http.Request) {
	list, err := h.Advisor.Store().List()
	if err != nil {
		fail(w, http.StatusInternalServerError, err.Error())
		return
	}
	all := r.URL.Query().Get("all") != ""
	out := []DraftView{}
	for _, d := range list {
		if all || d.State == drafts.Pending {
			out = append(out, View(d))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"drafts": out})
}

// ProposalBody is what /v1/check and /v1/proposals read: the addition in
// the policy file's own shape (YAML or JSON text, or a JSON object) and
// the agent's reason for it.
type ProposalBody struct {
	// Addition is `network_policies: {NAME: {...}}`.
	Addition json.RawMessage `json:"addition"`
	Intent   string          `json:"intent"`
}

// readProposal reads a proposal body and its addition, answering the
// request itself when either is malformed.
func readProposal(w http.ResponseWriter, r *http.Request) (ProposalBody, map[string]policy.NetworkPolicy, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", MaxBody))
		return ProposalBody{}, nil, false
	}
	var p ProposalBody
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		fail(w, http.StatusBadRequest, `want {"addition": "network_policies: ...", "intent": "why"}: `+err.Error())
		return p, nil, false
	}
	raw := []byte(p.Addition)
	var text string
	if json.Unmarshal(p.Addition, &text) == nil {
		raw = []byte(text)
	}
	add, err := check.ParseAddition(raw)
	if err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, CheckView{Verdict: check.Invalid, Reason: err.Error()})
		return p, nil, false
	}
	return p, add, true
}

// CheckView is a check's outcome as the agent sees it.
type CheckView struct {
	Verdict check.Verdict `json:"verdict"`
	Reason  string        `json:"reason,omitempty"`
	Flags   []string      `json:"flags,omitempty"`
	Allows  string        `json:"allows,omitempty"`
}

func viewCheck(res check.Result) CheckView {
	v := CheckView{Verdict: res.Verdict, Reason: res.Reason, Flags: res.Flags}
	if res.Verdict != check.Invalid {
		v.Allows = res.Summary.String()
	}
	return v
}

func (h *Handler) check(w http.ResponseWriter, r *http.Request) {
	_, add, ok := readProposal(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, viewCheck(h.Advisor.Check(r.Context(), add, h.caller(r))))
}

func (h *Handler) propose(w http.ResponseWriter, r *http.Request) {
	if !h.proposals.take() {
		w.Header().Set("Retry-After", "60")
		fail(w, http.StatusTooManyRequests, fmt.Sprintf("at most %d proposals a minute per sandbox", ProposalsPerMin))
		return
	}
	p, add, ok := readProposal(w, r)
	if !ok {
		return
	}
	d, res, err := h.Advisor.Propose(r.Context(), add, p.Intent, h.caller(r))
	switch {
	case res.Verdict == check.Invalid:
		writeJSON(w, http.StatusUnprocessableEntity, viewCheck(res))
		return
	case errors.Is(err, drafts.ErrDuplicate):
		writeJSON(w, http.StatusOK, map[string]any{"draft": View(d), "wait": waitPath(d.ID), "note": "the same chunk is already pending or approved"})
		return
	case err != nil:
		fail(w, http.StatusConflict, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"draft": View(d), "check": viewCheck(res), "wait": waitPath(d.ID)})
}

func waitPath(id string) string { return "http://" + Host + "/v1/proposals/" + id + "/wait" }

// wait long-polls until the draft is approved and loaded, or will never
// be; ?timeout= (a Go duration, at most MaxWait) bounds it, after which
// the draft is returned still pending with 202.
func (h *Handler) wait(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout := time.Minute
	if v := r.URL.Query().Get("timeout"); v != "" {
		var err error
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			fail(w, http.StatusBadRequest, "timeout: want a duration such as 60s")
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), min(timeout, MaxWait))
	defer cancel()
	d, err := h.Advisor.Store().Wait(ctx, id)
	switch {
	case errors.Is(err, drafts.ErrNotFound):
		fail(w, http.StatusNotFound, err.Error())
	case err != nil && ctx.Err() != nil:
		writeJSON(w, http.StatusAccepted, map[string]any{"draft": View(d), "done": false})
	case err != nil:
		fail(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, map[string]any{"draft": View(d), "done": true,
			"approved": d.State == drafts.Approved && d.Loaded != nil})
	}
}

func (h *Handler) skill(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
	w.Write(Skill)
}

// bucket is a token bucket.
type bucket struct {
	mu     sync.Mutex
	tokens float64
	burst  float64
	perSec float64
	last   time.Time
	now    func() time.Time
}

func newBucket(burst int, perSec float64, now func() time.Time) *bucket {
	return &bucket{tokens: float64(burst), burst: float64(burst), perSec: perSec, now: now, last: now()}
}

func (b *bucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.perSec)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
