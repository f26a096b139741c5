//! Small runnable programs live in `examples/`; this crate also compiles and runs the README's
//! code blocks as doctests, so the README cannot drift from the API.
#![doc = include_str!("../../README.md")]
