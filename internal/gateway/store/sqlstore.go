package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// defaultLogLimit is how many entries QueryLogs returns when the query does
// not say.
const defaultLogLimit = 1000

// levels in increasing severity; MinLevel selects a suffix of this list.
var levels = []string{"debug", "info", "warn", "error"}

// conn is the part of a database handle the shared queries use. Queries are
// written with ? placeholders; each backend adapts its driver to this.
type conn interface {
	exec(ctx context.Context, q string, args ...any) (int64, error)
	query(ctx context.Context, q string, args ...any) (rows, error)
	queryRow(ctx context.Context, q string, args ...any) row
}

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type row interface {
	Scan(dest ...any) error
}

// backend is what differs between SQLite and PostgreSQL.
type backend interface {
	// read is for statements that change nothing; it never waits behind a
	// writer.
	read() conn
	// write runs fn in one transaction, committed when fn returns nil.
	write(ctx context.Context, fn func(tx conn) error) error
	// timeArg encodes t as a query argument; the zero time is NULL.
	timeArg(t time.Time) any
	// appendLogs stores the entries in one transaction, in order, and sets
	// their Seq so that Seq order is commit order.
	appendLogs(ctx context.Context, entries []LogEntry) error
	// lockSandboxNames makes the rest of tx the only writer of sandbox
	// names until it ends, so a name checked free stays free until the
	// insert (SQLite's writers are one at a time already).
	lockSandboxNames(ctx context.Context, tx conn) error
	// constraint maps a driver's constraint violation to ErrExists (a
	// duplicate key) or ErrNotFound (a missing referenced row), else nil.
	constraint(err error) error
	close() error
}

// sqlStore implements Store on either backend with the same statements.
type sqlStore struct {
	b backend
}

var _ Store = (*sqlStore)(nil)

// now is the store's clock for the times it sets, at the precision both
// backends keep, so a value returned equals the value read back.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// orNow returns t in UTC, or the current time when t is zero.
func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return now()
	}
	return t.UTC()
}

// dbTime scans a time column: SQLite keeps microseconds since the epoch,
// PostgreSQL a timestamptz; NULL is the zero time.
type dbTime struct{ t *time.Time }

func (d dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d.t = time.Time{}
	case int64:
		*d.t = time.UnixMicro(v).UTC()
	case time.Time:
		*d.t = v.UTC()
	default:
		return fmt.Errorf("time column holds %T", src)
	}
	return nil
}

