//! The crate's one error type, classified by what the caller should do about it.
//!
//! The split follows redis-rs' `ErrorKind` / `RetryMethod`: an error is either *transient* —
//! the same operation may succeed later (connection refused or dropped, timeout, Redis
//! `LOADING` / `BUSY` / `TRYAGAIN` / `MASTERDOWN` / `READONLY` / `OOM`, a cluster's `MOVED` /
//! `ASK`, a closed mailbox) — or
//! *permanent*: repeating it gives the same answer (a script or protocol error, a reply that
//! does not decode, a corrupt or exhausted epoch, bad configuration or input). Retry policy
//! reads [`Error::is_retryable`] and nothing else, so a permanent error is never retried
//! silently: a handler that gets one dead-letters its job with the reason.

use crate::ids::LeaseId;

/// Everything that can go wrong in the library. Rejections by a fenced sink are *not* errors
/// (they are an [`Admission`](crate::admission::Admission)); neither is a duplicate write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease id is no longer current at the coordinator: it expired, was completed, or a
    /// newer claim replaced it. Nothing was changed.
    #[error("lease {0} is not current")]
    LeaseNotCurrent(LeaseId),
    /// A handler asked for a sink the worker was not given.
    #[error("no fenced sink named {0:?} is registered with this worker")]
    UnknownSink(String),
    /// A payload could not be encoded or decoded.
    #[error("payload: {0}")]
    Payload(String),
    /// The job description itself is invalid (empty kind, oversize payload, ...).
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// Permanent: an idempotency key (or a producer-chosen job id) is held by a job enqueued
    /// with a different request ([`UniqueKey::fingerprint`](crate::job::UniqueKey::fingerprint)).
    /// Nothing of the batch was added; the message names the key and the holder.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Transient: the backend could not be reached, timed out, or said "not now" (loading,
    /// busy, read-only replica, out of memory). The operation may be retried.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// Permanent: the backend answered, but with an error or a reply that does not decode
    /// (script error, protocol error, corrupt stored record). Retrying repeats it.
    #[error("backend error: {0}")]
    Backend(String),
    /// Permanent: the coordinator would need an epoch above the largest one tokens can carry
    /// ([`FencingToken::MAX_EPOCH`](crate::ids::FencingToken::MAX_EPOCH)), or its epoch record is
    /// corrupt. No token was granted.
    #[error("epoch: {0}")]
    Epoch(String),
    /// Transient, and not knowing: the commit of a fenced transaction was sent but its
    /// answer was lost (the connection dropped). The write may or may not have applied;
    /// retrying with the same idempotency key resolves it — to `Applied` (once) if it did not,
    /// to `Duplicate` if it did — never a second application.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// A fenced transaction's own closure returned an error: the transaction was rolled back
    /// and nothing applied. Permanent — the closure decided; return a `tokio_postgres::Error`
    /// from it to keep a database error's class instead.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// Refused because the installation's coordinator moved to another layout
    /// (`palisade partitions`, `move_layout`) since this
    /// process read its layout generation. Nothing was changed. Transient while a move runs —
    /// it may be undone, and the same call then succeeds (a worker keeps the settlement and
    /// retries it) — and from then on for good once the move completed: restart the process
    /// with the installation's `--partitions`.
    #[error("layout moved: {0}")]
    Layout(String),
    /// Refused because the installation's format level ([`crate::format`]) is outside the
    /// window this build reads and writes: `palisade upgrade finalize` moved it on (or a
    /// release too new for this one wrote it). Nothing was changed. Retryable like
    /// [`Error::Layout`] — the worker keeps its settlement, another process takes its jobs
    /// over — but for good until the process runs a release that reads the level.
    #[error("format level: {0}")]
    Format(String),
    /// An actor the operation needed has stopped (shutdown in progress).
    #[error("actor mailbox closed: {0}")]
    Mailbox(#[from] actix::MailboxError),
}

