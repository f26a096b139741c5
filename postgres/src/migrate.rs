//! Embedded, versioned migrations of a fenced sink's schema: applied in order, each once, in
//! one transaction under an advisory lock, so many workers starting at once on many hosts
//! agree on one schema version (concurrent `CREATE .. IF NOT EXISTS` can still collide in the
//! catalog; the lock makes them take turns).
//!
//! Each migration says which builds can still run against a schema it was applied to
//! (`readers_from`), and the schema keeps that beside the version: during a rolling deploy,
//! or a rollback, a build older than the schema runs as long as every newer migration kept
//! it able to (an added index does; a changed column would not), where it used to refuse any
//! newer schema at all. An operator can apply migrations before the workers start
//! (`palisade migrate --plan | --apply`, workers with `--no-migrate`).

use tokio_postgres::types::Type;

use crate::error::{Error, Result};

use super::{pool_error, postgres_error};

/// One migration of the sink's schema. Append, never edit.
struct Migration {
    version: i32,
    /// `{schema}` stands for the quoted schema name.
    sql: &'static str,
    /// The oldest schema version a build must know to run against a schema this migration
    /// was applied to: its own version when it changes what older builds read or write,
    /// lower when older builds are unaffected (an added index).
    readers_from: i32,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("../sql/001_fence.sql"),
        readers_from: 1,
    },
    Migration {
        version: 2,
        sql: include_str!("../sql/002_outbox_prune.sql"),
        // An index: a build that knows version 1 neither needs nor notices it.
        readers_from: 1,
    },
];

/// The newest schema version this build knows.
fn newest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Where a sink's schema stands against this build ([`migration_plan`](crate::migration_plan)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationPlan {
    /// The schema, quoted as the SQL names it.
    pub schema: String,
    /// Its version (0: not created yet).
    pub current: i32,
    /// The newest version this build knows.
    pub known: i32,
    /// The migrations this build would apply, oldest first.
    pub pending: Vec<PendingMigration>,
    /// For a schema newer than this build: the oldest version a build must know to run
    /// against it (this build runs when it is at most `known`).
    pub newer_needs: Option<i32>,
    /// Whether applying also gives the schema's `migrations` table its `readers_from` column
    /// (a schema a build from before it kept), which needs the table's owner.
    pub adds_readers_column: bool,
}

/// One migration a [`MigrationPlan`] would apply.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMigration {
    /// Its version.
    pub version: i32,
    /// The oldest schema version a build must know to run once it is applied: builds of
    /// that version and later keep running through it.
    pub readers_from: i32,
    /// The SQL it runs, the schema name filled in.
    pub sql: String,
}

impl MigrationPlan {
    /// Whether this build can run against the schema as it is, without applying anything.
    pub fn runs_as_is(&self) -> bool {
        self.pending.is_empty() && self.newer_needs.is_none_or(|needs| needs <= self.known)
    }

    /// Why this build cannot run against the schema as it is, or `None` when it can.
    pub fn refusal(&self) -> Option<String> {
        let Self {
            schema,
            current,
            known,
            ..
        } = self;
        match self.newer_needs {
            Some(needs) if needs > *known => Some(format!(
                "Postgres schema {schema} is at version {current}, which builds from version \
                 {needs} on can run against; this build knows {known}: upgrade the worker binary"
            )),
            _ if !self.pending.is_empty() => Some(format!(
                "Postgres schema {schema} is at version {current}, this build needs {known}: \
                 apply the migrations (`palisade migrate --apply`, or start without --no-migrate)"
            )),
            _ => None,
        }
    }
}

/// The SQL that tells whether `schema`'s migrations table exists and has its
/// `readers_from` column (two booleans).
fn bookkeeping_query(schema: &str) -> String {
    // The name as a literal for to_regclass: the quoted identifier, its quotes doubled.
    let table = format!("{schema}.migrations").replace('\'', "''");
    format!(
        "SELECT to_regclass('{table}') IS NOT NULL,
                EXISTS (SELECT 1 FROM pg_attribute
                        WHERE attrelid = to_regclass('{table}')
                          AND attname = 'readers_from' AND NOT attisdropped)"
    )
}

/// Whether the migrations table exists, and whether it has its `readers_from` column.
async fn bookkeeping_state(
    tx: &deadpool_postgres::Transaction<'_>,
    schema: &str,
) -> Result<(bool, bool)> {
    let row = tx
        .query_typed_one(&bookkeeping_query(schema), &[])
        .await
        .map_err(postgres_error)?;
    Ok((row.get(0), row.get(1)))
}

/// The migrations table and its `readers_from` column (added by builds that keep it; a
/// version recorded without one is read as needing builds of its own version). Changed only
/// when missing: a start with nothing to do takes no lock on the table and needs no right a
/// previous release's start did not (altering a table needs its owner).
async fn bookkeeping(tx: &deadpool_postgres::Transaction<'_>, schema: &str) -> Result<()> {
    let (exists, has_readers) = bookkeeping_state(tx, schema).await?;
    if !exists {
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.migrations (
                 version int PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );"
        ))
        .await
        .map_err(postgres_error)?;
    }
    if !has_readers {
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.migrations ADD COLUMN IF NOT EXISTS readers_from int;"
        ))
        .await
        .map_err(postgres_error)?;
    }
    Ok(())
}

/// The plan for a schema whose bookkeeping reads `current` and, for versions above this
/// build's, needs builds from `newer_needs` on.
fn plan_for(schema: &str, current: i32, newer_needs: Option<i32>) -> MigrationPlan {
    MigrationPlan {
        schema: schema.to_owned(),
        current,
        known: newest(),
        pending: MIGRATIONS
            .iter()
            .filter(|m| m.version > current)
            .map(|m| PendingMigration {
                version: m.version,
                readers_from: m.readers_from,
                sql: m.sql.replace("{schema}", schema),
            })
            .collect(),
        newer_needs: (current > newest()).then(|| newer_needs.unwrap_or(current)),
        adds_readers_column: false,
    }
}