// nullStr stores "" as NULL, for optional references.
func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nonNil keeps an empty byte slice from being stored as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// fail wraps err with what was being done, adding ErrExists or ErrNotFound
// when the database refused a duplicate or a missing reference.
func (s *sqlStore) fail(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	if c := s.b.constraint(err); c != nil {
		return fmt.Errorf("%s: %w: %w", what, c, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func validPhase(p Phase) bool {
	switch p {
	case PhaseProvisioning, PhaseReady, PhaseExited, PhaseFailed:
		return true
	}
	return false
}

const sandboxCols = `id, name, labels, command, workdir, env, driver, driver_ref, phase, exit_code, reason, created_at, updated_at`

func (s *sqlStore) CreateSandbox(ctx context.Context, sb Sandbox) error {
	if sb.ID == "" {
		return errors.New("create sandbox: empty id")
	}
	if sb.Phase == "" {
		sb.Phase = PhaseProvisioning
	}
	if !validPhase(sb.Phase) {
		return fmt.Errorf("create sandbox %q: unknown phase %q", sb.ID, sb.Phase)
	}
	labels, err := json.Marshal(sb.Labels)
	if err != nil {
		return fmt.Errorf("create sandbox %q: labels: %w", sb.ID, err)
	}
	command, err := json.Marshal(sb.Command)
	if err != nil {
		return fmt.Errorf("create sandbox %q: command: %w", sb.ID, err)
	}
	env, err := json.Marshal(sb.Env)
	if err != nil {
		return fmt.Errorf("create sandbox %q: env: %w", sb.ID, err)
	}
	created := orNow(sb.CreatedAt)
	updated := created
	if !sb.UpdatedAt.IsZero() {
		updated = sb.UpdatedAt.UTC()
	}
	var exit any
	if sb.ExitCode != nil {
		exit = int64(*sb.ExitCode)
	}
	err = s.b.write(ctx, func(tx conn) error {
		// A name names one sandbox: one that joined must not pass for
		// another in listings. Empty names may repeat.
		if sb.Name != "" {
			if err := s.b.lockSandboxNames(ctx, tx); err != nil {
				return err
			}
			var holder string
			err := tx.queryRow(ctx, `SELECT id FROM sandboxes WHERE name = ?`, sb.Name).Scan(&holder)
			if err == nil {
				return fmt.Errorf("%w: sandbox %s is named %q; delete it or choose another name", ErrExists, holder, sb.Name)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		_, err := tx.exec(ctx, `INSERT INTO sandboxes (`+sandboxCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.Name, string(labels), string(command), sb.Workdir, string(env), sb.Driver, sb.DriverRef,
			string(sb.Phase), exit, sb.Reason, s.b.timeArg(created), s.b.timeArg(updated))
		return err
	})
	if err != nil {
		return s.fail(err, "create sandbox %q", sb.ID)
	}
	return nil
}

func scanSandbox(r interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	var labels, command, env, phase string
	var exit sql.NullInt64
	err := r.Scan(&sb.ID, &sb.Name, &labels, &command, &sb.Workdir, &env, &sb.Driver, &sb.DriverRef,
		&phase, &exit, &sb.Reason, dbTime{&sb.CreatedAt}, dbTime{&sb.UpdatedAt})
	if err != nil {
		return Sandbox{}, err
	}
	sb.Phase = Phase(phase)
	if exit.Valid {
		code := int(exit.Int64)
		sb.ExitCode = &code
	}
	if err := json.Unmarshal([]byte(labels), &sb.Labels); err != nil {
		return Sandbox{}, fmt.Errorf("labels: %w", err)
	}
	if err := json.Unmarshal([]byte(command), &sb.Command); err != nil {
		return Sandbox{}, fmt.Errorf("command: %w", err)
	}
	if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
		return Sandbox{}, fmt.Errorf("env: %w", err)
	}
	return sb, nil
}

func (s *sqlStore) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.b.read().queryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if err != nil {
		return Sandbox{}, s.fail(err, "get sandbox %q", id)
	}
	return sb, nil
}

func (s *sqlStore) ListSandboxes(ctx context.Context, selector map[string]string) ([]Sandbox, error) {
	rs, err := s.b.read().query(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at, id`)
	if err != nil {
		return nil, s.fail(err, "list sandboxes")
	}
	defer rs.Close()
	var out []Sandbox
	for rs.Next() {
		sb, err := scanSandbox(rs)
		if err != nil {
			return nil, s.fail(err, "list sandboxes")
		}
		if matches(sb.Labels, selector) {
			out = append(out, sb)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "list sandboxes")
	}
	return out, nil
}

// matches reports whether labels include every pair of selector.
func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// update runs one UPDATE or DELETE and turns "no row changed" into
// ErrNotFound.
func (s *sqlStore) update(ctx context.Context, what string, q string, args ...any) error {
	var n int64
	err := s.b.write(ctx, func(tx conn) error {
		var err error
		n, err = tx.exec(ctx, q, args...)
		return err
	})
	if err != nil {
		return s.fail(err, "%s", what)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return nil
}

func (s *sqlStore) SetPhase(ctx context.Context, id string, phase Phase, exitCode *int, reason string) error {
	if !validPhase(phase) {
		return fmt.Errorf("set phase of sandbox %q: unknown phase %q", id, phase)
	}
	var exit any
	if exitCode != nil {
		exit = int64(*exitCode)
	}
	return s.update(ctx, fmt.Sprintf("set phase of sandbox %q", id),
		`UPDATE sandboxes SET phase = ?, exit_code = ?, reason = ?, updated_at = ? WHERE id = ?`,
		string(phase), exit, reason, s.b.timeArg(now()), id)
}

func (s *sqlStore) SetDriverRef(ctx context.Context, id, ref string) error {
	return s.update(ctx, fmt.Sprintf("set driver ref of sandbox %q", id),
		`UPDATE sandboxes SET driver_ref = ?, updated_at = ? WHERE id = ?`, ref, s.b.timeArg(now()), id)
}

func (s *sqlStore) DeleteSandbox(ctx context.Context, id string) error {
	// Policies, logs and tokens go with it by ON DELETE CASCADE.
	return s.update(ctx, fmt.Sprintf("delete sandbox %q", id), `DELETE FROM sandboxes WHERE id = ?`, id)
}

const policyCols = `sandbox_id, version, yaml, sha256, author, created_at, status, error, status_at`

func (s *sqlStore) AddPolicy(ctx context.Context, sandboxID string, yaml []byte, sha256, author string) (PolicyVersion, error) {
	p := PolicyVersion{
		SandboxID: sandboxID,
		YAML:      yaml,
		SHA256:    sha256,
		Author:    author,
		CreatedAt: now(),
		Status:    PolicyPending,
	}
	err := s.b.write(ctx, func(tx conn) error {
		// The counter lives on the sandbox row, so concurrent writers
		// queue on that row and each gets the next number.
		err := tx.queryRow(ctx, `UPDATE sandboxes SET policy_version = policy_version + 1 WHERE id = ? RETURNING policy_version`,
			sandboxID).Scan(&p.Version)
		if err != nil {
			return err
		}
		_, err = tx.exec(ctx, `INSERT INTO policies (`+policyCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sandboxID, p.Version, nonNil(yaml), sha256, author, s.b.timeArg(p.CreatedAt), string(PolicyPending), "", nil)
		return err
	})
	if err != nil {
		return PolicyVersion{}, s.fail(err, "add policy for sandbox %q", sandboxID)
	}
	return p, nil
}

func scanPolicy(r interface{ Scan(...any) error }) (PolicyVersion, error) {
	var p PolicyVersion
	var status string
	err := r.Scan(&p.SandboxID, &p.Version, &p.YAML, &p.SHA256, &p.Author, dbTime{&p.CreatedAt}, &status, &p.Error, dbTime{&p.StatusAt})
	p.Status = PolicyStatus(status)
	return p, err
}

func (s *sqlStore) Policy(ctx context.Context, sandboxID string, version int64) (PolicyVersion, error) {
	var r row
	if version == 0 {
		r = s.b.read().queryRow(ctx, `SELECT `+policyCols+` FROM policies WHERE sandbox_id = ? ORDER BY version DESC LIMIT 1`, sandboxID)
	} else {
		r = s.b.read().queryRow(ctx, `SELECT `+policyCols+` FROM policies WHERE sandbox_id = ? AND version = ?`, sandboxID, version)
	}
	p, err := scanPolicy(r)
	if err != nil {
		return PolicyVersion{}, s.fail(err, "policy %d of sandbox %q", version, sandboxID)
	}
	return p, nil
}

func (s *sqlStore) PolicyHistory(ctx context.Context, sandboxID string) ([]PolicyVersion, error) {
	rs, err := s.b.read().query(ctx, `SELECT `+policyCols+` FROM policies WHERE sandbox_id = ? ORDER BY version DESC`, sandboxID)
	if err != nil {
		return nil, s.fail(err, "policy history of sandbox %q", sandboxID)
	}
	defer rs.Close()
	var out []PolicyVersion
	for rs.Next() {
		p, err := scanPolicy(rs)
		if err != nil {
			return nil, s.fail(err, "policy history of sandbox %q", sandboxID)
		}
		out = append(out, p)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "policy history of sandbox %q", sandboxID)
	}
	if len(out) == 0 {
		// No versions yet is an empty history; no sandbox is an error.
		if _, err := s.GetSandbox(ctx, sandboxID); err != nil {
			return nil, fmt.Errorf("policy history: %w", err)
		}
	}
	return out, nil
}

func (s *sqlStore) SetPolicyStatus(ctx context.Context, sandboxID string, version int64, status PolicyStatus, errText string) error {
	var at any
	switch status {
	case PolicyPending:
	case PolicyLoaded, PolicyFailed:
		at = s.b.timeArg(now())
	default:
		return fmt.Errorf("set status of policy %d of sandbox %q: unknown status %q", version, sandboxID, status)
	}
	return s.update(ctx, fmt.Sprintf("set status of policy %d of sandbox %q", version, sandboxID),
		`UPDATE policies SET status = ?, error = ?, status_at = ? WHERE sandbox_id = ? AND version = ?`,
		string(status), errText, at, sandboxID, version)
}

// levelsFrom returns min and every level above it.
func levelsFrom(min string) ([]string, error) {
	for i, l := range levels {
		if l == min {
			return levels[i:], nil
		}
	}
	return nil, fmt.Errorf("unknown log level %q (want one of %s)", min, strings.Join(levels, ", "))
}

// clean makes s storable on both backends: PostgreSQL text refuses NUL and
// invalid UTF-8, and one odd line must not cost the whole batch.
func clean(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func (s *sqlStore) AppendLogs(ctx context.Context, entries []LogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	batch := make([]LogEntry, len(entries))
	for i, e := range entries {
		if _, err := levelsFrom(e.Level); err != nil {
			return fmt.Errorf("append logs: entry %d: %w", i, err)
		}
		e.Time = orNow(e.Time)
		e.Source = clean(e.Source)
		e.Event = clean(e.Event)
		e.Message = clean(e.Message)
		e.Fields = nonNil(e.Fields)
		batch[i] = e
	}
	if err := s.b.appendLogs(ctx, batch); err != nil {
		return s.fail(err, "append %d log entries", len(batch))
	}
	for i := range entries {
		entries[i].Seq = batch[i].Seq
	}
	return nil
}

func (s *sqlStore) QueryLogs(ctx context.Context, q LogQuery) ([]LogEntry, error) {
	var where []string
	var args []any
	if q.SandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, q.SandboxID)
	}
	if q.AfterSeq > 0 {
		where = append(where, "seq > ?")
		args = append(args, q.AfterSeq)
	}
	if !q.Since.IsZero() {
		where = append(where, "time >= ?")
		args = append(args, s.b.timeArg(q.Since))
	}
	if q.Event != "" {
		where = append(where, "event = ?")
		args = append(args, q.Event)
	}
	if q.MinLevel != "" {
		ls, err := levelsFrom(q.MinLevel)
		if err != nil {
			return nil, fmt.Errorf("query logs: %w", err)
		}
		where = append(where, "level IN (?"+strings.Repeat(", ?", len(ls)-1)+")")
		for _, l := range ls {
			args = append(args, l)
		}
	}
	limit := q.Limit
	switch {
	case limit < 0:
		return nil, fmt.Errorf("query logs: negative limit %d", limit)
	case limit == 0:
		limit = defaultLogLimit
	}
	stmt := `SELECT seq, sandbox_id, time, level, source, event, message, fields FROM logs`
	if len(where) > 0 {
		stmt += ` WHERE ` + strings.Join(where, " AND ")
	}
	stmt += ` ORDER BY seq LIMIT ?`
	args = append(args, int64(limit))

	rs, err := s.b.read().query(ctx, stmt, args...)
	if err != nil {
		return nil, s.fail(err, "query logs")
	}
	defer rs.Close()
	var out []LogEntry
	for rs.Next() {
		var e LogEntry
		var sandbox sql.NullString
		if err := rs.Scan(&e.Seq, &sandbox, dbTime{&e.Time}, &e.Level, &e.Source, &e.Event, &e.Message, &e.Fields); err != nil {
			return nil, s.fail(err, "query logs")
		}
		e.SandboxID = sandbox.String
		out = append(out, e)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "query logs")
	}
	return out, nil
}

func (s *sqlStore) PruneLogs(ctx context.Context, keep int) (int64, error) {
	if keep < 0 {
		return 0, fmt.Errorf("prune logs: negative keep %d", keep)
	}
	var n int64
	err := s.b.write(ctx, func(tx conn) error {
		var err error
		n, err = tx.exec(ctx, `DELETE FROM logs WHERE seq IN (
			SELECT seq FROM (
				SELECT seq, ROW_NUMBER() OVER (PARTITION BY sandbox_id ORDER BY seq DESC) AS rn FROM logs
			) AS ranked WHERE rn > ?)`, int64(keep))
		return err
	})
	if err != nil {
		return 0, s.fail(err, "prune logs to %d per sandbox", keep)
	}
	return n, nil
}

const tokenCols = `id, name, kind, sandbox_id, hash, created_at, expires_at, used_at`

func (s *sqlStore) AddToken(ctx context.Context, t Token) error {
	switch {
	case t.ID == "":
		return errors.New("add token: empty id")
	case t.Hash == "":
		return fmt.Errorf("add token %q: empty hash", t.ID)
	case t.Kind != TokenUser && t.Kind != TokenSandbox && t.Kind != TokenJoin:
		return fmt.Errorf("add token %q: unknown kind %q", t.ID, t.Kind)
	case t.Kind == TokenSandbox && t.SandboxID == "":
		return fmt.Errorf("add token %q: a sandbox token needs its sandbox id", t.ID)
	case t.Kind != TokenJoin && len(t.Secrets) > 0:
		return fmt.Errorf("add token %q: only a join token grants secrets", t.ID)
	}
	err := s.b.write(ctx, func(tx conn) error {
		_, err := tx.exec(ctx, `INSERT INTO tokens (`+tokenCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			t.ID, t.Name, string(t.Kind), nullStr(t.SandboxID), t.Hash,
			s.b.timeArg(orNow(t.CreatedAt)), s.b.timeArg(t.ExpiresAt), s.b.timeArg(t.UsedAt))
		if err != nil {
			return err
		}
		for _, name := range t.Secrets {
			if _, err := tx.exec(ctx, `INSERT INTO token_secrets (token_id, secret) VALUES (?, ?)`, t.ID, name); err != nil {
				return fmt.Errorf("grant secret %q: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return s.fail(err, "add token %q", t.ID)
	}
	return nil
}

func scanToken(r interface{ Scan(...any) error }) (Token, error) {
	var t Token
	var kind string
	var sandbox sql.NullString
	err := r.Scan(&t.ID, &t.Name, &kind, &sandbox, &t.Hash, dbTime{&t.CreatedAt}, dbTime{&t.ExpiresAt}, dbTime{&t.UsedAt})
	t.Kind = TokenKind(kind)
	t.SandboxID = sandbox.String
	return t, err
}

func (s *sqlStore) TokenByHash(ctx context.Context, hash string) (Token, error) {
	t, err := scanToken(s.b.read().queryRow(ctx, `SELECT `+tokenCols+` FROM tokens WHERE hash = ?`, hash))
	if err != nil {
		// The hash is a credential's digest: keep it out of messages.
		return Token{}, s.fail(err, "token by hash")
	}
	// Only join tokens grant secrets: other kinds, which authenticate
	// every call, need no second query.
	if t.Kind == TokenJoin {
		grants, err := s.tokenSecrets(ctx, `WHERE token_id = ?`, t.ID)
		if err != nil {
			return Token{}, err
		}
		t.Secrets = grants[t.ID]
	}
	return t, nil
}

func (s *sqlStore) ListTokens(ctx context.Context) ([]Token, error) {
	rs, err := s.b.read().query(ctx, `SELECT `+tokenCols+` FROM tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, s.fail(err, "list tokens")
	}
	defer rs.Close()
	var out []Token
	for rs.Next() {
		t, err := scanToken(rs)
		if err != nil {
			return nil, s.fail(err, "list tokens")
		}
		out = append(out, t)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "list tokens")
	}
	grants, err := s.tokenSecrets(ctx, "")
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Secrets = grants[out[i].ID]
	}
	return out, nil
}

// tokenSecrets returns the secrets granted to the tokens the where clause
// selects, by token id, each list sorted.
func (s *sqlStore) tokenSecrets(ctx context.Context, where string, args ...any) (map[string][]string, error) {
	rs, err := s.b.read().query(ctx, `SELECT token_id, secret FROM token_secrets `+where+` ORDER BY token_id, secret`, args...)
	if err != nil {
		return nil, s.fail(err, "secrets granted to tokens")
	}
	defer rs.Close()
	out := map[string][]string{}
	for rs.Next() {
		var id, name string
		if err := rs.Scan(&id, &name); err != nil {
			return nil, s.fail(err, "secrets granted to tokens")
		}
		out[id] = append(out[id], name)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "secrets granted to tokens")
	}
	return out, nil
}

func (s *sqlStore) DeleteToken(ctx context.Context, id string) error {
	return s.update(ctx, fmt.Sprintf("delete token %q", id), `DELETE FROM tokens WHERE id = ?`, id)
}

func (s *sqlStore) SpendJoinToken(ctx context.Context, id, sandboxID string) error {
	if sandboxID == "" {
		return fmt.Errorf("spend join token %q: empty sandbox id", id)
	}
	t := now()
	// One conditional UPDATE, so two supervisors racing with the same
	// token cannot both spend it; an expired token is as good as spent.
	return s.update(ctx, fmt.Sprintf("spend join token %q", id),
		`UPDATE tokens SET used_at = ?, sandbox_id = ?
		 WHERE id = ? AND kind = ? AND used_at IS NULL AND (expires_at IS NULL OR expires_at > ?)`,
		s.b.timeArg(t), sandboxID, id, string(TokenJoin), s.b.timeArg(t))
}

const clientCertCols = `serial, name, issued_at, expires_at, revoked_at`

func (s *sqlStore) AddClientCert(ctx context.Context, c ClientCert) error {
	if c.Serial == "" || c.Name == "" || c.ExpiresAt.IsZero() {
		return fmt.Errorf("add client certificate %q: serial, name and expiry are required", c.Serial)
	}
	err := s.b.write(ctx, func(tx conn) error {
		_, err := tx.exec(ctx, `INSERT INTO client_certs (`+clientCertCols+`) VALUES (?, ?, ?, ?, ?)`,
			c.Serial, c.Name, s.b.timeArg(orNow(c.IssuedAt)), s.b.timeArg(c.ExpiresAt), s.b.timeArg(c.RevokedAt))
		return err
	})
	if err != nil {
		return s.fail(err, "add client certificate %q", c.Serial)
	}
	return nil
}

func scanClientCert(r interface{ Scan(...any) error }) (ClientCert, error) {
	var c ClientCert
	err := r.Scan(&c.Serial, &c.Name, dbTime{&c.IssuedAt}, dbTime{&c.ExpiresAt}, dbTime{&c.RevokedAt})
	return c, err
}

func (s *sqlStore) ClientCertBySerial(ctx context.Context, serial string) (ClientCert, error) {
	c, err := scanClientCert(s.b.read().queryRow(ctx, `SELECT `+clientCertCols+` FROM client_certs WHERE serial = ?`, serial))
	if err != nil {
		return ClientCert{}, s.fail(err, "client certificate %q", serial)
	}
	return c, nil
}

func (s *sqlStore) ListClientCerts(ctx context.Context) ([]ClientCert, error) {
	rs, err := s.b.read().query(ctx, `SELECT `+clientCertCols+` FROM client_certs ORDER BY issued_at, serial`)
	if err != nil {
		return nil, s.fail(err, "list client certificates")
	}
	defer rs.Close()
	var out []ClientCert
	for rs.Next() {
		c, err := scanClientCert(rs)
		if err != nil {
			return nil, s.fail(err, "list client certificates")
		}
		out = append(out, c)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "list client certificates")
	}
	return out, nil
}

func (s *sqlStore) RevokeClientCert(ctx context.Context, serial string) error {
	return s.update(ctx, fmt.Sprintf("revoke client certificate %q", serial),
		`UPDATE client_certs SET revoked_at = ? WHERE serial = ? AND revoked_at IS NULL`, s.b.timeArg(now()), serial)
}

func (s *sqlStore) PutSecret(ctx context.Context, sec Secret) error {
	if sec.Name == "" {
		return errors.New("put secret: empty name")
	}
	err := s.b.write(ctx, func(tx conn) error {
		_, err := tx.exec(ctx, `INSERT INTO secrets (name, sealed, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at`,
			sec.Name, nonNil(sec.Sealed), s.b.timeArg(orNow(sec.UpdatedAt)))
		return err
	})
	if err != nil {
		return s.fail(err, "put secret %q", sec.Name)
	}
	return nil
}

func (s *sqlStore) GetSecret(ctx context.Context, name string) (Secret, error) {
	var sec Secret
	err := s.b.read().queryRow(ctx, `SELECT name, sealed, updated_at FROM secrets WHERE name = ?`, name).
		Scan(&sec.Name, &sec.Sealed, dbTime{&sec.UpdatedAt})
	if err != nil {
		return Secret{}, s.fail(err, "get secret %q", name)
	}
	return sec, nil
}

func (s *sqlStore) ListSecrets(ctx context.Context) ([]string, error) {
	rs, err := s.b.read().query(ctx, `SELECT name FROM secrets ORDER BY name`)
	if err != nil {
		return nil, s.fail(err, "list secrets")
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var name string
		if err := rs.Scan(&name); err != nil {
			return nil, s.fail(err, "list secrets")
		}
		out = append(out, name)
	}
	if err := rs.Err(); err != nil {
		return nil, s.fail(err, "list secrets")
	}
	return out, nil
}

func (s *sqlStore) DeleteSecret(ctx context.Context, name string) error {
	return s.update(ctx, fmt.Sprintf("delete secret %q", name), `DELETE FROM secrets WHERE name = ?`, name)
}

func (s *sqlStore) AddRoutes(ctx context.Context, yaml []byte, author string) (Routes, error) {
	r := Routes{YAML: yaml, Author: author, CreatedAt: now()}
	err := s.b.write(ctx, func(tx conn) error {
		// The upsert takes the counter's row lock, so concurrent writers
		// each get the next number.
		err := tx.queryRow(ctx, `INSERT INTO counters (name, value) VALUES ('routes', 1)
			ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value`).Scan(&r.Version)
		if err != nil {
			return err
		}
		_, err = tx.exec(ctx, `INSERT INTO routes (version, yaml, author, created_at) VALUES (?, ?, ?, ?)`,
			r.Version, nonNil(yaml), author, s.b.timeArg(r.CreatedAt))
		return err
	})
	if err != nil {
		return Routes{}, s.fail(err, "add routes")
	}
	return r, nil
}

func (s *sqlStore) CurrentRoutes(ctx context.Context) (Routes, error) {
	var r Routes
	err := s.b.read().queryRow(ctx, `SELECT version, yaml, author, created_at FROM routes ORDER BY version DESC LIMIT 1`).
		Scan(&r.Version, &r.YAML, &r.Author, dbTime{&r.CreatedAt})
	if err != nil {
		return Routes{}, s.fail(err, "current routes")
	}
	return r, nil
}

func (s *sqlStore) Close() error {
	return s.b.close()
}
