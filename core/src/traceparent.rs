//! The W3C trace context a job carries ([`TraceContext`]): the `traceparent` (and `tracestate`)
//! of whoever enqueued it, kept in the job record through every retry, stall, release and
//! dead-letter retry. Plain text and its rules, no feature needed; the spans around a job are
//! palisade's `trace`, and their export its `otel`.

use serde::{Deserialize, Deserializer, Serialize};

/// Longest `tracestate` kept (the W3C limit a vendor must propagate): a longer one is dropped,
/// the trace itself kept.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A W3C trace context: the `traceparent` (version 00 form) and, if any, the `tracestate`.
/// Only valid contexts exist: build one with [`TraceContext::from_w3c`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "RawTrace")]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// The stored form: two strings, as on the wire.
#[derive(Clone, Serialize)]
struct RawTrace {
    traceparent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

/// Read back: an object whose `traceparent` is a valid stored one; a `tracestate` that is not
/// a valid string is dropped. Exactly the rule of the scripts' `trace_of`.
impl TryFrom<serde_json::Value> for TraceContext {
    type Error = String;

    fn try_from(raw: serde_json::Value) -> Result<Self, String> {
        let parent = raw.get("traceparent").and_then(serde_json::Value::as_str);
        let state = raw.get("tracestate").and_then(serde_json::Value::as_str);
        match (raw.is_object(), parent) {
            (true, Some(parent)) => TraceContext::stored(parent, state)
                .ok_or_else(|| format!("invalid traceparent {parent:?}")),
            _ => Err(format!("not a trace context: {raw}")),
        }
    }
}

impl From<TraceContext> for RawTrace {
    fn from(t: TraceContext) -> Self {
        RawTrace {
            traceparent: t.traceparent,
            tracestate: t.tracestate,
        }
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TraceContext {
    /// Parses the two headers as W3C Trace Context says a receiver must: `None` for a
    /// traceparent that is not valid (then the receiver starts a trace of its own); a version
    /// above 00 is read by its 00 fields and kept as 00. A `tracestate` longer than
    /// [`MAX_TRACESTATE_BYTES`], with more than 32 members, or with a character outside
    /// printable ASCII is dropped, the trace kept.
    pub fn from_w3c(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let tp = traceparent.trim_matches([' ', '\t']);
        let version = tp.get(..2)?;
        if !is_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
        let fits = if version == "00" {
            tp.len() == 55
        } else {
            tp.len() == 55 || (tp.len() > 55 && tp.as_bytes()[55] == b'-')
        };
        if !fits || !tp.is_char_boundary(55) {
            return None;
        }
        Self::stored(
            &format!("00{}", &tp[2..55]),
            tracestate.map(|s| s.trim_matches([' ', '\t'])),
        )
    }

    /// A context as a job record keeps it: the version 00 traceparent exactly (lower-case
    /// hex, neither id all zeros) and a tracestate of 1 to [`MAX_TRACESTATE_BYTES`]
    /// printable ASCII characters in at most 32 members, else none. The coordinator's
    /// scripts keep a trace by the same rule (`trace_of` in `common.lua`).
    #[doc(hidden)]
    pub fn stored(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let parts: Vec<&str> = traceparent.split('-').collect();
        let ["00", trace_id, parent_id, flags] = parts[..] else {
            return None;
        };
        let valid = trace_id.len() == 32
            && parent_id.len() == 16
            && flags.len() == 2
            && is_hex(trace_id)
            && is_hex(parent_id)
            && is_hex(flags)
            && trace_id.bytes().any(|b| b != b'0')
            && parent_id.bytes().any(|b| b != b'0');
        if !valid {
            return None;
        }
        let tracestate = tracestate
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_TRACESTATE_BYTES
                    && s.split(',').count() <= 32
                    && s.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_owned);
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// The `traceparent` header value (version 00).
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span this context continues (the parent of the next span): 16 hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the caller sampled the trace (flag 01).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }
}

impl std::fmt::Display for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.traceparent)
    }
}

/// Reads an optional trace context, leniently: one that is not valid (written over by another
/// program) is `None`, so a garbled trace never stops a job from being claimed.
#[doc(hidden)]
pub fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TraceContext>, D::Error> {
    let raw = Option::<serde_json::Value>::deserialize(d)?;
    Ok(raw.and_then(|v| serde_json::from_value::<TraceContext>(v).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_and_its_parts_named() {
        let t = TraceContext::from_w3c(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.traceparent(), TP);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(t.tracestate(), Some("congo=t61rcWkgMzE"));
        let unsampled = TraceContext::from_w3c(&TP.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn an_invalid_traceparent_is_none() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(TraceContext::from_w3c(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_00_fields() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert_eq!(
            TraceContext::from_w3c(later, None).unwrap().traceparent(),
            TP
        );
    }

    #[test]
    fn a_bad_tracestate_is_dropped_and_the_trace_kept() {
        for bad in [
            "x".repeat(MAX_TRACESTATE_BYTES + 1),
            "a=1\n".into(),
            vec!["a=1"; 33].join(","),
            "".into(),
        ] {
            let t = TraceContext::from_w3c(TP, Some(&bad)).unwrap();
            assert_eq!(t.tracestate(), None, "{bad:?}");
        }
    }

    #[test]
    fn stored_contexts_round_trip_and_garbage_reads_as_none() {
        #[derive(Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "lenient")]
            trace: Option<TraceContext>,
        }
        let t = TraceContext::from_w3c(TP, Some("a=1")).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), t);
        let held: Holder = serde_json::from_str(&format!("{{\"trace\":{json}}}")).unwrap();
        assert_eq!(held.trace, Some(t));
        for garbage in [
            r#"{"trace":{"traceparent":"00-zz"}}"#,
            r#"{"trace":7}"#,
            r#"{"trace":null}"#,
            r#"{}"#,
        ] {
            let held: Holder = serde_json::from_str(garbage).unwrap();
            assert_eq!(held.trace, None, "{garbage}");
        }
        assert!(serde_json::from_str::<TraceContext>(r#"{"traceparent":"00-zz"}"#).is_err());
    }
}
