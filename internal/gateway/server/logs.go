package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/hub"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

type logService struct{ s *Server }

// storeQuery checks a query and converts it; it also returns a matcher
// for live entries that applies the same filters.
func storeQuery(q *gatewayv1.LogQuery) (store.LogQuery, func(store.LogEntry) bool, error) {
	if q.SandboxId == "" && !q.All {
		return store.LogQuery{}, nil, invalid("name a sandbox, or ask for all")
	}
	if q.SandboxId != "" && q.All {
		return store.LogQuery{}, nil, invalid("name a sandbox or ask for all, not both")
	}
	min := 0
	if q.MinLevel != "" {
		var ok bool
		if min, ok = levels[q.MinLevel]; !ok {
			return store.LogQuery{}, nil, invalid("min_level %q: want debug, info, warn or error", q.MinLevel)
		}
	}
	if q.Limit < 0 {
		return store.LogQuery{}, nil, invalid("limit must not be negative")
	}
	sq := store.LogQuery{
		SandboxID: q.SandboxId,
		AfterSeq:  q.AfterSeq,
		Event:     q.Event,
		MinLevel:  q.MinLevel,
		Limit:     int(q.Limit),
	}
	if q.Since != nil {
		sq.Since = q.Since.AsTime()
	}
	match := func(e store.LogEntry) bool {
		return (sq.SandboxID == "" || e.SandboxID == sq.SandboxID) &&
			(sq.Event == "" || e.Event == sq.Event) &&
			levels[e.Level] >= min &&
			(sq.Since.IsZero() || !e.Time.Before(sq.Since)) &&
			e.Seq > sq.AfterSeq
	}
	return sq, match, nil
}

func (h *logService) Query(ctx context.Context, req *connect.Request[gatewayv1.LogQuery]) (*connect.Response[gatewayv1.QueryLogsResponse], error) {
	sq, _, err := storeQuery(req.Msg)
	if err != nil {
		return nil, err
	}
	if sq.SandboxID != "" {
		if _, err := h.s.store.GetSandbox(ctx, sq.SandboxID); err != nil {
			return nil, storeErr("sandbox "+sq.SandboxID, err)
		}
	}
	entries, err := h.s.store.QueryLogs(ctx, sq)
	if err != nil {
		return nil, storeErr("query logs", err)
	}
	out := &gatewayv1.QueryLogsResponse{}
	for _, e := range entries {
		out.Entries = append(out.Entries, logProto(e))
	}
	h.s.ingest.Lock()
	if sq.SandboxID != "" {
		out.Dropped = h.s.dropped[sq.SandboxID]
	} else {
		for _, n := range h.s.dropped {
			out.Dropped += n
		}
	}
	h.s.ingest.Unlock()
	return connect.NewResponse(out), nil
}

// followPage is how many stored entries Follow reads at a time.
const followPage = 1000

func (h *logService) Follow(ctx context.Context, req *connect.Request[gatewayv1.LogQuery], stream *connect.ServerStream[gatewayv1.LogEntry]) error {
	sq, match, err := storeQuery(req.Msg)
	if err != nil {
		return err
	}
	if sq.SandboxID != "" {
		if _, err := h.s.store.GetSandbox(ctx, sq.SandboxID); err != nil {
			return storeErr("sandbox "+sq.SandboxID, err)
		}
	}
	sendHeaders(ctx)
	last := sq.AfterSeq
	send := func(e store.LogEntry) error {
		if e.Seq <= last {
			return nil
		}
		last = e.Seq
		if !match(e) {
			return nil
		}
		return stream.Send(logProto(e))
	}
	for {
		// Subscribe before catching up; entries seen in both are
		// skipped by their sequence number.
		sub := h.s.logs.Subscribe(streamBuffer, match)
		err := h.catchUp(ctx, sq, &last, send)
		if err == nil {
			err = h.live(ctx, sub, send)
		}
		sub.Close()
		if !errors.Is(err, errLagged) {
			return err
		}
	}
}

var errLagged = errors.New("follower fell behind")

// catchUp sends what is stored after *last: from the sandbox's in-memory
// tail when it reaches back that far, else from the store page by page.
func (h *logService) catchUp(ctx context.Context, sq store.LogQuery, last *int64, send func(store.LogEntry) error) error {
	if sq.SandboxID != "" && *last > 0 {
		// The tail holds every entry of the sandbox from its first one
		// on, so it covers the gap when that is not newer than *last.
		if t := h.s.tail.Get(sq.SandboxID); len(t) > 0 && t[0].Seq <= *last {
			for _, e := range t {
				if err := send(e); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for {
		q := sq
		q.AfterSeq, q.Limit = *last, followPage
		page, err := h.s.store.QueryLogs(ctx, q)
		if err != nil {
			return storeErr("query logs", err)
		}
		for _, e := range page {
			if err := send(e); err != nil {
				return err
			}
		}
		if len(page) < followPage {
			return nil
		}
	}
}

// live sends entries as the hub delivers them until the stream ends or
// the hub cuts the follower off.
func (h *logService) live(ctx context.Context, sub *hub.Sub[store.LogEntry], send func(store.LogEntry) error) error {
	for {
		select {
		case <-ctx.Done():
			return streamEnded(ctx)
		case e, ok := <-sub.C:
			if !ok {
				return errLagged
			}
			if err := send(e); err != nil {
				return err
			}
		}
	}
}
