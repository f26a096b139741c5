//! The installation's format level: which shapes of stored records its processes may write.
//!
//! In the spirit of Kafka's `metadata.version`: every build reads and writes a window of
//! levels ([`LEVELS`]); an installation is at one level (recorded beside each coordinator
//! base's layout generation, absent = [`FIRST`]). A process is refused, before any change, by
//! every script that acts on jobs, flows, groups, roles and schedule marks when the level is
//! outside its window (`PALISADE_FORMAT`, checked by the same scripts that check the layout
//! generation; docs/operations.md lists what is not guarded). A release that brings a new record shape raises
//! its window's top and writes the shape only once the operator has *finalized* the new level
//! (`palisade upgrade finalize`), which is refused while a live process could not read it. So
//! during a rolling deploy old and new processes share the old level, and a rollback before
//! finalizing is always possible; a level is never lowered.
//!
//! Level 1 is the format of release 0.1.0. That release knows no other, so it never writes a
//! record an earlier level could not read.

use std::ops::RangeInclusive;

use crate::store::WorkerBeat;

/// The level an installation is at before any level was recorded: release 0.1.0's format.
pub const FIRST: u32 = 1;

/// The levels this build reads and writes. `redis/lua/common.lua` declares the same window
/// (`FORMAT_LOWEST`, `FORMAT_HIGHEST`); a test holds the two together.
pub const LEVELS: RangeInclusive<u32> = FIRST..=1;

/// The window a live worker reported in its heartbeat; a worker from before heartbeats
/// carried one (a commit before release 0.1.0) reads level [`FIRST`] only.
pub fn window_of(beat: &WorkerBeat) -> RangeInclusive<u32> {
    match beat.formats {
        Some([low, high]) => low..=high,
        None => FIRST..=FIRST,
    }
}

/// Why a finalize is refused, changing nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FinalizeRefused {
    /// This build does not know the level asked for.
    #[error("this binary reads and writes format levels {}..={}, not {_0}", LEVELS.start(), LEVELS.end())]
    Unknown(u32),
    /// Lowering is never allowed: records of the higher level may already exist.
    #[error("the installation is at format level {current}; a level is never lowered (records of level {current} may exist)")]
    Lower {
        /// The installation's level.
        current: u32,
        /// The level asked for.
        to: u32,
    },
    /// Live workers that could not read the new level (each as [`describe`] says it).
    #[error("live workers cannot read format level {to}: {}; upgrade or stop them first", outside.join(", "))]
    Outside {
        /// The level asked for.
        to: u32,
        /// The workers outside, described.
        outside: Vec<String>,
    },
}

/// The rule for `palisade upgrade finalize`: `to` must be a level this build knows, not below
/// `current`, and inside the window of every live worker.
pub fn decide_finalize(current: u32, to: u32, live: &[WorkerBeat]) -> Result<(), FinalizeRefused> {
    if !LEVELS.contains(&to) {
        return Err(FinalizeRefused::Unknown(to));
    }
    if to < current {
        return Err(FinalizeRefused::Lower { current, to });
    }
    let outside = outside(to, live);
    if !outside.is_empty() {
        return Err(FinalizeRefused::Outside { to, outside });
    }
    Ok(())
}

/// The live workers whose window leaves out `level`, described for an operator.
pub fn outside(level: u32, live: &[WorkerBeat]) -> Vec<String> {
    live.iter()
        .filter(|beat| !window_of(beat).contains(&level))
        .map(describe)
        .collect()
}

/// `name on host (pid N), palisade V: levels L..=H`.
pub fn describe(beat: &WorkerBeat) -> String {
    let window = window_of(beat);
    let reported = if beat.formats.is_some() {
        ""
    } else {
        " (reports none: read as)"
    };
    format!(
        "{} on {} (pid {}), palisade {}:{reported} levels {}..={}",
        beat.worker,
        beat.host,
        beat.pid,
        beat.version,
        window.start(),
        window.end()
    )
}

/// An installation's level as recorded (`None`: never recorded, so [`FIRST`]); a record that is
/// not 1 to 9 decimal digits is an error naming it, never read as some level. The scripts'
/// guards (`common.lua`, `wrong_format`) read by the same rule.
pub fn parse_level(recorded: Option<&str>) -> Result<u32, String> {
    match recorded {
        None => Ok(FIRST),
        Some(text) if (1..=9).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse()
                .map_err(|_| format!("format level {text:?} out of range"))
        }
        Some(text) => Err(format!("format level record holds {text:?}, not a level")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(name: &str, formats: Option<[u32; 2]>) -> WorkerBeat {
        WorkerBeat {
            worker: name.into(),
            host: "h".into(),
            pid: 7,
            version: "0.1.0".into(),
            queues: vec![],
            concurrency: 1,
            running: 0,
            started_ms: 0,
            seen_ms: 0,
            formats,
            retry: None,
        }
    }

    #[test]
    fn a_worker_without_a_window_reads_the_first_level_only() {
        assert_eq!(window_of(&beat("old", None)), 1..=1);
        assert_eq!(window_of(&beat("new", Some([1, 3]))), 1..=3);
    }

    #[test]
    fn finalize_refuses_unknown_lower_and_unreadable_levels() {
        let top = *LEVELS.end();
        assert_eq!(
            decide_finalize(top + 1, top + 2, &[]),
            Err(FinalizeRefused::Unknown(top + 2))
        );
        assert_eq!(
            decide_finalize(FIRST, FIRST, &[beat("a", Some([FIRST, top]))]),
            Ok(())
        );
        // A level above the build's own is never "lowered" to by a newer one: refused as lower.
        let above = decide_finalize(top + 1, top, &[]);
        assert!(
            matches!(above, Err(FinalizeRefused::Lower { .. })),
            "{above:?}"
        );
        // A live worker whose window leaves the level out (a later release reading only a
        // level above it) names itself.
        let refused = decide_finalize(FIRST, FIRST, &[beat("later", Some([top + 1, top + 1]))]);
        match refused {
            Err(FinalizeRefused::Outside { outside, .. }) => {
                assert_eq!(outside.len(), 1);
                assert!(outside[0].starts_with("later on h (pid 7)"), "{outside:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_level_record_is_a_plain_decimal_or_an_error() {
        assert_eq!(parse_level(None), Ok(FIRST));
        assert_eq!(parse_level(Some("2")), Ok(2));
        assert_eq!(parse_level(Some("000000001")), Ok(1));
        for bad in [
            "",
            "-1",
            "1.0",
            "1e0",
            " 1",
            "+1",
            "0000000001",
            "99999999999",
            "x",
            "１",
        ] {
            assert!(parse_level(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
