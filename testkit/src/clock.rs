//! A skewed clock for a process under test: libfaketime (Debian's `libfaketime`), preloaded,
//! reads an offset from a file on every call, so a test moves a running process's wall clock
//! ahead, behind, or jumps it, without touching the machine's. Only the wall clock
//! (`CLOCK_REALTIME`, what Redis' `TIME`, its key expiry and our logs read) is skewed: a
//! monotonic clock never steps on a real host either, and leases are measured on it.
//!
//! Debian's redis-server allocates with jemalloc, whose initialisation calls `clock_gettime`
//! and recurses into libfaketime before it is ready (libfaketime issue #130). Preloading
//! tcmalloc first (`libtcmalloc-minimal4`) serves those early allocations; jemalloc then
//! starts after libfaketime. `.ci/run` installs both packages.

use std::path::{Path, PathBuf};

/// Where Debian puts a preloadable library, for this machine's architecture.
fn library(names: &[&str]) -> PathBuf {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ];
    dirs.iter()
        .flat_map(|dir| names.iter().map(move |name| Path::new(dir).join(name)))
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!("{names:?} is not installed (.ci/run installs libfaketime and libtcmalloc-minimal4)")
        })
}

/// One process's clock: an offset from the real time, changed at any moment with
/// [`SkewedClock::set`].
pub struct SkewedClock {
    file: PathBuf,
}

impl SkewedClock {
    /// A clock at the real time, its offset kept in `dir`.
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let clock = Self {
            file: dir.join(format!("faketime-{}", uuid::Uuid::new_v4())),
        };
        clock.set(0);
        clock
    }

    /// Puts the clock `seconds` ahead of the real time (behind when negative), from the
    /// process's next reading on: a jump, whichever way.
    pub fn set(&self, seconds: i64) {
        // Written aside and renamed over: the process reads the file on every clock call and
        // must never see it half-written (empty: the real time, for a moment).
        let next = self.file.with_extension("next");
        std::fs::write(&next, format!("{seconds:+}\n")).unwrap();
        std::fs::rename(&next, &self.file).unwrap();
    }

    /// The environment that makes a process read this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        let preload = [
            library(&["libtcmalloc_minimal.so.4"]),
            library(&["faketime/libfaketime.so.1"]),
        ];
        vec![
            (
                "LD_PRELOAD".into(),
                preload
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            ),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file.display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }
}