impl Error {
    /// Whether repeating the same operation later can succeed. Retry policy lives here and
    /// nowhere else.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::OutcomeUnknown(_)
                | Self::Layout(_)
                | Self::Format(_)
                | Self::Mailbox(_)
        )
    }
}

impl Error {
    /// For a view of every queue (the depth sampler, `palisade status`, the console, the HTTP
    /// API): whether this error, met reading `queue`, leaves that queue out of the view rather
    /// than failing it whole. Only a key of the queue that another program wrote over does
    /// (the scripts' `PALISADE_CORRUPT`, which names the key, or a bare `WRONGTYPE`), with a
    /// warning and `palisade_backend_errors_total{op}`: one broken queue must not blind the
    /// view of the others. Any other error fails the view, for the caller to say or retry: a
    /// backend that is down, and a permanent error that is not the queue's own (a user not
    /// allowed to run scripts, a reply that does not decode), which would leave every queue
    /// out and show an empty view as if it were true.
    #[doc(hidden)] // for palisade-cli's views (not API)
    pub fn leaves_queue_out(&self, queue: &str, op: &'static str) -> bool {
        let Self::Backend(message) = self else {
            return false;
        };
        if !(message.contains("PALISADE_CORRUPT") || message.contains("WRONGTYPE")) {
            return false;
        }
        tracing::warn!(%queue, error = %self, op, "queue not read; left out of this view");
        metrics::counter!(crate::metrics::BACKEND_ERRORS, "op" => op).increment(1);
        true
    }

    /// A copy of this error's message in its class (retryable stays retryable), for each
    /// part of a failed call that must report it.
    #[doc(hidden)] // for the drivers
    pub fn same_class(&self) -> Error {
        if self.is_retryable() {
            Error::Unavailable(self.to_string())
        } else {
            Error::Backend(self.to_string())
        }
    }
}

/// Library result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `e` and every cause under it, `outer: inner: innermost`, on one line, each cause named
/// once (many errors already print their source): "error sending request" alone hides
/// whether it was a timeout, a refusal or a certificate.
#[doc(hidden)] // for the drivers
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !shown.contains(&text) {
            shown.push_str(": ");
            shown.push_str(&text);
        }
        source = cause.source();
    }
    shown.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_key_written_over_leaves_a_queue_out() {
        let corrupt = Error::Backend(
            "redis: \"PALISADE_CORRUPT\": {palisade}:q:b:delayed is a string, not a zset".into(),
        );
        assert!(corrupt.leaves_queue_out("b", "test"));
        let wrong = Error::Backend("redis: WRONGTYPE Operation against a key".into());
        assert!(wrong.leaves_queue_out("b", "test"));
        for other in [
            Error::Backend("redis: NOPERM this user has no permissions to run 'evalsha'".into()),
            Error::Backend("reply does not decode".into()),
            Error::Unavailable("connection refused".into()),
        ] {
            assert!(!other.leaves_queue_out("b", "test"), "{other}");
        }
    }

    #[test]
    fn only_transient_errors_are_retryable() {
        assert!(Error::Unavailable("connection refused".into()).is_retryable());
        assert!(Error::OutcomeUnknown("COMMIT: connection closed".into()).is_retryable());
        assert!(Error::Layout("PALISADE_LAYOUT a move runs".into()).is_retryable());
        for permanent in [
            Error::Backend(
                "ERR user_script:1: Script attempted to access nonexistent global".into(),
            ),
            Error::Epoch("exhausted".into()),
            Error::Config("bad url".into()),
            Error::InvalidJob("empty kind".into()),
            Error::Payload("not json".into()),
            Error::Aborted("invoice 7 not found".into()),
            Error::LeaseNotCurrent(LeaseId::new()),
        ] {
            assert!(!permanent.is_retryable(), "{permanent}");
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: inner")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_chain_names_each_cause_once_on_one_line() {
        let e = Outer(Middle(std::io::Error::other("inner")));
        assert_eq!(chain(&e), "outer: middle: inner");
        let e = std::io::Error::other("two\nlines");
        assert_eq!(chain(&e), "two lines");
    }
}
