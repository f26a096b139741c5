//! The crate's one error type, with the retry classifier that retry policy reads.

use crate::ids::LeaseId;

/// Everything that can go wrong in the library. Rejections by a fenced sink are *not* errors
/// (they are an [`Admission`](crate::Admission)); neither is a duplicate write.
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
    /// A sink mutation does not fit the stored data (wrong type, non-integer field); nothing
    /// was applied.
    #[error("mutation refused: {0}")]
    Mutation(String),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The backend could not be reached or answered garbage; the operation may be retried.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// An actor the operation needed has stopped (shutdown in progress).
    #[error("actor mailbox closed: {0}")]
    Mailbox(#[from] actix::MailboxError),
}

impl Error {
    /// Whether repeating the same operation later can succeed. Retry policy lives here and
    /// nowhere else.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Mailbox(_))
    }
}

/// Library result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