/// Reads where `schema` (quoted) stands, changing nothing.
pub(super) async fn plan(pool: &deadpool_postgres::Pool, schema: &str) -> Result<MigrationPlan> {
    let mut client = pool.get().await.map_err(pool_error)?;
    // One snapshot for both reads (REPEATABLE READ, read only): a newer binary migrating
    // meanwhile is seen wholly or not at all.
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(postgres_error)?;
    let (exists, has_readers) = bookkeeping_state(&tx, schema).await?;
    if !exists {
        return Ok(MigrationPlan {
            adds_readers_column: true,
            ..plan_for(schema, 0, None)
        });
    }
    let needs = if has_readers {
        "coalesce(readers_from, version)"
    } else {
        "version"
    };
    let row = tx
        .query_typed_one(
            &format!(
                "SELECT coalesce(max(version), 0),
                        max({needs}) FILTER (WHERE version > $1)
                 FROM {schema}.migrations"
            ),
            &[(&newest(), Type::INT4)],
        )
        .await
        .map_err(postgres_error)?;
    Ok(MigrationPlan {
        adds_readers_column: !has_readers,
        ..plan_for(schema, row.get(0), row.get(1))
    })
}

/// Brings `schema` (quoted) to the newest version this build knows, unless it is newer; fails
/// with [`Error::Config`] when it is newer than this build can run against.
pub(super) async fn run(pool: &deadpool_postgres::Pool, schema: &str) -> Result<MigrationPlan> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = super::begin(&mut client).await?;
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[(&format!("palisade migrations {schema}"), Type::TEXT)],
    )
    .await
    .map_err(postgres_error)?;
    bookkeeping(&tx, schema).await?;
    let row = tx
        .query_typed_one(
            &format!(
                "SELECT coalesce(max(version), 0),
                        max(coalesce(readers_from, version)) FILTER (WHERE version > $1)
                 FROM {schema}.migrations"
            ),
            &[(&newest(), Type::INT4)],
        )
        .await
        .map_err(postgres_error)?;
    let plan = plan_for(schema, row.get(0), row.get(1));
    if let Some(newer) = plan.newer_needs {
        if let Some(why) = plan.refusal() {
            return Err(Error::Config(why));
        }
        tracing::info!(
            schema,
            version = plan.current,
            known = plan.known,
            needs = newer,
            "Postgres sink schema is newer than this build, which can run against it"
        );
    }
    for m in &plan.pending {
        tx.batch_execute(&m.sql).await.map_err(postgres_error)?;
        tx.execute_typed(
            &format!("INSERT INTO {schema}.migrations (version, readers_from) VALUES ($1, $2)"),
            &[(&m.version, Type::INT4), (&m.readers_from, Type::INT4)],
        )
        .await
        .map_err(postgres_error)?;
        tracing::info!(
            schema,
            version = m.version,
            "applied Postgres sink migration"
        );
    }
    // Versions an earlier build applied without saying which builds they keep running: filled
    // in once (an UPDATE needs a right a start with nothing to do should not).
    let unfilled: Vec<i32> = tx
        .query_typed(
            &format!("SELECT version FROM {schema}.migrations WHERE readers_from IS NULL"),
            &[],
        )
        .await
        .map_err(postgres_error)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for m in MIGRATIONS.iter().filter(|m| unfilled.contains(&m.version)) {
        tx.execute_typed(
            &format!("UPDATE {schema}.migrations SET readers_from = $2 WHERE version = $1"),
            &[(&m.version, Type::INT4), (&m.readers_from, Type::INT4)],
        )
        .await
        .map_err(postgres_error)?;
    }
    tx.commit().await.map_err(postgres_error)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bookkeeping's promises: versions count up from 1 without a gap, and no migration
    /// keeps builds running that it was applied after (`readers_from` at most its version,
    /// and never below an earlier migration's: a build that could not read that one cannot
    /// read this).
    #[test]
    fn migrations_are_numbered_in_order_and_say_who_reads_them() {
        let mut floor = 1;
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
            assert!(m.readers_from <= m.version, "version {}", m.version);
            assert!(m.readers_from >= floor, "version {}", m.version);
            floor = m.readers_from;
        }
    }

    #[test]
    fn a_plan_says_what_a_build_may_do() {
        let fresh = plan_for("\"s\"", 0, None);
        assert_eq!(fresh.pending.len(), MIGRATIONS.len());
        assert!(fresh.pending[0].sql.contains("CREATE TABLE \"s\".fence"));
        assert!(!fresh.runs_as_is());
        assert!(fresh
            .refusal()
            .unwrap()
            .contains("palisade migrate --apply"));
        let current = plan_for("\"s\"", newest(), None);
        assert!(current.runs_as_is() && current.refusal().is_none());
        // Newer by an index only: this build runs.
        let newer = plan_for("\"s\"", newest() + 1, Some(1));
        assert!(newer.runs_as_is() && newer.pending.is_empty());
        // Newer by a change this build cannot read.
        let newer = plan_for("\"s\"", newest() + 1, Some(newest() + 1));
        assert!(!newer.runs_as_is());
        assert!(newer
            .refusal()
            .unwrap()
            .contains("upgrade the worker binary"));
        // Recorded by a build that kept no readers_from: its own version.
        assert_eq!(
            plan_for("\"s\"", newest() + 2, None).newer_needs,
            Some(newest() + 2)
        );
    }
}
