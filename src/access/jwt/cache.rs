//! Tokens already verified, by the SHA-256 of the token, until they
//! expire: a repeated token costs a hash and a lookup instead of a
//! signature check. Bounded; emptied when the key set changes.

use std::collections::HashMap;
use std::sync::Arc;

/// The digest a token is cached under.
pub(super) type TokenDigest = [u8; 32];

struct Entry {
    subject: Arc<str>,
    /// Unix seconds after which the token no longer passes (`exp` plus
    /// the leeway).
    valid_until: u64,
}

/// Verified tokens of one key set generation.
pub(super) struct TokenCache {
    entries: HashMap<TokenDigest, Entry>,
    capacity: usize,
    generation: u64,
}

impl TokenCache {
    /// An empty cache of at most `capacity` tokens.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            generation: 0,
        }
    }

    /// The subject of a token verified before with the keys of
    /// `generation`, if it is still valid at `now`. Keys of another
    /// generation empty the cache: tokens of a removed key stop passing.
    pub(super) fn get(
        &mut self,
        digest: &TokenDigest,
        now: u64,
        generation: u64,
    ) -> Option<Arc<str>> {
        if generation != self.generation {
            self.reset(generation);
            return None;
        }
        self.entries
            .get(digest)
            .filter(|entry| entry.valid_until >= now)
            .map(|entry| entry.subject.clone())
    }

    /// Remembers a token verified with the keys of `generation`; a token
    /// verified with keys replaced since is not kept.
    pub(super) fn insert(
        &mut self,
        digest: TokenDigest,
        subject: Arc<str>,
        valid_until: u64,
        generation: u64,
        now: u64,
    ) {
        if generation != self.generation {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&digest) {
            self.entries.retain(|_, entry| entry.valid_until >= now);
            // Still full of live tokens: any one goes (it is verified again
            // when it comes back).
            if self.entries.len() >= self.capacity
                && let Some(evicted) = self.entries.keys().next().copied()
            {
                self.entries.remove(&evicted);
            }
        }
        self.entries.insert(
            digest,
            Entry {
                subject,
                valid_until,
            },
        );
    }

    /// Forgets every token: the keys they were verified with are gone.
    pub(super) fn reset(&mut self, generation: u64) {
        self.entries.clear();
        self.entries.shrink_to(self.capacity.min(64));
        self.generation = generation;
    }

    /// Tokens held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> TokenDigest {
        [n; 32]
    }

    #[test]
    fn a_token_is_served_until_it_expires() {
        let mut cache = TokenCache::new(4);
        cache.insert(digest(1), "alice".into(), 100, 0, 50);
        assert_eq!(cache.get(&digest(1), 100, 0).as_deref(), Some("alice"));
        assert_eq!(cache.get(&digest(1), 101, 0), None);
        assert_eq!(cache.get(&digest(2), 50, 0), None);
    }

    #[test]
    fn the_cache_stays_within_its_capacity_dropping_expired_tokens_first() {
        let mut cache = TokenCache::new(3);
        cache.insert(digest(1), "old".into(), 10, 0, 0);
        cache.insert(digest(2), "b".into(), 1000, 0, 0);
        cache.insert(digest(3), "c".into(), 1000, 0, 0);
        cache.insert(digest(4), "d".into(), 1000, 0, 20);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&digest(2), 20, 0).is_some());
        assert!(cache.get(&digest(3), 20, 0).is_some());
        assert!(cache.get(&digest(4), 20, 0).is_some());
        for n in 5..50 {
            cache.insert(digest(n), "e".into(), 1000, 0, 20);
            assert_eq!(cache.len(), 3);
        }
    }

    #[test]
    fn a_new_key_set_empties_it_and_refuses_tokens_verified_with_the_old_one() {
        let mut cache = TokenCache::new(4);
        cache.insert(digest(1), "a".into(), 100, 0, 0);
        // Keys of generation 1 are in force now.
        assert_eq!(cache.get(&digest(1), 0, 1), None);
        assert_eq!(cache.len(), 0);
        // Verified with generation 0 keys while they were replaced.
        cache.insert(digest(2), "b".into(), 100, 0, 0);
        assert_eq!(cache.get(&digest(2), 0, 1), None);
        cache.insert(digest(3), "c".into(), 100, 1, 0);
        assert!(cache.get(&digest(3), 0, 1).is_some());
    }
}
