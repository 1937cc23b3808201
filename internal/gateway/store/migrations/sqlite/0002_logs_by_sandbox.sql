-- Per-sandbox log queries, retention and the delete cascade walk this index
-- instead of the whole table.
CREATE INDEX logs_sandbox_seq ON logs(sandbox_id, seq);
