//! A file read and parsed at start (its first load is the start-up check)
//! and read again every check interval, the last value that parsed staying
//! in force while the file is unreadable or does not parse. What a load
//! records (metrics, log lines) is said once, by the file's [`Reload`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// How one kind of file is parsed, and what its loads record.
pub trait Reload: std::fmt::Debug + Send + Sync + 'static {
    /// What the file parses into.
    type Value: std::fmt::Debug + Send + Sync + 'static;

    /// The file's bytes as a value, or why not (one line).
    fn parse(&self, bytes: &[u8]) -> Result<Self::Value, String>;

    /// Records a value put in force: `first` at start, else a change.
    fn installed(&self, path: &Path, value: &Self::Value, first: bool);

    /// Records a read or parse that failed after start, the previous value
    /// staying (once per failure, not at every check).
    fn kept(&self, path: &Path, error: &str);
}

/// The value in force, read again from its file when it changes; cheap to
/// clone.
#[derive(Debug)]
pub struct ReloadingFile<R: Reload>(Arc<Shared<R>>);

impl<R: Reload> Clone for ReloadingFile<R> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

#[derive(Debug)]
struct Shared<R: Reload> {
    path: PathBuf,
    reload: R,
    current: RwLock<Arc<R::Value>>,
}

impl<R: Reload> ReloadingFile<R> {
    /// Reads and parses `path` (an error says which file and why) and,
    /// when `check_interval` is given, starts reading it again that often
    /// in the background (so this must run inside a Tokio runtime), for as
    /// long as the returned handle or a clone of it lives.
    pub fn load(
        path: PathBuf,
        reload: R,
        check_interval: Option<Duration>,
    ) -> Result<Self, String> {
        let bytes = std::fs::read(&path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let value = reload
            .parse(&bytes)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        reload.installed(&path, &value, true);
        let file = Self(Arc::new(Shared {
            path,
            reload,
            current: RwLock::new(Arc::new(value)),
        }));
        if let Some(interval) = check_interval {
            tokio::spawn(poll(Arc::downgrade(&file.0), bytes, interval));
        }
        Ok(file)
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<R::Value> {
        Arc::clone(&self.0.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// How the file is parsed and recorded.
    pub fn reload(&self) -> &R {
        &self.0.reload
    }

    /// Puts the file's `bytes` in force; bytes that do not parse leave the
    /// value as it is, recorded.
    fn apply(&self, bytes: &[u8]) {
        let shared = &self.0;
        match shared.reload.parse(bytes) {
            Ok(value) => {
                shared.reload.installed(&shared.path, &value, false);
                *shared.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
            }
            Err(error) => shared.reload.kept(&shared.path, &error),
        }
    }
}

/// Reads the file every `interval` while its [`ReloadingFile`] lives, and
/// applies it when its content changed (a ConfigMap or Secret update swaps
/// a symlink: comparing the content catches it whatever the mtime). A file
/// that cannot be read keeps the value too, recorded once per outage.
async fn poll<R: Reload>(file: Weak<Shared<R>>, mut last: Vec<u8>, interval: Duration) {
    let mut unreadable = false;
    loop {
        tokio::time::sleep(interval).await;
        let Some(shared) = file.upgrade() else {
            return;
        };
        let file = ReloadingFile(shared);
        match tokio::fs::read(&file.0.path).await {
            Ok(bytes) => {
                // Readable again: say how it reads, even if unchanged.
                if bytes != last || std::mem::take(&mut unreadable) {
                    file.apply(&bytes);
                    last = bytes;
                }
            }
            Err(error) if !unreadable => {
                unreadable = true;
                let path = &file.0.path;
                let error = format!("cannot read {}: {error}", path.display());
                file.0.reload.kept(path, &error);
            }
            Err(_) => {}
        }
    }
}
