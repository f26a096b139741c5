//! Waitpoints: what a durable run waits for from outside it (a person's approval, a payment
//! webhook, another job), kept by the coordinator.
//!
//! A waitpoint is named by its caller (`approval:order-42`), so whoever completes it needs no
//! handle from the run: it may even complete it before the run reaches its wait. It is
//! completed **once**: the first value is kept and every later completion is told what it
//! was (so a webhook delivered twice, or two people clicking, cannot change what the run
//! sees). A run that asks before the value is there leaves its job id as the waiter, for the
//! completion to wake.
//!
//! Every backend keeps a waitpoint for [`WAITPOINT_RETENTION`] after its last change.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::JobId;

/// How long a waitpoint is kept after it was last completed or waited on.
pub const WAITPOINT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The largest value a waitpoint keeps (JSON bytes).
pub const MAX_WAITPOINT_VALUE: usize = 64 * 1024;

/// The longest waitpoint id (bytes).
pub const MAX_WAITPOINT_ID: usize = 200;

/// A waitpoint as the coordinator keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waitpoint {
    /// Its name.
    pub id: String,
    /// Its value (JSON), once completed.
    pub value: Option<String>,
    /// The job whose run waits for it (the latest to ask), if one has.
    pub waiter: Option<JobId>,
}

/// What completing a waitpoint did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Completion {
    /// This value is the waitpoint's now; `waiter` is the job to wake, if a run had asked.
    First {
        /// The job waiting for it.
        waiter: Option<JobId>,
    },
    /// It was completed before: nothing changed; `value` is what it holds.
    Already {
        /// The kept value.
        value: String,
    },
}

/// Refuses an id no backend would keep alike: empty, longer than [`MAX_WAITPOINT_ID`], or
/// holding a control character (it is shown in logs and URLs).
pub fn check_waitpoint_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_WAITPOINT_ID || id.chars().any(char::is_control) {
        return Err(Error::InvalidJob(format!(
            "waitpoint id {id:?} must be 1-{MAX_WAITPOINT_ID} bytes without control characters"
        )));
    }
    Ok(())
}

/// Refuses a value that is not JSON or is over [`MAX_WAITPOINT_VALUE`] bytes.
pub fn check_waitpoint_value(value: &str) -> Result<()> {
    if value.len() > MAX_WAITPOINT_VALUE {
        return Err(Error::Payload(format!(
            "a waitpoint value is at most {MAX_WAITPOINT_VALUE} bytes, this one is {}",
            value.len()
        )));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(value)
        .map_err(|e| Error::Payload(format!("a waitpoint value must be JSON: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_values_are_checked() {
        assert!(check_waitpoint_id("approval:order-42").is_ok());
        assert!(check_waitpoint_id("").is_err());
        assert!(check_waitpoint_id("a\nb").is_err());
        assert!(check_waitpoint_id(&"x".repeat(MAX_WAITPOINT_ID + 1)).is_err());
        assert!(check_waitpoint_value(r#"{"approved":true}"#).is_ok());
        assert!(check_waitpoint_value("not json").is_err());
        let big = format!("\"{}\"", "x".repeat(MAX_WAITPOINT_VALUE));
        assert!(check_waitpoint_value(&big).is_err());
    }
}
