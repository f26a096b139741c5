//! What a fenced write changes, and the one rule for when a list of changes fits the data.
//!
//! A write is all or nothing (ARCHITECTURE.md invariant 8): its whole mutation list is checked —
//! against the stored data *and* against the effect of its own earlier steps — before anything
//! changes. The rule follows Redis exactly, because the Redis sink carries the same rule in Lua
//! (`redis/lua/fenced_write.lua`) and both must agree on every input (the differential
//! property test in `runtime/tests/differential.rs` runs them side by side):
//!
//! - `Set` needs a key that is absent or a string; `HashSet` and `HashIncr` need a key that
//!   is absent or a hash (a type clash is refused, never overwritten).
//! - `HashSet` needs at least one field.
//! - `Delete` takes any key, of any type or absent; later steps of the list see it absent.
//! - `HashIncr` needs the field absent (counts as 0) or holding an integer in Redis' own
//!   syntax (`string2ll`: `0`, or an optional `-` and a digit 1-9 followed by digits, within
//!   `i64`; so `"007"`, `"-0"`, `"+1"`, `" 1"` and `""` are not integers), and the sum must fit
//!   in `i64`. Integers are exact: `by` never passes through a floating-point number.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// A change a fenced sink can apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// Sets a string key.
    Set {
        /// Key.
        key: String,
        /// New value.
        value: String,
    },
    /// Sets fields of a hash (at least one).
    HashSet {
        /// Hash key.
        key: String,
        /// Field/value pairs; a repeated field takes its last value.
        fields: Vec<(String, String)>,
    },
    /// Adds `by` to an integer hash field (missing counts as 0); refused if the sum leaves
    /// `i64`.
    HashIncr {
        /// Hash key.
        key: String,
        /// Field.
        field: String,
        /// Amount, may be negative.
        by: i64,
    },
    /// Removes a key, whatever it holds (an absent one: nothing to do).
    Delete {
        /// Key.
        key: String,
    },
}

impl Mutation {
    /// The key this mutation changes.
    pub fn key(&self) -> &str {
        match self {
            Self::Set { key, .. }
            | Self::HashSet { key, .. }
            | Self::HashIncr { key, .. }
            | Self::Delete { key } => key,
        }
    }
}

/// A value stored by a fenced sink, as read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Value {
    /// A string key.
    Text(String),
    /// A hash.
    Hash(BTreeMap<String, String>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Self::Text(_) => "string",
            Self::Hash(_) => "hash",
        }
    }
}

/// Parses an integer exactly as Redis' `string2ll` does (what `HINCRBY` accepts as a stored
/// value): `"0"`, or an optional `-` then a digit 1-9 then digits, within `i64`. Rust's
/// `str::parse` is laxer (`"+1"`, `"007"`, `"-0"`), which is why this exists.
pub fn redis_integer(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = s == "0"
        || (digits.starts_with(|c: char| matches!(c, '1'..='9'))
            && digits.bytes().all(|b| b.is_ascii_digit()));
    canonical.then(|| s.parse().ok()).flatten()
}

/// Applies `mutations` to `data` whole, or changes nothing and says why (the message names
/// the mutation by its 0-based index; the Redis sink words it identically).
#[doc(hidden)]
pub fn apply_all(
    data: &mut HashMap<String, Value>,
    mutations: Vec<Mutation>,
) -> Result<(), String> {
    // Every touched key is staged (copied once) and changed there; `data` sees the result
    // only when every step has succeeded.
    let mut staged: HashMap<String, Option<Value>> = HashMap::new();
    for (i, m) in mutations.into_iter().enumerate() {
        let (key, want) = match &m {
            Mutation::Set { key, .. } => (key.clone(), "string"),
            Mutation::HashSet { key, .. } | Mutation::HashIncr { key, .. } => (key.clone(), "hash"),
            Mutation::Delete { key } => {
                staged.insert(key.clone(), None);
                continue;
            }
        };
        let slot = staged
            .entry(key.clone())
            .or_insert_with(|| data.get(&key).cloned());
        if let Some(have) = slot.as_ref().map(Value::kind).filter(|have| *have != want) {
            return Err(format!("mutation {i}: {key} holds a {have}, not a {want}"));
        }
        match m {
            Mutation::Set { value, .. } => *slot = Some(Value::Text(value)),
            Mutation::HashSet { fields, .. } => {
                if fields.is_empty() {
                    return Err(format!("mutation {i}: HashSet of {key} has no fields"));
                }
                hash(slot).extend(fields);
            }
            Mutation::HashIncr { field, by, .. } => {
                let fields = hash(slot);
                let current = match fields.get(&field) {
                    None => 0,
                    Some(v) => redis_integer(v)
                        .ok_or_else(|| format!("mutation {i}: {key}.{field} is not an integer"))?,
                };
                let sum = current.checked_add(by).ok_or_else(|| {
                    format!("mutation {i}: {key}.{field} = {current} + {by} overflows i64")
                })?;
                fields.insert(field, sum.to_string());
            }
            // (Staged as absent above.)
            Mutation::Delete { .. } => {}
        }
    }
    for (key, value) in staged {
        match value {
            Some(value) => data.insert(key, value),
            None => data.remove(&key),
        };
    }
    Ok(())
}

