//! What one stream follows: its keys and patterns, each once, within the
//! stream's limits. The one place those limits are checked, as the keys
//! are named (an HTTP request is refused before it decodes an unbounded
//! list) and once more, whole, when the stream starts.

use bytes::Bytes;

use super::error::WatchError;

/// Patterns one stream may follow (a key records which of its stream's
/// patterns follow it in one `u64`).
pub(super) const MAX_PATTERNS_PER_STREAM: usize = 64;

/// The keys and patterns of one stream, in the order first named, each
/// once.
#[derive(Debug, Clone)]
pub struct Selection {
    keys: Vec<Bytes>,
    patterns: Vec<Bytes>,
    /// Keys and patterns together may be at most this many.
    max: usize,
}

impl Selection {
    /// An empty selection of at most `max` keys and patterns together
    /// (`--max-keys-per-stream`).
    pub fn new(max: usize) -> Self {
        Self {
            keys: Vec::new(),
            patterns: Vec::new(),
            max,
        }
    }

    /// A selection of `keys` alone.
    pub fn of_keys(keys: impl IntoIterator<Item = Bytes>, max: usize) -> Result<Self, WatchError> {
        let mut selection = Self::new(max);
        for key in keys {
            selection.add_key(key)?;
        }
        Ok(selection)
    }

    /// Adds `key`; a key named twice is one key (and counts once).
    pub fn add_key(&mut self, key: Bytes) -> Result<(), WatchError> {
        add(&mut self.keys, key)?;
        self.within_max()
    }

    /// Adds `pattern`; a pattern named twice is one pattern.
    pub fn add_pattern(&mut self, pattern: Bytes) -> Result<(), WatchError> {
        add(&mut self.patterns, pattern)?;
        self.within_max()
    }

    fn within_max(&self) -> Result<(), WatchError> {
        if self.keys.len() + self.patterns.len() > self.max {
            return Err(WatchError::TooManyKeysPerStream(self.max));
        }
        Ok(())
    }

    /// Whether the selection may start a stream: it names something, and
    /// no more patterns than a stream follows.
    pub(super) fn check(&self) -> Result<(), WatchError> {
        if self.keys.is_empty() && self.patterns.is_empty() {
            return Err(WatchError::NoKeys);
        }
        self.within_max()?;
        if self.patterns.len() > MAX_PATTERNS_PER_STREAM {
            return Err(WatchError::TooManyKeysPerStream(MAX_PATTERNS_PER_STREAM));
        }
        Ok(())
    }

    pub(super) fn keys(&self) -> &[Bytes] {
        &self.keys
    }

    pub(super) fn patterns(&self) -> &[Bytes] {
        &self.patterns
    }
}

/// Adds `name` to `names` unless it is there; an empty name is refused.
fn add(names: &mut Vec<Bytes>, name: Bytes) -> Result<(), WatchError> {
    if name.is_empty() {
        return Err(WatchError::EmptyKey);
    }
    if !names.contains(&name) {
        names.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_given_twice_counts_once_and_the_limit_holds_as_names_come() {
        let mut selection = Selection::new(2);
        selection.add_key(Bytes::from_static(b"a")).unwrap();
        selection.add_key(Bytes::from_static(b"a")).unwrap();
        selection.add_pattern(Bytes::from_static(b"s/*")).unwrap();
        selection.add_pattern(Bytes::from_static(b"s/*")).unwrap();
        assert_eq!(selection.keys(), [Bytes::from_static(b"a")]);
        assert!(matches!(
            selection.add_key(Bytes::from_static(b"b")),
            Err(WatchError::TooManyKeysPerStream(2))
        ));
    }

    #[test]
    fn an_empty_selection_or_name_and_too_many_patterns_are_refused() {
        assert!(matches!(
            Selection::new(10).check(),
            Err(WatchError::NoKeys)
        ));
        assert!(matches!(
            Selection::new(10).add_key(Bytes::new()),
            Err(WatchError::EmptyKey)
        ));
        let mut selection = Selection::new(1000);
        for n in 0..=MAX_PATTERNS_PER_STREAM {
            selection
                .add_pattern(Bytes::from(format!("p{n}/*")))
                .unwrap();
        }
        assert!(matches!(
            selection.check(),
            Err(WatchError::TooManyKeysPerStream(MAX_PATTERNS_PER_STREAM))
        ));
    }
}
