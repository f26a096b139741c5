//! What a waiting job should look like, for `assert_enqueued!` and `refute_enqueued!`.

use std::fmt;

use serde_json::Value as Json;

use crate::job::Job;

/// What a job should look like, for [`assert_enqueued!`](crate::assert_enqueued): every field
/// given must match; a payload matches when every field it names has the same value in the
/// job's payload (so `json!({"to": "ann"})` matches `{"to": "ann", "cc": []}`).
#[derive(Clone, Debug, Default)]
pub struct Expect {
    kind: Option<String>,
    queue: Option<String>,
    scope: Option<String>,
    payload: Option<Json>,
}

impl Expect {
    /// Of this kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// In this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// In this fencing scope.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// With a payload that contains `payload` (any serde value: a struct, `json!({..})`).
    pub fn payload(mut self, payload: impl serde::Serialize) -> Self {
        self.payload = Some(serde_json::to_value(payload).unwrap_or(Json::Null));
        self
    }

    /// Whether `job` is such a job.
    pub fn matches(&self, job: &Job) -> bool {
        let payload = || serde_json::from_str::<Json>(&job.payload).unwrap_or(Json::Null);
        self.kind.as_ref().is_none_or(|k| *k == job.kind)
            && self.queue.as_ref().is_none_or(|q| *q == job.queue)
            && self.scope.as_ref().is_none_or(|s| s == job.scope.as_str())
            && self
                .payload
                .as_ref()
                .is_none_or(|want| contains(&payload(), want))
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = Vec::new();
        if let Some(k) = &self.kind {
            said.push(format!("kind = {k:?}"));
        }
        if let Some(q) = &self.queue {
            said.push(format!("queue = {q:?}"));
        }
        if let Some(s) = &self.scope {
            said.push(format!("scope = {s:?}"));
        }
        if let Some(p) = &self.payload {
            said.push(format!("payload containing {p}"));
        }
        if said.is_empty() {
            return f.write_str("any job");
        }
        f.write_str(&said.join(", "))
    }
}

/// Whether `have` holds everything `want` says: objects by their fields, recursively; every
/// other value (arrays too) equal.
fn contains(have: &Json, want: &Json) -> bool {
    match (have, want) {
        (Json::Object(have), Json::Object(want)) => want
            .iter()
            .all(|(k, v)| have.get(k).is_some_and(|h| contains(h, v))),
        _ => have == want,
    }
}

/// Asserts that a job waits (ready or delayed) in the harness `h` that matches every field
/// given: `kind`, `queue`, `scope`, `payload` (contained, see [`Expect`]). On failure it
/// lists what does wait.
///
/// ```ignore
/// assert_enqueued!(h, kind = "email", payload = json!({"to": "ann@example.com"}));
/// ```
#[macro_export]
macro_rules! assert_enqueued {
    ($h:expr $(, $field:ident = $value:expr)* $(,)?) => {{
        let want = $crate::testing::Expect::default() $( .$field($value) )*;
        $h.assert_enqueued(&want)
    }};
}

/// Asserts that no job matching the fields given waits in the harness `h`, as
/// [`assert_enqueued!`](crate::assert_enqueued) reads them.
#[macro_export]
macro_rules! refute_enqueued {
    ($h:expr $(, $field:ident = $value:expr)* $(,)?) => {{
        let want = $crate::testing::Expect::default() $( .$field($value) )*;
        $h.refute_enqueued(&want)
    }};
}
