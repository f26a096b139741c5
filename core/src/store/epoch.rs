//! Durable epoch sources: somewhere the coordinator's epoch survives when Redis loses its data.
//!
//! With one configured, a coordinator that finds its counters unproven moves to an epoch the
//! lost Redis could never have used, so recovery is seamless. Without one, safety still holds
//! (sinks refuse lower and conflicting tokens) and liveness comes back by reseeding above the
//! token a sink reports.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::ids::FencingToken;

/// Hands out epochs that only grow, and remembers them somewhere a Redis data loss cannot reach.
#[async_trait]
pub trait EpochSource: Send + Sync + 'static {
    /// Durably records and returns an epoch greater than every epoch it returned before and at
    /// least `at_least`.
    async fn next_epoch(&self, at_least: u32) -> Result<u32>;
}

/// An fsynced local file, for a coordinator whose workers all live on one host.
///
/// The file holds one decimal number. Updates go to a temporary file that is fsynced and
/// renamed over the old one, then the directory is fsynced, so a crash leaves either the old
/// or the new epoch — never a torn or lost one. An exclusive lock serialises processes.
#[derive(Debug, Clone)]
pub struct FileEpochSource {
    path: PathBuf,
}

impl FileEpochSource {
    /// Epochs kept in `path` (created on first use).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Checks, without changing it, that the file can serve epochs: its folder can hold the
    /// file and its lock, and the file (if any) holds an epoch with room above it. Meant for
    /// start-up, so a bad file stops a worker at once instead of failing every claim.
    pub fn check(&self) -> Result<()> {
        let epoch = |e: std::io::Error| {
            let what = format!("epoch file {}: {e}", self.path.display());
            if e.kind() == std::io::ErrorKind::InvalidData {
                Error::Epoch(what)
            } else {
                Error::Config(what)
            }
        };
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(epoch)?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path.with_extension("lock"))
            .map_err(epoch)?;
        match std::fs::read_to_string(&self.path) {
            Ok(text) => match text.trim().parse::<u32>() {
                Ok(e) if e < FencingToken::MAX_EPOCH => Ok(()),
                Ok(e) => Err(Error::Epoch(format!(
                    "epoch file {} holds epoch {e}: none left above it",
                    self.path.display()
                ))),
                Err(e) => Err(Error::Epoch(format!(
                    "epoch file {} does not hold an epoch: {e}",
                    self.path.display()
                ))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(epoch(e)),
        }
    }

    fn bump(path: &Path, at_least: u32) -> std::io::Result<u32> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let lock = std::fs::File::create(path.with_extension("lock"))?;
        lock.lock()?;
        let current = match std::fs::read_to_string(path) {
            Ok(text) => text.trim().parse::<u32>().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} does not hold an epoch: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let next = current.saturating_add(1).max(at_least);
        if next > FencingToken::MAX_EPOCH {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} would move to epoch {next}, above the largest ({})",
                    path.display(),
                    FencingToken::MAX_EPOCH
                ),
            ));
        }
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp)?;
        writeln!(file, "{next}")?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(next)
    }
}

#[async_trait]
impl EpochSource for FileEpochSource {
    async fn next_epoch(&self, at_least: u32) -> Result<u32> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || Self::bump(&path, at_least))
            .await
            .map_err(|e| Error::Unavailable(format!("epoch file task: {e}")))?
            .map_err(|e| {
                // A file that does not hold an epoch, or one that ran out, stays that way:
                // permanent. Anything else (disk full, permissions being fixed) may pass.
                let what = format!("epoch file {}: {e}", self.path.display());
                if e.kind() == std::io::ErrorKind::InvalidData {
                    Error::Epoch(what)
                } else {
                    Error::Unavailable(what)
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_epochs_only_grow_and_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("palisade-epoch-{}", uuid::Uuid::new_v4()));
        let path = dir.join("epoch");
        let source = FileEpochSource::new(&path);
        assert_eq!(source.next_epoch(0).await.unwrap(), 1);
        assert_eq!(source.next_epoch(0).await.unwrap(), 2);
        assert_eq!(source.next_epoch(10).await.unwrap(), 10);
        let reopened = FileEpochSource::new(&path);
        assert_eq!(reopened.next_epoch(3).await.unwrap(), 11);
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(reopened.next_epoch(0).await, Err(Error::Epoch(_))));
        assert!(matches!(reopened.check(), Err(Error::Epoch(_))));
        std::fs::write(&path, "41").unwrap();
        assert!(reopened.check().is_ok());
        std::fs::write(&path, format!("{}", FencingToken::MAX_EPOCH)).unwrap();
        assert!(matches!(reopened.check(), Err(Error::Epoch(_))));
        let exhausted = reopened.next_epoch(0).await;
        assert!(matches!(exhausted, Err(Error::Epoch(_))), "{exhausted:?}");
        assert!(!exhausted.unwrap_err().is_retryable());
        std::fs::write(&path, format!("{}", u32::MAX)).unwrap();
        assert!(matches!(reopened.next_epoch(0).await, Err(Error::Epoch(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
