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

/// Every file's bytes, or the first that cannot be read or changed while
/// it was read.
fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, FileError> {
    paths
        .iter()
        .enumerate()
        .map(|(at, path)| read_whole(path).map_err(|message| FileError::new(at, message)))
        .collect()
}

/// A file's bytes, refused when its length or modification time changed
/// while it was read, or its length is not what was read: a file rewritten
/// in place may be read half-written.
fn read_whole(path: &Path) -> Result<Vec<u8>, String> {
    let stamp = |path: &Path| {
        std::fs::metadata(path)
            .map(|metadata| (metadata.len(), metadata.modified().ok()))
            .map_err(|error| format!("cannot read: {error}"))
    };
    let before = stamp(path)?;
    let bytes = std::fs::read(path).map_err(|error| format!("cannot read: {error}"))?;
    let after = stamp(path)?;
    if before != after || after.0 != bytes.len() as u64 {
        return Err("it changed while being read; write it elsewhere and rename it over".into());
    }
    Ok(bytes)
}

/// What [`poll`] makes of each read: new contents are put in force once
/// they read the same twice in a row, an interval apart, so that a file
/// caught half-written (rewritten in place) is not put in force even when
/// the part written so far parses.
#[derive(Debug)]
struct Settling {
    /// The contents in force (as last read).
    current: Vec<Vec<u8>>,
    /// New contents read once, waiting for the next read to confirm them.
    pending: Option<Vec<Vec<u8>>>,
    /// Whether the last read failed (recorded once per outage).
    unreadable: bool,
}

/// What to do after a read.
#[derive(Debug, PartialEq, Eq)]
enum Settled {
    /// Parse these contents and put them in force (or record why not).
    Apply(Vec<Vec<u8>>),
    /// Record that the files cannot be read.
    Unreadable(FileError),
    /// Nothing to do now.
    Wait,
}

impl Settling {
    fn new(current: Vec<Vec<u8>>) -> Self {
        Self {
            current,
            pending: None,
            unreadable: false,
        }
    }

    fn read(&mut self, read: Result<Vec<Vec<u8>>, FileError>) -> Settled {
        let contents = match read {
            Ok(contents) => contents,
            Err(_) if self.unreadable => return Settled::Wait,
            Err(error) => {
                self.unreadable = true;
                self.pending = None;
                return Settled::Unreadable(error);
            }
        };
        let was_unreadable = std::mem::take(&mut self.unreadable);
        if contents == self.current {
            self.pending = None;
            // Readable again: say how it reads, even if unchanged.
            return match was_unreadable {
                true => Settled::Apply(contents),
                false => Settled::Wait,
            };
        }
        if self.pending.as_ref() == Some(&contents) {
            self.pending = None;
            self.current = contents.clone();
            return Settled::Apply(contents);
        }
        self.pending = Some(contents);
        Settled::Wait
    }
}

/// Reads the files every `interval` while their [`ReloadingFile`] lives,
/// and applies them when their content changed (a ConfigMap or Secret
/// update swaps a symlink: comparing the content catches it whatever the
/// mtime) and read the same at the next check ([`Settling`]). Files that
/// cannot be read keep the value too, recorded once per outage.
async fn poll<R: Reload>(file: Weak<Shared<R>>, last: Vec<Vec<u8>>, interval: Duration) {
    let mut settling = Settling::new(last);
    loop {
        tokio::time::sleep(interval).await;
        let Some(shared) = file.upgrade() else {
            return;
        };
        let file = ReloadingFile(shared);
        let paths = file.0.paths.clone();
        let Ok(read) = tokio::task::spawn_blocking(move || read_all(&paths)).await else {
            continue;
        };
        match settling.read(read) {
            Settled::Apply(contents) => file.apply(&contents),
            Settled::Unreadable(error) => {
                let error = located(&file.0.paths, error);
                file.0.reload.kept(&file.0.paths, &error.message);
            }
            Settled::Wait => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents(text: &str) -> Vec<Vec<u8>> {
        vec![text.as_bytes().to_vec()]
    }

    #[test]
    fn new_contents_are_applied_once_they_read_the_same_twice_in_a_row() {
        let old = "rules: [{keys: [sensors/*/temp]}]";
        let mut settling = Settling::new(contents(old));
        assert_eq!(settling.read(Ok(contents(old))), Settled::Wait);
        // Rewritten in place and read half-written, as text that parses
        // and would widen access; then the rest is written.
        let cut = "rules: [{keys: [sensors/*";
        let new = "rules: [{keys: [sensors/*/humidity]}]";
        assert_eq!(settling.read(Ok(contents(cut))), Settled::Wait);
        assert_eq!(settling.read(Ok(contents(new))), Settled::Wait);
        assert_eq!(
            settling.read(Ok(contents(new))),
            Settled::Apply(contents(new))
        );
        assert_eq!(settling.read(Ok(contents(new))), Settled::Wait);
        // Put back as it was between two reads: nothing is pending.
        assert_eq!(settling.read(Ok(contents(cut))), Settled::Wait);
        assert_eq!(settling.read(Ok(contents(new))), Settled::Wait);
        assert_eq!(settling.read(Ok(contents(cut))), Settled::Wait);
    }

    #[test]
    fn an_unreadable_file_is_recorded_once_and_applied_again_when_readable() {
        let old = "a";
        let mut settling = Settling::new(contents(old));
        let gone = || Err(FileError::new(0, "cannot read: gone"));
        assert_eq!(
            settling.read(gone()),
            Settled::Unreadable(FileError::new(0, "cannot read: gone"))
        );
        assert_eq!(settling.read(gone()), Settled::Wait);
        assert_eq!(
            settling.read(Ok(contents(old))),
            Settled::Apply(contents(old))
        );
        // Back with other contents: those settle first.
        assert!(matches!(settling.read(gone()), Settled::Unreadable(_)));
        assert_eq!(settling.read(Ok(contents("b"))), Settled::Wait);
        assert_eq!(
            settling.read(Ok(contents("b"))),
            Settled::Apply(contents("b"))
        );
    }

    #[test]
    fn a_file_is_read_whole_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, "whole").unwrap();
        assert_eq!(read_whole(&path).unwrap(), b"whole");
        let error = read_whole(&dir.path().join("missing")).unwrap_err();
        assert!(error.starts_with("cannot read"), "{error}");
    }
}
