//! Integers as JSON Schema reads them: `968` and `968.0` are the same integer (a client in a
//! language with one number type, JavaScript's, sends the second), so the API takes both for
//! an integer field, as its OpenAPI document promises. `968.5`, a non-finite number and one
//! outside the field's type are refused (400, naming the field), never rounded or clamped.

use serde::de::{Deserializer, Error, Visitor};

/// For `#[serde(deserialize_with = "integral::de")]`.
pub(crate) fn de<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i128>,
{
    d.deserialize_any(Integral(std::marker::PhantomData))
}

/// For an `Option` field: `#[serde(default, deserialize_with = "integral::opt")]` (a `null`
/// is the field left out).
pub(crate) fn opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i128>,
{
    d.deserialize_option(Optional(std::marker::PhantomData))
}

struct Integral<T>(std::marker::PhantomData<T>);

impl<T> Integral<T> {
    fn fit<E: Error>(n: i128) -> Result<T, E>
    where
        T: TryFrom<i128>,
    {
        T::try_from(n).map_err(|_| E::custom(format!("{n} is out of range for this field")))
    }
}

impl<T: TryFrom<i128>> Visitor<'_> for Integral<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: Error>(self, n: i64) -> Result<T, E> {
        Self::fit(i128::from(n))
    }

    fn visit_u64<E: Error>(self, n: u64) -> Result<T, E> {
        Self::fit(i128::from(n))
    }

    fn visit_f64<E: Error>(self, n: f64) -> Result<T, E> {
        // (Past 2^63 no f64 is an integer any field here holds: said as out of range.)
        if !n.is_finite() || n.fract() != 0.0 {
            return Err(E::custom(format!("{n} is not an integer")));
        }
        if n.abs() >= 2f64.powi(63) {
            return Err(E::custom(format!("{n} is out of range for this field")));
        }
        Self::fit(n as i128)
    }
}

struct Optional<T>(std::marker::PhantomData<T>);

impl<'de, T: TryFrom<i128>> Visitor<'de> for Optional<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an integer or null")
    }

    fn visit_none<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        de(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Body {
        #[serde(default, deserialize_with = "super::de")]
        n: u32,
        #[serde(default, deserialize_with = "super::opt")]
        m: Option<i32>,
    }

    /// `968.0` is `968`; a fraction, a number past the field's type or a negative unsigned one
    /// is refused with the reason; `null` and a missing optional field are `None`.
    #[test]
    fn integral_numbers_are_integers_and_nothing_else_is() {
        let read = |s: &str| serde_json::from_str::<Body>(s).map_err(|e| e.to_string());
        assert_eq!(
            read(r#"{"n": 968.0, "m": -2.0}"#),
            Ok(Body {
                n: 968,
                m: Some(-2)
            })
        );
        assert_eq!(read(r#"{"n": 1, "m": null}"#), Ok(Body { n: 1, m: None }));
        assert_eq!(read("{}"), Ok(Body { n: 0, m: None }));
        for (bad, said) in [
            (r#"{"n": 968.5}"#, "not an integer"),
            (r#"{"n": -1}"#, "out of range"),
            (r#"{"n": 4294967296}"#, "out of range"),
            (r#"{"n": 1e300}"#, "out of range"),
            (r#"{"m": 2147483648.0}"#, "out of range"),
            (r#"{"n": "1"}"#, "an integer"),
        ] {
            let err = read(bad).unwrap_err();
            assert!(err.contains(said), "{bad}: {err}");
        }
    }
}
