-- The gateway secrets a join token lets the sandbox joining with it take
-- from_gateway, as its operator granted them. A join token with no rows
-- here grants none, which is what every join token made before this table
-- gets.
CREATE TABLE token_secrets (
	token_id TEXT NOT NULL REFERENCES tokens(id) ON DELETE CASCADE,
	secret TEXT NOT NULL,
	PRIMARY KEY (token_id, secret)
);