/// The hash in `slot`, created empty if absent (the caller has checked the type).
fn hash(slot: &mut Option<Value>) -> &mut BTreeMap<String, String> {
    if !matches!(slot, Some(Value::Hash(_))) {
        *slot = Some(Value::Hash(BTreeMap::new()));
    }
    match slot {
        Some(Value::Hash(h)) => h,
        _ => unreachable!("just made a hash"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(key: &str, field: &str, by: i64) -> Mutation {
        Mutation::HashIncr {
            key: key.into(),
            field: field.into(),
            by,
        }
    }

    fn set(key: &str, value: &str) -> Mutation {
        Mutation::Set {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn integers_follow_redis_string2ll() {
        for ok in [
            "0",
            "7",
            "-7",
            "9223372036854775807",
            "-9223372036854775808",
        ] {
            assert_eq!(redis_integer(ok), ok.parse().ok(), "{ok}");
        }
        for bad in [
            "",
            "-",
            "007",
            "-0",
            "+1",
            " 1",
            "1 ",
            "1.0",
            "1e3",
            "0x10",
            "00",
            "9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
        ] {
            assert_eq!(redis_integer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_clash_leaves_earlier_steps_unapplied() {
        let mut data = HashMap::new();
        let m = vec![
            set("doc", "v11"),
            Mutation::HashSet {
                key: "doc".into(),
                fields: vec![("f".into(), "x".into())],
            },
        ];
        let why = apply_all(&mut data, m).unwrap_err();
        assert_eq!(why, "mutation 1: doc holds a string, not a hash");
        assert!(data.is_empty(), "nothing applied");
    }

    #[test]
    fn overflow_is_checked_against_earlier_steps() {
        let mut data = HashMap::new();
        apply_all(&mut data, vec![incr("b", "n", i64::MAX - 10)]).unwrap();
        let why = apply_all(&mut data, vec![incr("b", "n", 5), incr("b", "n", 1000)]).unwrap_err();
        assert!(
            why.starts_with("mutation 1: b.n = 9223372036854775802 + 1000"),
            "{why}"
        );
        let Some(Value::Hash(h)) = data.get("b") else {
            panic!()
        };
        assert_eq!(h["n"], (i64::MAX - 10).to_string(), "the +5 was not kept");
        apply_all(&mut data, vec![incr("b", "n", 10)]).unwrap();
        apply_all(
            &mut data,
            vec![incr("b", "n", i64::MIN), incr("b", "n", i64::MIN)],
        )
        .unwrap_err();
        apply_all(
            &mut data,
            vec![incr("b", "n", i64::MIN), incr("b", "n", -1)],
        )
        .unwrap();
        let Some(Value::Hash(h)) = data.get("b") else {
            panic!()
        };
        assert_eq!(h["n"], "-2", "MAX + MIN + -1");
        apply_all(&mut data, vec![incr("b", "n", i64::MIN + 2)]).unwrap();
        apply_all(&mut data, vec![incr("b", "n", -1)]).unwrap_err();
    }

    #[test]
    fn non_canonical_stored_integers_are_refused() {
        let mut data = HashMap::new();
        for v in ["007", "-0", "", "12345678901234567890123"] {
            apply_all(
                &mut data,
                vec![Mutation::HashSet {
                    key: "h".into(),
                    fields: vec![("f".into(), v.into())],
                }],
            )
            .unwrap();
            let why = apply_all(&mut data, vec![incr("h", "f", 1)]).unwrap_err();
            assert_eq!(why, "mutation 0: h.f is not an integer", "{v:?}");
        }
    }

    #[test]
    fn empty_hash_set_is_refused_and_steps_see_each_other() {
        let mut data = HashMap::new();
        let empty = Mutation::HashSet {
            key: "h".into(),
            fields: vec![],
        };
        assert!(apply_all(&mut data, vec![empty]).is_err());
        let steps = vec![
            Mutation::HashSet {
                key: "h".into(),
                fields: vec![("f".into(), "x".into())],
            },
            incr("h", "f", 1),
        ];
        assert!(
            apply_all(&mut data, steps).is_err(),
            "f was set to x one step earlier"
        );
        assert!(data.is_empty());
    }

    /// Killed mutants (issue 23's mutation run): each mutation names the key it changes (the
    /// Redis sink routes a write to its key's slot and checks it by this name).
    #[test]
    fn each_mutation_names_its_key() {
        let hash = Mutation::HashSet {
            key: "h".into(),
            fields: vec![("f".into(), "v".into())],
        };
        let (s, i) = (set("s", "v"), incr("i", "f", 1));
        assert_eq!([s.key(), hash.key(), i.key()], ["s", "h", "i"]);
    }
}
