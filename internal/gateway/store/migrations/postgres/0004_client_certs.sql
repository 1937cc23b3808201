-- The client certificates issue-client made, by serial number (lower-case
-- hex), so that one can be revoked. A certificate the CA signed that has no
-- row here (issued before this table, or outside issue-client) does not
-- authenticate.
CREATE TABLE client_certs (
	serial TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	issued_at TIMESTAMPTZ NOT NULL,
	expires_at TIMESTAMPTZ NOT NULL,
	revoked_at TIMESTAMPTZ
);
