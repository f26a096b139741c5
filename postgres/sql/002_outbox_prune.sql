-- Palisade fenced sink, version 2: delivered outbox entries are pruned after a retention
-- (OutboxRelay), oldest first; this index finds them without scanning the pending ones.
CREATE INDEX outbox_delivered ON {schema}.outbox (delivered_at) WHERE state = 'delivered';
