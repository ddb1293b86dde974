//! Files read and parsed at start (their first load is the start-up
//! check) and read again every check interval, the last value that parsed
//! staying in force while a file is unreadable or does not parse. What a
//! load records (metrics, log lines) is said once, by the files' [`Reload`].
//!
//! Most kinds are one file; a TLS certificate and its key are two, read and
//! parsed together so that a value never mixes an old one with a new one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// How one kind of file (or set of files) is parsed, and what its loads
/// record.
pub trait Reload: fmt::Debug + Send + Sync + 'static {
    /// What the files parse into.
    type Value: fmt::Debug + Send + Sync + 'static;

    /// The files' bytes, one per path in the order given, as a value, or
    /// why not (which file is at fault, and one line).
    fn parse(&self, contents: &[Vec<u8>]) -> Result<Self::Value, FileError>;

    /// Records a value put in force: `first` at start, else a change.
    fn installed(&self, paths: &[PathBuf], value: &Self::Value, first: bool);

    /// Records a read or parse that failed after start, the previous value
    /// staying (once per failure, not at every check).
    fn kept(&self, paths: &[PathBuf], error: &str);
}

/// Why files did not load: which of them (its index among the paths) and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file at fault, by its place among the paths.
    pub file: usize,
    /// Why, one line (without the file's name).
    pub message: String,
}

impl FileError {
    /// A fault of the file at `file`.
    pub fn new(file: usize, message: impl Into<String>) -> Self {
        Self {
            file,
            message: message.into(),
        }
    }
}

/// A fault of the first (or only) file.
impl From<String> for FileError {
    fn from(message: String) -> Self {
        Self::new(0, message)
    }
}

/// A [`FileError`] with the file's path, for a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file at fault, by its place among the paths.
    pub file: usize,
    /// `<path>: <why>`.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn located(paths: &[PathBuf], error: FileError) -> LoadError {
    let path = paths
        .get(error.file)
        .map_or(Path::new(""), PathBuf::as_path);
    LoadError {
        file: error.file,
        message: format!("{}: {}", path.display(), error.message),
    }
}

/// The value in force, read again from its files when they change; cheap
/// to clone.
#[derive(Debug)]
pub struct ReloadingFile<R: Reload>(Arc<Shared<R>>);

impl<R: Reload> Clone for ReloadingFile<R> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

#[derive(Debug)]
struct Shared<R: Reload> {
    paths: Vec<PathBuf>,
    reload: R,
    current: RwLock<Arc<R::Value>>,
}

impl<R: Reload> ReloadingFile<R> {
    /// Reads and parses `paths` (an error says which file and why) and,
    /// when `check_interval` is given, starts reading them again that often
    /// in the background (so this must run inside a Tokio runtime), for as
    /// long as the returned handle or a clone of it lives.
    pub fn load(
        paths: Vec<PathBuf>,
        reload: R,
        check_interval: Option<Duration>,
    ) -> Result<Self, LoadError> {
        let contents = read_all(&paths).map_err(|error| located(&paths, error))?;
        let value = reload
            .parse(&contents)
            .map_err(|error| located(&paths, error))?;
        reload.installed(&paths, &value, true);
        let file = Self(Arc::new(Shared {
            paths,
            reload,
            current: RwLock::new(Arc::new(value)),
        }));
        if let Some(interval) = check_interval {
            tokio::spawn(poll(Arc::downgrade(&file.0), contents, interval));
        }
        Ok(file)
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<R::Value> {
        Arc::clone(&self.0.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// How the files are parsed and recorded.
    pub fn reload(&self) -> &R {
        &self.0.reload
    }

    /// Puts the files' `contents` in force; contents that do not parse
    /// leave the value as it is, recorded.
    fn apply(&self, contents: &[Vec<u8>]) {
        let shared = &self.0;
        match shared.reload.parse(contents) {
            Ok(value) => {
                shared.reload.installed(&shared.paths, &value, false);
                *shared.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
            }
            Err(error) => {
                let error = located(&shared.paths, error);
                shared.reload.kept(&shared.paths, &error.message);
            }
        }
    }
}

/// Every file's bytes, or the first that cannot be read.
fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, FileError> {
    paths
        .iter()
        .enumerate()
        .map(|(at, path)| {
            std::fs::read(path).map_err(|error| FileError::new(at, format!("cannot read: {error}")))
        })
        .collect()
}

/// Reads the files every `interval` while their [`ReloadingFile`] lives,
/// and applies them when their content changed (a ConfigMap or Secret
/// update swaps a symlink: comparing the content catches it whatever the
/// mtime). Files that cannot be read keep the value too, recorded once per
/// outage.
async fn poll<R: Reload>(file: Weak<Shared<R>>, mut last: Vec<Vec<u8>>, interval: Duration) {
    let mut unreadable = false;
    loop {
        tokio::time::sleep(interval).await;
        let Some(shared) = file.upgrade() else {
            return;
        };
        let file = ReloadingFile(shared);
        let paths = file.0.paths.clone();
        let read = tokio::task::spawn_blocking(move || read_all(&paths)).await;
        match read {
            Ok(Ok(contents)) => {
                // Readable again: say how it reads, even if unchanged.
                if contents != last || std::mem::take(&mut unreadable) {
                    file.apply(&contents);
                    last = contents;
                }
            }
            Ok(Err(error)) if !unreadable => {
                unreadable = true;
                let error = located(&file.0.paths, error);
                file.0.reload.kept(&file.0.paths, &error.message);
            }
            Ok(Err(_)) | Err(_) => {}
        }
    }
}
