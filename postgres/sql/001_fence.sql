-- Palisade fenced sink, version 1. `{schema}` is the quoted schema name the user chose.
-- Applied once, in one transaction, under an advisory lock (see postgres/src/migrate.rs).

-- The newest generation accepted per scope. A row exists only while its token is at or above
-- the low watermark (or has not been collected yet); `token` is NULL only inside the
-- transaction that created the row to lock it, never once committed.
CREATE TABLE {schema}.fence (
    scope text PRIMARY KEY,
    token bigint,
    lease uuid
);
-- Collection walks fences below the watermark in token order.
CREATE INDEX fence_token ON {schema}.fence (token);

-- Applied idempotency keys, kept across generations until their retention passes, with the
-- result of the write that applied them (JSON; NULL for mutation writes).
CREATE TABLE {schema}.keys (
    scope text NOT NULL,
    key text NOT NULL,
    token bigint NOT NULL,
    result jsonb,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX keys_applied_at ON {schema}.keys (applied_at);

-- The largest low watermark any process of this sink has published; only grows.
CREATE TABLE {schema}.meta (
    id int PRIMARY KEY CHECK (id = 1),
    watermark bigint NOT NULL
);
INSERT INTO {schema}.meta (id, watermark) VALUES (1, 0);

-- `PostgresFencedStore`: the key/value data of `Mutation` writes (a `Value` as JSON). A row
-- with a NULL value exists only inside the transaction that locked it.
CREATE TABLE {schema}.data (
    key text PRIMARY KEY,
    value jsonb
);

-- Effects recorded by fenced transactions, delivered at least once by an `OutboxRelay`.
CREATE TABLE {schema}.outbox (
    id bigserial PRIMARY KEY,
    target text NOT NULL,
    scope text NOT NULL,
    key text NOT NULL,
    token bigint NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    leased_until timestamptz,
    lease uuid,
    last_error text,
    delivered_at timestamptz,
    UNIQUE (target, scope, key)
);
-- Relays look for due pending entries only; delivered and dead ones are not in this index.
CREATE INDEX outbox_due ON {schema}.outbox (next_attempt_at, id) WHERE state = 'pending';
