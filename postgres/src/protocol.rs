//! How Palisade's statements reach the server. Behind a connection pooler in transaction mode
//! (PgBouncer's `pool_mode = transaction`, and poolers like it) each transaction may run on
//! another server connection, so nothing may outlive a transaction: no named prepared
//! statement, no session setting. Such a sink URL says so (`?pooler=transaction`), and its
//! statements go out unnamed, with their parameters' types, in one message with their
//! execution (tokio-postgres' `query_typed`: one round trip, nothing left on the connection).
//! Statements run once per call (migrations, the relay's, the epoch source's) go out so in
//! every mode, saving the prepare round trip; the hot ones are otherwise prepared once per
//! connection and cached.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

/// How a sink's hot statements reach the server (the URL's `pooler` parameter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Prepared once per connection (named) and cached: a direct connection, or a pooler in
    /// session mode (`pooler=session`, or no parameter).
    #[default]
    Cached,
    /// Unnamed, parsed with every execution: a pooler in transaction mode
    /// (`pooler=transaction`).
    Unnamed,
}

/// A statement parameter with its Postgres type (what an unnamed statement needs).
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// The values of `params`, for a cached statement (whose types the server inferred).
pub(crate) fn values<'a>(params: &[Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(value, _)| *value).collect()
}

impl Protocol {
    /// Reads the URL's `pooler` parameter (`transaction` or `session`).
    pub(crate) fn parse(value: &str) -> crate::Result<Self> {
        match value {
            "transaction" => Ok(Self::Unnamed),
            "session" => Ok(Self::Cached),
            other => Err(crate::Error::Config(format!(
                "Postgres pooler={other:?}: use pooler=transaction (a pooler in transaction mode, \
                 such as PgBouncer's pool_mode = transaction) or pooler=session"
            ))),
        }
    }

    /// The statement `sql` prepared and cached on `tx`'s connection, when this protocol
    /// caches (`None`: send it unnamed); for the calls below, and for pipelined ones.
    pub(crate) async fn prepare(
        self,
        tx: &deadpool_postgres::Transaction<'_>,
        sql: &str,
    ) -> Result<Option<Statement>, tokio_postgres::Error> {
        match self {
            Self::Cached => tx.prepare_cached(sql).await.map(Some),
            Self::Unnamed => Ok(None),
        }
    }

    /// Runs `sql` on `tx`, returning its rows.
    pub(crate) async fn query(
        self,
        tx: &deadpool_postgres::Transaction<'_>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self.prepare(tx, sql).await? {
            Some(statement) => tx.query(&statement, &values(params)).await,
            None => tx.query_typed(sql, params).await,
        }
    }

    /// Runs `sql` on `tx`, returning the number of rows it changed.
    pub(crate) async fn execute(
        self,
        tx: &deadpool_postgres::Transaction<'_>,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, tokio_postgres::Error> {
        match self.prepare(tx, sql).await? {
            Some(statement) => tx.execute(&statement, &values(params)).await,
            None => tx.execute_typed(sql, params).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooler_parameter_names_a_mode_or_is_refused() {
        assert_eq!(Protocol::parse("transaction").unwrap(), Protocol::Unnamed);
        assert_eq!(Protocol::parse("session").unwrap(), Protocol::Cached);
        for bad in ["", "true", "Transaction", "statement"] {
            assert!(Protocol::parse(bad).is_err(), "{bad:?}");
        }
    }
}
