-- Times are INTEGER microseconds since the Unix epoch, UTC.
CREATE TABLE sandboxes (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	labels TEXT NOT NULL,
	command TEXT NOT NULL,
	workdir TEXT NOT NULL,
	env TEXT NOT NULL,
	driver TEXT NOT NULL,
	driver_ref TEXT NOT NULL,
	phase TEXT NOT NULL,
	exit_code INTEGER,
	reason TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	-- The newest policy version; bumped in place so numbering is atomic.
	policy_version INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE policies (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	version INTEGER NOT NULL,
	yaml BLOB NOT NULL,
	sha256 TEXT NOT NULL,
	author TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	status TEXT NOT NULL,
	error TEXT NOT NULL,
	status_at INTEGER,
	PRIMARY KEY (sandbox_id, version)
);

-- AUTOINCREMENT: a seq is never reused after the newest rows are deleted,
-- so a follower resuming after a seq it saw misses nothing.
CREATE TABLE logs (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT REFERENCES sandboxes(id) ON DELETE CASCADE,
	time INTEGER NOT NULL,
	level TEXT NOT NULL,
	source TEXT NOT NULL,
	event TEXT NOT NULL,
	message TEXT NOT NULL,
	fields BLOB NOT NULL
);

CREATE TABLE tokens (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	kind TEXT NOT NULL,
	sandbox_id TEXT REFERENCES sandboxes(id) ON DELETE CASCADE,
	hash TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	expires_at INTEGER,
	used_at INTEGER
);
CREATE INDEX tokens_sandbox ON tokens(sandbox_id);

CREATE TABLE secrets (
	name TEXT PRIMARY KEY,
	sealed BLOB NOT NULL,
	updated_at INTEGER NOT NULL
);

CREATE TABLE routes (
	version INTEGER PRIMARY KEY,
	yaml BLOB NOT NULL,
	author TEXT NOT NULL,
	created_at INTEGER NOT NULL
);

-- Named counters bumped with an upsert, for numbering that is atomic on
-- both backends.
CREATE TABLE counters (
	name TEXT PRIMARY KEY,
	value INTEGER NOT NULL
);
