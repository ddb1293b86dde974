//! The state store itself: values, versions, fencing tokens, expiry, quota
//! and KEYNOTIFY registrations. Pure and synchronous: every command is a
//! method that takes the request's envelope values and the time, and returns
//! an [`Outcome`] (the reply, the version for `__ts`, the notifications to
//! publish and the records to make durable). The MQTT layer only translates.
//!
//! Keys are kept in byte order so that SCAN can resume strictly after the
//! last key it looked at: a key present for a whole listing is listed once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::acl::{Access, AccessList};
use super::entry::Entry;
use super::persist::Record;
use crate::protocol::glob;
use crate::protocol::resp::bulk_encoded_len;
use crate::protocol::{
    Hlc, KeyPage, Notification, Reply, SetCondition, SetOptions, StoreError, notify_topic,
};

/// The node id of every version the store hands out, as the real service.
pub const NODE_ID: &str = "StateStore";

/// The longest MQTT topic (a UTF-8 string with a 16-bit length). A
/// notification topic carries the client id and the key in hex, so a key
/// over ~32 KiB cannot be notified; rumqttc would truncate the length and
/// corrupt the connection, so such a registration is refused instead.
pub const MAX_TOPIC_BYTES: usize = 65_535;

/// The error for a KEYNOTIFY whose notification topic cannot exist (the
/// service documents no string for it; clients survive unknown strings).
pub const KEY_TOO_LONG_TO_WATCH: &str =
    "the key is too long to be watched: its notification topic would exceed 65535 bytes";

/// The error for a SCAN page that cannot hold the next key together with
/// the continuation token within the reply size limit: only keys of
/// nearly the broker's maximum packet size meet it.
pub const KEY_TOO_LONG_TO_LIST: &str = "the key is too long to be listed: a page holding it and its continuation token would exceed the broker's maximum packet size";

/// The most bytes of a key a SCAN token holds; a longer key is cut there
/// and followed by its SHA-256.
pub const KEY_IN_TOKEN: usize = 512;

/// The key part of a token for a key over [`KEY_IN_TOKEN`] bytes.
const LONG_KEY_IN_TOKEN: usize = KEY_IN_TOKEN + 32;

/// Where a SCAN resumes: strictly after a key, or at the first key from
/// some bytes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume<'a> {
    After(&'a [u8]),
    From(&'a [u8]),
}

/// How much one SCAN page may hold and cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Most keys in one page.
    pub max_keys: usize,
    /// Most keys looked at for one page, listed or not: a selective pattern
    /// over a big store gets empty pages with a token instead of holding
    /// the store (and every other client) for the whole walk.
    pub max_examined: usize,
    /// Most key bytes looked at for one page (at least one key is).
    pub max_examined_bytes: usize,
    /// Most glob steps ([`glob::matches_counting`]) spent on one page (at
    /// least one key is matched): a pattern that backtracks over long keys
    /// gets short pages instead of holding the store for seconds.
    pub max_match_steps: u64,
}

impl Default for ScanLimits {
    fn default() -> Self {
        Self {
            max_keys: 1_000,
            max_examined: 10_000,
            max_examined_bytes: 4 << 20,
            // About a millisecond of matching in a release build.
            max_match_steps: 1_000_000,
        }
    }
}

/// Limits that make `the quota has been exceeded` reachable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Most keys the store holds.
    pub max_keys: Option<usize>,
    /// Most bytes (keys plus values) the store holds.
    pub max_bytes: Option<usize>,
}

/// The MQTT5 envelope values a command depends on, still as text: parsing
/// them is part of the command (its errors are the store's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Envelope<'a> {
    /// `__srcId`: who registers KEYNOTIFY.
    pub client_id: &'a str,
    /// `__ts`: the client's clock (required on SET).
    pub timestamp: Option<&'a str>,
    /// `__ft`: the fencing token.
    pub fencing_token: Option<&'a str>,
    /// `aio-persistence: true` on a SET.
    pub persist: bool,
    /// The largest reply payload the response can carry (the broker's
    /// maximum packet size less the reply's topic and properties); `None`
    /// when nothing limits it. Sizes SCAN pages.
    pub reply_limit: Option<usize>,
    /// Who may read what: SCAN lists only keys `client_id` may read.
    pub acl: Option<&'a AccessList>,
}

/// A notification to publish: `client_id` watches `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatcherNotice {
    /// The watcher.
    pub client_id: String,
    /// The key that changed.
    pub key: Bytes,
    /// What happened.
    pub notification: Notification,
    /// The key's version after the change (`__ts`).
    pub version: Hlc,
}

/// A reply payload: the five verbs' [`Reply`], or SCAN's page of keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Every reply but a SCAN page (SCAN's errors too).
    Reply(Reply),
    /// A page of SCAN.
    Page(KeyPage),
}

impl Answer {
    /// The payload as the service sends it.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Reply(reply) => reply.encode(),
            Self::Page(page) => page.encode(),
        }
    }
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Self {
        Self::Reply(reply)
    }
}

impl PartialEq<Reply> for Answer {
    fn eq(&self, other: &Reply) -> bool {
        matches!(self, Self::Reply(reply) if reply == other)
    }
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The reply payload.
    pub reply: Answer,
    /// `__ts` of the reply; `None` when there is no key to speak of.
    pub version: Option<Hlc>,
    /// Notifications to publish once the records are durable.
    pub events: Vec<WatcherNotice>,
    /// Changes to persisted keys, to append to the log before replying.
    pub records: Vec<Record>,
}

impl Outcome {
    fn reply(reply: Reply, version: Option<Hlc>) -> Self {
        Self {
            reply: reply.into(),
            version,
            events: Vec::new(),
            records: Vec::new(),
        }
    }

    pub(crate) fn error(error: StoreError) -> Self {
        Self::reply(Reply::Error(error), None)
    }
}

/// The whole store.
#[derive(Debug)]
pub struct Keyspace {
    /// In byte order, for SCAN.
    entries: BTreeMap<Bytes, Entry>,
    /// (expiry time, key) of every key with a PX, soonest first.
    expiries: BTreeSet<(u64, Bytes)>,
    /// key -> client ids registered with KEYNOTIFY.
    watchers: HashMap<Bytes, BTreeSet<String>>,
    /// client id -> keys, to drop a client's registrations at once.
    watched: HashMap<String, HashSet<Bytes>>,
    clock: Hlc,
    quota: Quota,
    bytes: usize,
    /// Starts every continuation token this store issues.
    id: u64,
    scan_limits: ScanLimits,
}

impl Keyspace {
    /// An empty store whose clock starts at `now_ms`, with a random id
    /// (see [`Keyspace::set_id`]) and the default [`ScanLimits`].
    pub fn new(quota: Quota, now_ms: u64) -> Self {
        Self {
            entries: BTreeMap::new(),
            expiries: BTreeSet::new(),
            watchers: HashMap::new(),
            watched: HashMap::new(),
            clock: Hlc::new(now_ms, NODE_ID),
            quota,
            bytes: 0,
            id: rand::random(),
            scan_limits: ScanLimits::default(),
        }
    }

    /// The id that starts this store's continuation tokens: a token that
    /// does not start with it was not issued by this store and is refused.
    /// A persisted store keeps its id, so that a listing survives a restart.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sets the id (a persisted store's, read back at start-up).
    pub fn set_id(&mut self, id: u64) {
        self.id = id;
    }

    /// Sets the page limits of SCAN (each at least 1).
    pub fn set_scan_limits(&mut self, limits: ScanLimits) {
        self.scan_limits = ScanLimits {
            max_keys: limits.max_keys.max(1),
            max_examined: limits.max_examined.max(1),
            max_examined_bytes: limits.max_examined_bytes.max(1),
            max_match_steps: limits.max_match_steps.max(1),
        };
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The stored entry of `key`, if any (expired keys linger until
    /// [`Keyspace::expire`] runs).
    pub fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Runs one decoded request; expired keys are removed first so that no
    /// command ever sees one.
    pub fn execute(
        &mut self,
        request: crate::protocol::Request,
        envelope: &Envelope<'_>,
        now_ms: u64,
    ) -> Outcome {
        use crate::protocol::Request;
        let expired = self.expire(now_ms);
        let mut outcome = match request {
            Request::Set {
                key,
                value,
                options,
            } => self.set(key, value, options, envelope, now_ms),
            Request::Get { key } => self.get(&key, envelope, now_ms),
            Request::Del { key } => self.del(key, None, envelope, now_ms),
            Request::VDel { key, value } => self.del(key, Some(value), envelope, now_ms),
            Request::KeyNotify { key, stop } => self.key_notify(envelope.client_id, key, stop),
            Request::Scan { pattern, token } => self.scan(&pattern, token.as_deref(), envelope),
        };
        if !expired.events.is_empty() || !expired.records.is_empty() {
            outcome.events.splice(0..0, expired.events);
            outcome.records.splice(0..0, expired.records);
        }
        outcome
    }

    /// `SET key value [NX|NEX] [PX ms]`.
    pub fn set(
        &mut self,
        key: Bytes,
        value: Bytes,
        options: SetOptions,
        envelope: &Envelope<'_>,
        now_ms: u64,
    ) -> Outcome {
        let timestamp = match envelope.timestamp {
            None => return Outcome::error(StoreError::MissingTimestamp),
            Some(text) => match parse_timestamp(text, now_ms) {
                Ok(timestamp) => timestamp,
                Err(error) => return Outcome::error(error),
            },
        };
        let token = match parse_fencing_token(envelope.fencing_token, now_ms) {
            Ok(token) => token,
            Err(error) => return Outcome::error(error),
        };
        let existing = self.entries.get(&key);
        if let Some(error) = existing.and_then(|entry| fencing_error(entry, token.as_ref())) {
            return Outcome::error(error);
        }
        let applies = match (options.condition, existing) {
            (_, None) | (SetCondition::Always, Some(_)) => true,
            (SetCondition::OnlyIfMissing, Some(_)) => false,
            (SetCondition::OnlyIfMissingOrEqual, Some(entry)) => entry.value == value,
        };
        if !applies {
            let version = existing.map(|entry| entry.version.clone());
            return Outcome::reply(Reply::Integer(-1), version);
        }
        let old_size = existing.map_or(0, |entry| key.len() + entry.value.len());
        let new_size = key.len() + value.len();
        let keys_after = self.entries.len() + usize::from(existing.is_none());
        let bytes_after = self.bytes - old_size + new_size;
        if self.quota.max_keys.is_some_and(|max| keys_after > max)
            || self.quota.max_bytes.is_some_and(|max| bytes_after > max)
        {
            return Outcome::error(StoreError::QuotaExceeded);
        }

        let was_persistent = existing.is_some_and(|entry| entry.persistent);
        // The key keeps the newest token any accepted write presented.
        let fencing_token = match (existing.and_then(|e| e.fencing_token.clone()), token) {
            (Some(old), Some(new)) => Some(old.max(new)),
            (old, new) => new.or(old),
        };
        let version = self.next_version(Some(&timestamp), now_ms);
        let entry = Entry {
            value: value.clone(),
            version: version.clone(),
            fencing_token,
            expires_at_ms: options.expires_in_ms.map(|ms| now_ms.saturating_add(ms)),
            persistent: envelope.persist,
        };
        let mut records = Vec::new();
        if entry.persistent {
            records.push(Record::Set {
                key: key.clone(),
                entry: entry.clone(),
            });
        } else if was_persistent {
            // Otherwise a restart would bring back the older persisted value.
            records.push(Record::Delete { key: key.clone() });
        }
        self.insert(key.clone(), entry);
        Outcome {
            reply: Reply::Ok.into(),
            version: Some(version.clone()),
            events: self.events(&key, Notification::Set { value }, &version),
            records,
        }
    }

    /// `GET key`: the value and its version, or `$-1` without a version.
    pub fn get(&mut self, key: &[u8], envelope: &Envelope<'_>, now_ms: u64) -> Outcome {
        if let Some(Err(error)) = envelope.timestamp.map(|ts| parse_timestamp(ts, now_ms)) {
            return Outcome::error(error);
        }
        match self.entries.get(key) {
            Some(entry) => Outcome::reply(
                Reply::Value(entry.value.clone()),
                Some(entry.version.clone()),
            ),
            None => Outcome::reply(Reply::NotFound, None),
        }
    }

    /// `DEL key`, or `VDEL key value` when `expected` is given: `:1` deleted,
    /// `:0` no such key, `:-1` (VDEL) the value differs.
    pub fn del(
        &mut self,
        key: Bytes,
        expected: Option<Bytes>,
        envelope: &Envelope<'_>,
        now_ms: u64,
    ) -> Outcome {
        let timestamp = match envelope.timestamp.map(|ts| parse_timestamp(ts, now_ms)) {
            Some(Err(error)) => return Outcome::error(error),
            Some(Ok(timestamp)) => Some(timestamp),
            None => None,
        };
        let token = match parse_fencing_token(envelope.fencing_token, now_ms) {
            Ok(token) => token,
            Err(error) => return Outcome::error(error),
        };
        let Some(entry) = self.entries.get(&key) else {
            return Outcome::reply(Reply::Integer(0), None);
        };
        if let Some(error) = fencing_error(entry, token.as_ref()) {
            return Outcome::error(error);
        }
        if expected.is_some_and(|value| value != entry.value) {
            return Outcome::reply(Reply::Integer(-1), Some(entry.version.clone()));
        }
        let version = self.next_version(timestamp.as_ref(), now_ms);
        let (events, records) = self.remove(key, &version);
        Outcome {
            reply: Reply::Integer(1).into(),
            version: Some(version),
            events,
            records,
        }
    }

    /// `KEYNOTIFY key [STOP]` for `client_id`: `+OK`, or `:0` for a STOP of
    /// nothing. Registering twice is one registration.
    pub fn key_notify(&mut self, client_id: &str, key: Bytes, stop: bool) -> Outcome {
        if !stop {
            if notify_topic(client_id, &key).len() > MAX_TOPIC_BYTES {
                return Outcome::error(StoreError::Unknown(KEY_TOO_LONG_TO_WATCH.into()));
            }
            self.watchers
                .entry(key.clone())
                .or_default()
                .insert(client_id.to_owned());
            self.watched
                .entry(client_id.to_owned())
                .or_default()
                .insert(key);
            return Outcome::reply(Reply::Ok, None);
        }
        let removed = self
            .watchers
            .get_mut(&key)
            .is_some_and(|clients| clients.remove(client_id));
        if !removed {
            return Outcome::reply(Reply::Integer(0), None);
        }
        if self.watchers.get(&key).is_some_and(BTreeSet::is_empty) {
            self.watchers.remove(&key);
        }
        if let Some(keys) = self.watched.get_mut(client_id) {
            keys.remove(&key);
            if keys.is_empty() {
                self.watched.remove(client_id);
            }
        }
        Outcome::reply(Reply::Ok, None)
    }

    /// `SCAN pattern [token]`: the next page of the keys matching the glob
    /// `pattern` (and readable by the client), in byte order, resuming
    /// strictly after the key the token names.
    ///
    /// A page ends at [`ScanLimits::max_keys`] keys, after
    /// [`ScanLimits::max_examined`] keys looked at (possibly with none
    /// listed), after [`ScanLimits::max_match_steps`] glob steps, or before
    /// the reply would exceed `envelope.reply_limit`; then the token names
    /// the last key looked at. A key present for the
    /// whole listing is listed exactly once; one added or deleted meanwhile
    /// may or may not be, and when the key a token names (one over
    /// [`KEY_IN_TOKEN`] bytes) was deleted, the keys sharing its first
    /// [`KEY_IN_TOKEN`] bytes may be listed again. A token this store did
    /// not issue is a `syntax error`.
    pub fn scan(&self, pattern: &[u8], token: Option<&[u8]>, envelope: &Envelope<'_>) -> Outcome {
        let resume = match token.map(|token| self.resume(token)) {
            None => None,
            Some(Some(resume)) => Some(resume),
            Some(None) => return Outcome::error(StoreError::SyntaxError),
        };
        // Every match starts with the pattern's literal prefix, and keys
        // with one prefix are adjacent in byte order.
        let prefix = glob::literal_prefix(pattern);
        let start = match resume {
            Some(Resume::After(after)) if after >= prefix.as_slice() => Bound::Excluded(after),
            Some(Resume::From(from)) if from >= prefix.as_slice() => Bound::Included(from),
            _ => Bound::Included(prefix.as_slice()),
        };
        let limits = self.scan_limits;
        let reply_limit = envelope.reply_limit.unwrap_or(usize::MAX);
        let listed = |key: &[u8], steps: &mut u64| {
            glob::matches_counting(pattern, key, steps)
                && envelope
                    .acl
                    .is_none_or(|acl| acl.allows(envelope.client_id, key, Access::Read))
        };
        let mut keys = self
            .entries
            .range::<[u8], _>((start, Bound::Unbounded))
            .map(|(key, _)| key)
            .take_while(|key| key.starts_with(&prefix))
            .peekable();
        let mut page = KeyPage::default();
        let mut size = KeyPage::MAX_HEADER_LEN;
        let (mut examined, mut examined_bytes, mut steps) = (0, 0, 0);
        let mut last: Option<&Bytes> = None;
        while let Some(&key) = keys.peek() {
            if let Some(last) = last
                && (examined >= limits.max_examined
                    || page.keys.len() >= limits.max_keys
                    || examined_bytes + key.len() > limits.max_examined_bytes
                    || steps >= limits.max_match_steps)
            {
                page.token = Some(self.token(last));
                break;
            }
            let is_listed = listed(key, &mut steps);
            let key_size = if is_listed {
                bulk_encoded_len(key.len())
            } else {
                0
            };
            if size + key_size + bulk_encoded_len(self.token_len(key)) > reply_limit {
                if let Some(last) = last {
                    page.token = Some(self.token(last));
                    break;
                }
                // Alone and without a token, only as the last page.
                keys.next();
                if keys.peek().is_none() && size + key_size <= reply_limit {
                    if is_listed {
                        page.keys.push(key.clone());
                    }
                    break;
                }
                return Outcome::error(StoreError::Unknown(KEY_TOO_LONG_TO_LIST.into()));
            }
            keys.next();
            examined += 1;
            examined_bytes += key.len();
            if is_listed {
                page.keys.push(key.clone());
                size += key_size;
            }
            last = Some(key);
        }
        Outcome {
            reply: Answer::Page(page),
            version: None,
            events: Vec::new(),
            records: Vec::new(),
        }
    }

    /// `{id};{key}`: what the service's tokens look like, `digits;bytes`.
    /// A key over [`KEY_IN_TOKEN`] bytes goes in as its first
    /// [`KEY_IN_TOKEN`] bytes and its SHA-256, so a token stays small (and
    /// means the same after a restart) whatever the key's length.
    fn token(&self, after: &[u8]) -> Bytes {
        let mut token = format!("{};", self.id).into_bytes();
        if after.len() <= KEY_IN_TOKEN {
            token.extend_from_slice(after);
        } else {
            token.extend_from_slice(&after[..KEY_IN_TOKEN]);
            token.extend_from_slice(&Sha256::digest(after));
        }
        Bytes::from(token)
    }

    fn token_len(&self, after: &[u8]) -> usize {
        let after = if after.len() <= KEY_IN_TOKEN {
            after.len()
        } else {
            LONG_KEY_IN_TOKEN
        };
        self.id.checked_ilog10().map_or(1, |log| log as usize + 1) + 1 + after
    }

    /// Where a token this store issued resumes: after the key it names, or,
    /// when that long key is gone, at the first key sharing its first
    /// [`KEY_IN_TOKEN`] bytes. A part of any other length over
    /// [`KEY_IN_TOKEN`] is a whole key (tokens from before keys were cut).
    fn resume<'a>(&'a self, token: &'a [u8]) -> Option<Resume<'a>> {
        let separator = token.iter().position(|&byte| byte == b';')?;
        let (id, after) = (&token[..separator], &token[separator + 1..]);
        let id = std::str::from_utf8(id).ok()?;
        if !(id.bytes().all(|b| b.is_ascii_digit()) && id.parse() == Ok(self.id)) {
            return None;
        }
        if after.len() != LONG_KEY_IN_TOKEN {
            return Some(Resume::After(after));
        }
        let (start, digest) = after.split_at(KEY_IN_TOKEN);
        let named = self
            .entries
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded))
            .map(|(key, _)| key)
            .take_while(|key| key.starts_with(start))
            .find(|key| key.len() > KEY_IN_TOKEN && Sha256::digest(key).as_slice() == digest);
        Some(match named {
            Some(key) => Resume::After(key),
            None => Resume::From(start),
        })
    }

    /// Drops every KEYNOTIFY registration of a client that disconnected.
    pub fn client_disconnected(&mut self, client_id: &str) {
        for key in self.watched.remove(client_id).unwrap_or_default() {
            if let Some(clients) = self.watchers.get_mut(&key) {
                clients.remove(client_id);
                if clients.is_empty() {
                    self.watchers.remove(&key);
                }
            }
        }
    }

    /// Number of (client, key) KEYNOTIFY registrations.
    pub fn registrations(&self) -> usize {
        self.watchers.values().map(BTreeSet::len).sum()
    }

    /// Removes every key whose PX ran out at `now_ms`, with a delete
    /// notification each (reply and version of the outcome are unused).
    pub fn expire(&mut self, now_ms: u64) -> Outcome {
        let mut outcome = Outcome::reply(Reply::Ok, None);
        while let Some((at, key)) = self.expiries.first().cloned() {
            if at > now_ms {
                break;
            }
            let version = self.next_version(None, now_ms);
            let (events, records) = self.remove(key, &version);
            outcome.events.extend(events);
            outcome.records.extend(records);
        }
        outcome
    }

    /// When the next key expires (wall-clock ms), to wake up for it.
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiries.first().map(|(at, _)| *at)
    }

    /// Puts back a key read from the persistence log at start-up; keys that
    /// expired meanwhile are skipped, and the clock moves past every version
    /// so that new versions stay greater.
    pub fn restore(&mut self, key: Bytes, entry: Entry, now_ms: u64) {
        if self.clock < entry.version {
            self.clock.wall_ms = entry.version.wall_ms;
            self.clock.counter = entry.version.counter;
        }
        if entry.expires_at_ms.is_some_and(|at| at <= now_ms) {
            self.forget(&key);
            return;
        }
        self.insert(key, entry);
    }

    /// Forgets a key without notifications (a delete record at start-up).
    pub fn forget(&mut self, key: &Bytes) {
        if let Some(entry) = self.entries.remove(key) {
            self.unindex(key, &entry);
        }
    }

    /// The persisted keys, for compacting the log.
    pub fn persistent_entries(&self) -> impl Iterator<Item = (&Bytes, &Entry)> {
        self.entries.iter().filter(|(_, entry)| entry.persistent)
    }

    fn insert(&mut self, key: Bytes, entry: Entry) {
        // The old entry's index goes first: with the same expiry time, the
        // new index entry is the same tuple and must survive.
        if let Some(old) = self.entries.remove(&key) {
            self.unindex(&key, &old);
        }
        if let Some(at) = entry.expires_at_ms {
            self.expiries.insert((at, key.clone()));
        }
        self.bytes += key.len() + entry.value.len();
        self.entries.insert(key, entry);
    }

    /// Undoes what [`Keyspace::insert`] counted for `entry`.
    fn unindex(&mut self, key: &Bytes, entry: &Entry) {
        if let Some(at) = entry.expires_at_ms {
            self.expiries.remove(&(at, key.clone()));
        }
        self.bytes -= key.len() + entry.value.len();
    }

    fn remove(&mut self, key: Bytes, version: &Hlc) -> (Vec<WatcherNotice>, Vec<Record>) {
        let Some(entry) = self.entries.remove(&key) else {
            return (Vec::new(), Vec::new());
        };
        self.unindex(&key, &entry);
        let events = self.events(&key, Notification::Delete, version);
        let records = if entry.persistent {
            vec![Record::Delete { key }]
        } else {
            Vec::new()
        };
        (events, records)
    }

    fn events(&self, key: &Bytes, notification: Notification, version: &Hlc) -> Vec<WatcherNotice> {
        self.watchers.get(key).map_or_else(Vec::new, |clients| {
            clients
                .iter()
                .map(|client_id| WatcherNotice {
                    client_id: client_id.clone(),
                    key: key.clone(),
                    notification: notification.clone(),
                    version: version.clone(),
                })
                .collect()
        })
    }

    /// The version of a change: the store's clock after the HLC receive rule
    /// with the request's `__ts`, so always greater than both. Never fails:
    /// when the rule cannot apply (a counter at its maximum, a system clock
    /// that jumped back a minute) the clock moves one millisecond ahead.
    fn next_version(&mut self, timestamp: Option<&Hlc>, now_ms: u64) -> Hlc {
        let result = match timestamp {
            Some(timestamp) => self.clock.merge(timestamp, now_ms),
            None => self.clock.tick(now_ms),
        };
        if result.is_err() {
            let wall = timestamp.map_or(0, |ts| ts.wall_ms).max(self.clock.wall_ms);
            self.clock.wall_ms = wall.saturating_add(1);
            self.clock.counter = 0;
        }
        self.clock.clone()
    }
}

/// `__ts`: `malformed timestamp` or `...too far in the future...`.
fn parse_timestamp(text: &str, now_ms: u64) -> Result<Hlc, StoreError> {
    let hlc = Hlc::parse(text).map_err(|_| StoreError::MalformedTimestamp)?;
    if hlc.is_too_far_ahead_of(now_ms) {
        return Err(StoreError::TimestampSkew);
    }
    Ok(hlc)
}

/// `__ft`, if given: `malformed timestamp` or `...fencing token timestamp is
/// too far in the future...`.
fn parse_fencing_token(text: Option<&str>, now_ms: u64) -> Result<Option<Hlc>, StoreError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let hlc = Hlc::parse(text).map_err(|_| StoreError::MalformedTimestamp)?;
    if hlc.is_too_far_ahead_of(now_ms) {
        return Err(StoreError::FencingTokenSkew);
    }
    Ok(Some(hlc))
}

/// The fencing rule for a write to an existing key: a key that carries a
/// token needs one at least as new.
fn fencing_error(entry: &Entry, token: Option<&Hlc>) -> Option<StoreError> {
    let required = entry.fencing_token.as_ref()?;
    match token {
        None => Some(StoreError::FencingTokenRequired),
        Some(token) if token < required => Some(StoreError::FencingTokenLowerVersion),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Request;

    const NOW: u64 = 1_700_000_000_000;

    fn b(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    fn ts(wall_ms: u64) -> String {
        Hlc::new(wall_ms, "client").to_string()
    }

    fn env(ts: &str) -> Envelope<'_> {
        Envelope {
            client_id: "client",
            timestamp: Some(ts),
            fencing_token: None,
            ..Envelope::default()
        }
    }

    struct Fixture {
        store: Keyspace,
        client_ts: String,
    }

    impl Fixture {
        fn new() -> Self {
            Self::with_quota(Quota::default())
        }

        fn with_quota(quota: Quota) -> Self {
            Self {
                store: Keyspace::new(quota, NOW),
                client_ts: ts(NOW),
            }
        }

        fn set(&mut self, key: &str, value: &str, options: SetOptions) -> Outcome {
            let ts = self.client_ts.clone();
            self.store.set(b(key), b(value), options, &env(&ts), NOW)
        }

        fn set_with_token(&mut self, key: &str, value: &str, token: Option<&Hlc>) -> Outcome {
            let token = token.map(Hlc::to_string);
            let ts = self.client_ts.clone();
            let envelope = Envelope {
                fencing_token: token.as_deref(),
                ..env(&ts)
            };
            self.store
                .set(b(key), b(value), SetOptions::default(), &envelope, NOW)
        }

        fn get(&mut self, key: &str) -> Outcome {
            let envelope = Envelope {
                client_id: "client",
                ..Envelope::default()
            };
            self.store.get(key.as_bytes(), &envelope, NOW)
        }

        fn del(&mut self, key: &str, expected: Option<&str>, token: Option<&Hlc>) -> Outcome {
            let token = token.map(Hlc::to_string);
            let ts = self.client_ts.clone();
            let envelope = Envelope {
                fencing_token: token.as_deref(),
                ..env(&ts)
            };
            self.store.del(b(key), expected.map(b), &envelope, NOW)
        }
    }

    fn nx() -> SetOptions {
        SetOptions {
            condition: SetCondition::OnlyIfMissing,
            expires_in_ms: None,
        }
    }

    fn nex() -> SetOptions {
        SetOptions {
            condition: SetCondition::OnlyIfMissingOrEqual,
            expires_in_ms: None,
        }
    }

    fn px(ms: u64) -> SetOptions {
        SetOptions {
            condition: SetCondition::Always,
            expires_in_ms: Some(ms),
        }
    }

    #[test]
    fn set_then_get_returns_the_value_and_the_sets_version() {
        let mut f = Fixture::new();
        let set = f.set("k", "v", SetOptions::default());
        assert_eq!(set.reply, Reply::Ok);
        let version = set.version.unwrap();
        assert_eq!(version.node, NODE_ID);
        let get = f.get("k");
        assert_eq!(get.reply, Reply::Value(b("v")));
        assert_eq!(get.version, Some(version));
    }

    #[test]
    fn get_of_a_missing_key_has_no_version() {
        let mut f = Fixture::new();
        assert_eq!(f.get("nope"), Outcome::reply(Reply::NotFound, None));
    }

    #[test]
    fn empty_values_are_stored() {
        let mut f = Fixture::new();
        assert_eq!(f.set("k", "", SetOptions::default()).reply, Reply::Ok);
        assert_eq!(f.get("k").reply, Reply::Value(Bytes::new()));
    }

    #[test]
    fn versions_exceed_the_request_timestamp_and_increase() {
        let mut f = Fixture::new();
        // A client clock 30 s ahead of ours is accepted and overtaken.
        f.client_ts = Hlc {
            wall_ms: NOW + 30_000,
            counter: 7,
            node: "client".into(),
        }
        .to_string();
        let first = f.set("k", "1", SetOptions::default()).version.unwrap();
        assert!((first.wall_ms, first.counter) > (NOW + 30_000, 7));
        // A client clock behind ours: the version still grows.
        f.client_ts = ts(NOW - 5_000);
        let second = f.set("k", "2", SetOptions::default()).version.unwrap();
        assert!(second > first);
        let deleted = f.del("k", None, None).version.unwrap();
        assert!(deleted > second);
    }

    #[test]
    fn set_without_timestamp_is_missing_timestamp() {
        let mut store = Keyspace::new(Quota::default(), NOW);
        let outcome = store.set(
            b("k"),
            b("v"),
            SetOptions::default(),
            &Envelope::default(),
            NOW,
        );
        assert_eq!(outcome, Outcome::error(StoreError::MissingTimestamp));
    }

    #[test]
    fn bad_timestamps_get_their_errors() {
        let mut f = Fixture::new();
        f.client_ts = "yesterday".into();
        assert_eq!(
            f.set("k", "v", SetOptions::default()).reply,
            Reply::Error(StoreError::MalformedTimestamp)
        );
        f.client_ts = ts(NOW + 60_001);
        assert_eq!(
            f.set("k", "v", SetOptions::default()).reply,
            Reply::Error(StoreError::TimestampSkew)
        );
        assert_eq!(
            f.del("k", None, None).reply,
            Reply::Error(StoreError::TimestampSkew)
        );
        f.client_ts = ts(NOW + 60_000);
        assert_eq!(f.set("k", "v", SetOptions::default()).reply, Reply::Ok);
        // GET with a bad __ts is refused too; without one it is fine.
        let bad = Envelope {
            timestamp: Some("1:2"),
            ..Envelope::default()
        };
        assert_eq!(
            f.store.get(b"k", &bad, NOW).reply,
            Reply::Error(StoreError::MalformedTimestamp)
        );
    }

    #[test]
    fn nx_applies_only_to_a_missing_key() {
        let mut f = Fixture::new();
        assert_eq!(f.set("k", "a", nx()).reply, Reply::Ok);
        let version = f.get("k").version;
        let second = f.set("k", "b", nx());
        assert_eq!(second.reply, Reply::Integer(-1));
        assert_eq!(second.version, version);
        assert!(second.events.is_empty());
        assert_eq!(f.get("k").reply, Reply::Value(b("a")));
    }

    #[test]
    fn nex_applies_to_a_missing_key_or_the_same_value() {
        let mut f = Fixture::new();
        assert_eq!(f.set("lock", "me", nex()).reply, Reply::Ok);
        assert_eq!(f.set("lock", "me", nex()).reply, Reply::Ok);
        assert_eq!(f.set("lock", "you", nex()).reply, Reply::Integer(-1));
        assert_eq!(f.get("lock").reply, Reply::Value(b("me")));
    }

    #[test]
    fn del_and_vdel_replies() {
        let mut f = Fixture::new();
        assert_eq!(
            f.del("k", None, None),
            Outcome::reply(Reply::Integer(0), None)
        );
        f.set("k", "v", SetOptions::default());
        let mismatch = f.del("k", Some("other"), None);
        assert_eq!(mismatch.reply, Reply::Integer(-1));
        assert_eq!(mismatch.version, f.get("k").version);
        assert_eq!(f.del("k", Some("v"), None).reply, Reply::Integer(1));
        assert_eq!(f.get("k").reply, Reply::NotFound);
        assert_eq!(f.del("k", Some("v"), None).reply, Reply::Integer(0));
        f.set("k", "v", SetOptions::default());
        assert_eq!(f.del("k", None, None).reply, Reply::Integer(1));
        assert!(f.store.is_empty());
    }

    #[test]
    fn a_set_with_a_token_protects_the_key() {
        let mut f = Fixture::new();
        let token = Hlc::new(NOW - 1_000, "lock");
        assert_eq!(f.set_with_token("k", "1", Some(&token)).reply, Reply::Ok);
        assert_eq!(
            f.store.entry(b"k").unwrap().fencing_token,
            Some(token.clone())
        );
        // Without a token: required.
        assert_eq!(
            f.set_with_token("k", "2", None).reply,
            Reply::Error(StoreError::FencingTokenRequired)
        );
        assert_eq!(
            f.del("k", None, None).reply,
            Reply::Error(StoreError::FencingTokenRequired)
        );
        assert_eq!(
            f.del("k", Some("1"), None).reply,
            Reply::Error(StoreError::FencingTokenRequired)
        );
        // Older: lower version.
        let older = Hlc::new(NOW - 2_000, "lock");
        assert_eq!(
            f.set_with_token("k", "2", Some(&older)).reply,
            Reply::Error(StoreError::FencingTokenLowerVersion)
        );
        assert_eq!(
            f.del("k", None, Some(&older)).reply,
            Reply::Error(StoreError::FencingTokenLowerVersion)
        );
        // Same node, same wall, lower counter is older too.
        let mut newer = token.clone();
        newer.counter += 1;
        // Equal: accepted and kept.
        assert_eq!(f.set_with_token("k", "2", Some(&token)).reply, Reply::Ok);
        assert_eq!(
            f.store.entry(b"k").unwrap().fencing_token,
            Some(token.clone())
        );
        // Newer: accepted and stored, so the equal one is now too old.
        assert_eq!(f.set_with_token("k", "3", Some(&newer)).reply, Reply::Ok);
        assert_eq!(
            f.store.entry(b"k").unwrap().fencing_token,
            Some(newer.clone())
        );
        assert_eq!(
            f.set_with_token("k", "4", Some(&token)).reply,
            Reply::Error(StoreError::FencingTokenLowerVersion)
        );
        assert_eq!(f.get("k").reply, Reply::Value(b("3")));
        // A delete with a good token removes the key and its token.
        assert_eq!(f.del("k", Some("3"), Some(&newer)).reply, Reply::Integer(1));
        assert_eq!(f.set_with_token("k", "5", None).reply, Reply::Ok);
        assert_eq!(f.store.entry(b"k").unwrap().fencing_token, None);
    }

    #[test]
    fn a_token_on_an_unprotected_key_is_stored() {
        let mut f = Fixture::new();
        f.set("k", "1", SetOptions::default());
        let token = Hlc::new(NOW, "lock");
        assert_eq!(f.set_with_token("k", "2", Some(&token)).reply, Reply::Ok);
        assert_eq!(
            f.set_with_token("k", "3", None).reply,
            Reply::Error(StoreError::FencingTokenRequired)
        );
    }

    #[test]
    fn fencing_token_errors_for_bad_tokens() {
        let mut f = Fixture::new();
        let far = Hlc::new(NOW + 61_000, "lock");
        assert_eq!(
            f.set_with_token("k", "1", Some(&far)).reply,
            Reply::Error(StoreError::FencingTokenSkew)
        );
        let ts = f.client_ts.clone();
        let envelope = Envelope {
            fencing_token: Some("not-a-clock"),
            ..env(&ts)
        };
        assert_eq!(
            f.store
                .set(b("k"), b("v"), SetOptions::default(), &envelope, NOW)
                .reply,
            Reply::Error(StoreError::MalformedTimestamp)
        );
    }

    #[test]
    fn nx_on_a_protected_key_without_token_is_refused_by_fencing_first() {
        let mut f = Fixture::new();
        f.set_with_token("k", "1", Some(&Hlc::new(NOW, "lock")));
        assert_eq!(
            f.set("k", "2", nx()).reply,
            Reply::Error(StoreError::FencingTokenRequired)
        );
    }

    #[test]
    fn keys_expire_on_time_with_a_delete_notification() {
        let mut f = Fixture::new();
        f.store.key_notify("watcher", b("k"), false);
        f.set("k", "v", px(100));
        f.set("forever", "v", SetOptions::default());
        assert_eq!(f.store.next_expiry(), Some(NOW + 100));
        assert!(f.store.expire(NOW + 99).events.is_empty());
        let expired = f.store.expire(NOW + 100);
        assert_eq!(expired.events.len(), 1);
        assert_eq!(expired.events[0].notification, Notification::Delete);
        assert_eq!(expired.events[0].client_id, "watcher");
        assert!(expired.events[0].version > f.store.entry(b"forever").unwrap().version);
        assert_eq!(f.store.len(), 1);
        assert_eq!(f.store.next_expiry(), None);
    }

    #[test]
    fn execute_never_sees_an_expired_key() {
        let mut f = Fixture::new();
        f.set("k", "v", px(10));
        let ts = f.client_ts.clone();
        let envelope = env(&ts);
        let later = NOW + 10;
        let outcome = f
            .store
            .execute(Request::Get { key: b("k") }, &envelope, later);
        assert_eq!(outcome.reply, Reply::NotFound);
    }

    #[test]
    fn a_new_set_replaces_the_expiry() {
        let mut f = Fixture::new();
        f.set("k", "v", px(10));
        f.set("k", "v2", SetOptions::default());
        assert_eq!(f.store.next_expiry(), None);
        assert!(f.store.expire(NOW + 1_000).events.is_empty());
        f.set("k", "v3", px(50));
        f.set("k", "v4", px(500));
        assert_eq!(f.store.next_expiry(), Some(NOW + 500));
    }

    #[test]
    fn a_new_set_with_the_same_expiry_time_keeps_it() {
        // Two `SET PX` in one batch share `now`: the same expiry instant.
        let mut f = Fixture::new();
        f.set("k", "v", px(10));
        f.set("k", "v2", px(10));
        assert_eq!(f.store.next_expiry(), Some(NOW + 10));
        let expired = f.store.expire(NOW + 10);
        assert_eq!(expired.events.len(), 0, "nobody watches k");
        assert_eq!(f.store.len(), 0, "k expired");
    }

    #[test]
    fn watchers_get_set_and_delete_notifications_with_versions() {
        let mut f = Fixture::new();
        assert_eq!(f.store.key_notify("a", b("k"), false).reply, Reply::Ok);
        assert_eq!(f.store.key_notify("b", b("k"), false).reply, Reply::Ok);
        assert_eq!(f.store.key_notify("a", b("k"), false).reply, Reply::Ok);
        assert_eq!(f.store.registrations(), 2);
        let set = f.set("k", "v", SetOptions::default());
        let clients: Vec<_> = set.events.iter().map(|e| e.client_id.as_str()).collect();
        assert_eq!(clients, ["a", "b"]);
        assert!(set.events.iter().all(|e| {
            e.notification == Notification::Set { value: b("v") }
                && Some(&e.version) == set.version.as_ref()
        }));
        // Not applied: no notification.
        assert!(f.set("k", "w", nx()).events.is_empty());
        let del = f.del("k", None, None);
        assert_eq!(del.events.len(), 2);
        assert!(
            del.events
                .iter()
                .all(|e| e.notification == Notification::Delete
                    && Some(&e.version) == del.version.as_ref())
        );
        // Registrations outlive the key.
        assert_eq!(f.set("k", "again", SetOptions::default()).events.len(), 2);
    }

    #[test]
    fn keynotify_stop_replies_ok_or_zero() {
        let mut f = Fixture::new();
        assert_eq!(
            f.store.key_notify("a", b("k"), true).reply,
            Reply::Integer(0)
        );
        f.store.key_notify("a", b("k"), false);
        assert_eq!(
            f.store.key_notify("b", b("k"), true).reply,
            Reply::Integer(0)
        );
        assert_eq!(f.store.key_notify("a", b("k"), true).reply, Reply::Ok);
        assert_eq!(
            f.store.key_notify("a", b("k"), true).reply,
            Reply::Integer(0)
        );
        assert_eq!(f.store.registrations(), 0);
        assert!(f.set("k", "v", SetOptions::default()).events.is_empty());
    }

    #[test]
    fn a_disconnected_client_loses_its_registrations() {
        let mut f = Fixture::new();
        f.store.key_notify("a", b("k1"), false);
        f.store.key_notify("a", b("k2"), false);
        f.store.key_notify("b", b("k1"), false);
        f.store.client_disconnected("a");
        assert_eq!(f.store.registrations(), 1);
        let events = f.set("k1", "v", SetOptions::default()).events;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].client_id, "b");
        assert!(f.set("k2", "v", SetOptions::default()).events.is_empty());
    }

    #[test]
    fn key_quota_is_enforced_but_replacing_is_fine() {
        let mut f = Fixture::with_quota(Quota {
            max_keys: Some(2),
            max_bytes: None,
        });
        assert_eq!(f.set("a", "1", SetOptions::default()).reply, Reply::Ok);
        assert_eq!(f.set("b", "1", SetOptions::default()).reply, Reply::Ok);
        assert_eq!(
            f.set("c", "1", SetOptions::default()).reply,
            Reply::Error(StoreError::QuotaExceeded)
        );
        assert_eq!(f.set("a", "2", SetOptions::default()).reply, Reply::Ok);
        f.del("a", None, None);
        assert_eq!(f.set("c", "1", SetOptions::default()).reply, Reply::Ok);
    }

    #[test]
    fn byte_quota_counts_keys_and_values() {
        let mut f = Fixture::with_quota(Quota {
            max_keys: None,
            max_bytes: Some(10),
        });
        assert_eq!(
            f.set("ab", "12345678", SetOptions::default()).reply,
            Reply::Ok
        );
        assert_eq!(
            f.set("c", "", SetOptions::default()).reply,
            Reply::Error(StoreError::QuotaExceeded)
        );
        assert_eq!(
            f.set("ab", "123456789", SetOptions::default()).reply,
            Reply::Error(StoreError::QuotaExceeded)
        );
        assert_eq!(f.set("ab", "1234", SetOptions::default()).reply, Reply::Ok);
        assert_eq!(f.set("c", "123", SetOptions::default()).reply, Reply::Ok);
        // Expiry gives the bytes back.
        f.set("ab", "1234", px(5));
        f.store.expire(NOW + 5);
        assert_eq!(f.set("d", "12345", SetOptions::default()).reply, Reply::Ok);
    }

    #[test]
    fn persisted_keys_produce_records_and_unpersisting_deletes_them() {
        let mut f = Fixture::new();
        let ts = f.client_ts.clone();
        let persist = Envelope {
            persist: true,
            ..env(&ts)
        };
        let set = f
            .store
            .set(b("k"), b("v"), SetOptions::default(), &persist, NOW);
        assert!(matches!(&set.records[..], [Record::Set { key, entry }]
            if key == "k" && entry.value == "v" && Some(&entry.version) == set.version.as_ref()));
        // A plain SET of a persisted key retracts the persisted copy.
        let plain = f.set("k", "w", SetOptions::default());
        assert_eq!(plain.records, vec![Record::Delete { key: b("k") }]);
        // Plain keys never touch the log.
        assert!(f.set("k", "x", SetOptions::default()).records.is_empty());
        assert!(f.del("k", None, None).records.is_empty());
        // Deleting or expiring a persisted key is logged.
        f.store.set(b("k"), b("v"), px(5), &persist, NOW);
        assert_eq!(
            f.store.expire(NOW + 5).records,
            vec![Record::Delete { key: b("k") }]
        );
    }

    #[test]
    fn restore_moves_the_clock_past_restored_versions_and_skips_expired_keys() {
        let mut store = Keyspace::new(Quota::default(), NOW);
        let future = Hlc {
            wall_ms: NOW + 10_000,
            counter: 3,
            node: NODE_ID.into(),
        };
        let entry = Entry {
            value: b("v"),
            version: future.clone(),
            fencing_token: None,
            expires_at_ms: None,
            persistent: true,
        };
        store.restore(b("k"), entry.clone(), NOW);
        store.restore(
            b("gone"),
            Entry {
                expires_at_ms: Some(NOW),
                ..entry
            },
            NOW,
        );
        assert_eq!(store.len(), 1);
        let envelope = Envelope {
            timestamp: Some("0:0:c"),
            ..Envelope::default()
        };
        let set = store.set(b("k2"), b("v"), SetOptions::default(), &envelope, NOW);
        assert!(set.version.unwrap() > future);
    }

    #[test]
    fn the_clock_survives_a_maxed_counter() {
        let mut f = Fixture::new();
        f.client_ts = Hlc {
            wall_ms: NOW,
            counter: u64::MAX - 1,
            node: "c".into(),
        }
        .to_string();
        let first = f.set("k", "1", SetOptions::default()).version.unwrap();
        let second = f.set("k", "2", SetOptions::default()).version.unwrap();
        let third = f.set("k", "3", SetOptions::default()).version.unwrap();
        assert!(first < second && second < third);
    }

    #[test]
    fn keynotify_of_a_key_too_long_for_a_topic_is_refused() {
        let mut store = Keyspace::new(Quota::default(), NOW);
        // HEX doubles the key: 32 KiB of key makes a topic over 64 KiB.
        let outcome = store.key_notify("client", Bytes::from(vec![b'k'; 32 * 1024]), false);
        assert_eq!(
            outcome.reply,
            Reply::Error(StoreError::Unknown(KEY_TOO_LONG_TO_WATCH.into()))
        );
        assert_eq!(store.registrations(), 0);
        let longest = (MAX_TOPIC_BYTES - notify_topic("client", b"").len()) / 2;
        let outcome = store.key_notify("client", Bytes::from(vec![b'k'; longest]), false);
        assert_eq!(outcome.reply, Reply::Ok);
        assert_eq!(store.registrations(), 1);
    }

    /// Every page of a listing, asking until no token comes back.
    fn list_pages(store: &mut Keyspace, pattern: &str, envelope: &Envelope<'_>) -> Vec<KeyPage> {
        let mut pages = Vec::new();
        let mut token = None;
        loop {
            let request = Request::Scan {
                pattern: b(pattern),
                token: token.take(),
            };
            let outcome = store.execute(request, envelope, NOW);
            let Answer::Page(page) = outcome.reply else {
                panic!("not a page: {:?}", outcome.reply);
            };
            assert_eq!(outcome.version, None);
            token = page.token.clone();
            pages.push(page);
            if token.is_none() {
                return pages;
            }
            assert!(pages.len() < 100_000, "the listing does not end");
        }
    }

    fn listed(pages: &[KeyPage]) -> Vec<Bytes> {
        pages.iter().flat_map(|page| page.keys.clone()).collect()
    }

    fn small_pages(store: &mut Keyspace, max_keys: usize, max_examined: usize) {
        store.set_scan_limits(ScanLimits {
            max_keys,
            max_examined,
            ..ScanLimits::default()
        });
    }

    #[test]
    fn scan_lists_matching_keys_once_in_byte_order_across_pages() {
        let mut f = Fixture::new();
        for i in (0..25).rev() {
            f.set(&format!("sensor/{i:02}"), "v", SetOptions::default());
        }
        f.set("other", "v", SetOptions::default());
        small_pages(&mut f.store, 4, 100);
        let pages = list_pages(&mut f.store, "sensor/*", &Envelope::default());
        let expected: Vec<Bytes> = (0..25).map(|i| b(&format!("sensor/{i:02}"))).collect();
        assert_eq!(listed(&pages), expected);
        assert_eq!(pages.len(), 7, "six full pages of four, then one");
        assert!(pages[..6].iter().all(|page| page.keys.len() == 4));
        let token = pages[0].token.clone().unwrap();
        assert_eq!(token, format!("{};sensor/03", f.store.id()).into_bytes());
        // Everything, with `*`.
        assert_eq!(
            listed(&list_pages(&mut f.store, "*", &Envelope::default())).len(),
            26
        );
    }

    #[test]
    fn scan_patterns_use_the_glob() {
        let mut f = Fixture::new();
        for key in ["a1", "a2", "b1", "a*", "ab", "a?"] {
            f.set(key, "v", SetOptions::default());
        }
        let keys = |f: &mut Fixture, pattern: &str| -> Vec<Bytes> {
            listed(&list_pages(&mut f.store, pattern, &Envelope::default()))
        };
        assert_eq!(
            keys(&mut f, "a?"),
            [b("a*"), b("a1"), b("a2"), b("a?"), b("ab")]
        );
        assert_eq!(keys(&mut f, "a[0-9]"), [b("a1"), b("a2")]);
        assert_eq!(keys(&mut f, "a[^0-9]"), [b("a*"), b("a?"), b("ab")]);
        assert_eq!(keys(&mut f, "a\\*"), [b("a*")]);
        assert_eq!(keys(&mut f, "?1"), [b("a1"), b("b1")]);
        assert!(keys(&mut f, "zz*").is_empty());
    }

    #[test]
    fn scan_skips_deleted_and_expired_keys() {
        let mut f = Fixture::new();
        f.set("k1", "v", SetOptions::default());
        f.set("k2", "v", px(10));
        f.set("k3", "v", SetOptions::default());
        f.del("k3", None, None);
        let ts = f.client_ts.clone();
        let request = Request::Scan {
            pattern: b("*"),
            token: None,
        };
        let outcome = f.store.execute(request, &env(&ts), NOW + 10);
        assert_eq!(
            outcome.reply,
            Answer::Page(KeyPage {
                keys: vec![b("k1")],
                token: None
            })
        );
        // The expiry it ran first is reported like any other.
        assert_eq!(outcome.events.len(), 0, "nobody watched k2");
        assert!(f.store.entry(b"k2").is_none());
    }

    #[test]
    fn scan_tokens_stay_short_for_long_keys() {
        let mut f = Fixture::new();
        small_pages(&mut f.store, 1, usize::MAX);
        let long = |n: u32| format!("k/{}{n}", "x".repeat(20_000));
        let mut keys: Vec<String> = (0..4).map(long).collect();
        keys.extend(["k/0", "k/y"].map(String::from));
        for key in &keys {
            f.set(key, "v", SetOptions::default());
        }
        keys.sort();
        let pages = list_pages(&mut f.store, "k/*", &Envelope::default());
        assert_eq!(
            listed(&pages),
            keys.iter().map(|k| b(k)).collect::<Vec<_>>()
        );
        for page in &pages {
            let len = page.token.as_ref().map_or(0, Bytes::len);
            assert!(len <= 24 + KEY_IN_TOKEN + 32, "a token of {len} bytes");
        }
        // The key a token names is gone: the keys sharing its first bytes
        // come again, and nothing is skipped.
        let token = pages[2].token.clone().unwrap();
        f.store.entries.remove(long(1).as_bytes());
        let request = Request::Scan {
            pattern: b("k/*"),
            token: Some(token),
        };
        let Answer::Page(page) = f.store.execute(request, &Envelope::default(), NOW).reply else {
            panic!("not a page");
        };
        assert_eq!(page.keys, [b(&long(0))]);
    }

    #[test]
    fn scan_tokens_it_did_not_issue_are_syntax_errors() {
        let mut f = Fixture::new();
        f.set("k", "v", SetOptions::default());
        let id = f.store.id();
        for token in [
            format!("{}", id.wrapping_add(1)).into_bytes(),
            format!("{};k", id.wrapping_add(1)).into_bytes(),
            b"garbage".to_vec(),
            b";k".to_vec(),
            format!("+{id};k").into_bytes(),
            Vec::new(),
        ] {
            let outcome = f.store.scan(b"*", Some(&token), &Envelope::default());
            assert_eq!(
                outcome.reply,
                Reply::Error(StoreError::SyntaxError),
                "{}",
                String::from_utf8_lossy(&token)
            );
        }
        // Its own token, also after a restart that kept the id.
        let token = format!("{id};a").into_bytes();
        let mut restarted = Keyspace::new(Quota::default(), NOW);
        restarted.set_id(id);
        restarted.restore(b("k"), f.store.entry(b"k").unwrap().clone(), NOW);
        for store in [&f.store, &restarted] {
            assert_eq!(
                store.scan(b"*", Some(&token), &Envelope::default()).reply,
                Answer::Page(KeyPage {
                    keys: vec![b("k")],
                    token: None
                })
            );
        }
    }

    #[test]
    fn scan_work_per_page_is_bounded() {
        let mut f = Fixture::new();
        for i in 0..100 {
            f.set(&format!("k{i:03}"), "v", SetOptions::default());
        }
        small_pages(&mut f.store, 1_000, 10);
        let pages = list_pages(&mut f.store, "*50", &Envelope::default());
        assert_eq!(listed(&pages), [b("k050")]);
        assert_eq!(pages.len(), 10, "ten keys looked at per page");
        assert!(pages.iter().filter(|page| page.keys.is_empty()).count() >= 9);
        assert!(pages[..9].iter().all(|page| page.token.is_some()));
    }

    #[test]
    fn scan_pages_fit_the_reply_limit() {
        let mut f = Fixture::new();
        for i in 0..200 {
            f.set(
                &format!("key-{i:03}-{}", "x".repeat(i % 40)),
                "v",
                SetOptions::default(),
            );
        }
        let envelope = Envelope {
            reply_limit: Some(300),
            ..Envelope::default()
        };
        let pages = list_pages(&mut f.store, "*", &envelope);
        assert!(pages.iter().all(|page| page.encode().len() <= 300));
        assert!(pages.len() > 20);
        assert_eq!(listed(&pages).len(), 200);
    }

    #[test]
    fn a_key_too_long_for_a_page_with_its_token_is_an_error_unless_last() {
        let mut f = Fixture::new();
        let long = "k".repeat(200);
        f.set(&long, "v", SetOptions::default());
        let envelope = Envelope {
            reply_limit: Some(300),
            ..Envelope::default()
        };
        // Last key: listed without a token.
        assert_eq!(
            listed(&list_pages(&mut f.store, "*", &envelope)),
            [b(&long)]
        );
        f.set("l", "v", SetOptions::default());
        assert_eq!(
            f.store.scan(b"*", None, &envelope).reply,
            Reply::Error(StoreError::Unknown(KEY_TOO_LONG_TO_LIST.into()))
        );
        // Not listed, it is only looked at: its token fits.
        assert_eq!(listed(&list_pages(&mut f.store, "l*", &envelope)), [b("l")]);
    }

    #[test]
    fn scan_lists_only_what_the_client_may_read() {
        let mut f = Fixture::new();
        for key in ["public/a", "private/b", "public/c"] {
            f.set(key, "v", SetOptions::default());
        }
        let acl = AccessList::from_json(r#"{ "reader": { "read": ["public/"] } }"#).unwrap();
        let envelope = Envelope {
            client_id: "reader",
            acl: Some(&acl),
            ..Envelope::default()
        };
        assert_eq!(
            listed(&list_pages(&mut f.store, "*", &envelope)),
            [b("public/a"), b("public/c")]
        );
        let stranger = Envelope {
            client_id: "stranger",
            ..envelope
        };
        assert!(listed(&list_pages(&mut f.store, "*", &stranger)).is_empty());
    }
}

#[cfg(test)]
mod scan_proptests {
    use super::*;
    use crate::protocol::Request;
    use proptest::prelude::*;

    const NOW: u64 = 1_700_000_000_000;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"ab*?[]\\\x00\xff".to_vec()), 1..5)
    }

    fn pattern() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"ab*?[]^-\\\x00\xff".to_vec()), 1..5)
    }

    /// A change made between two pages.
    #[derive(Debug, Clone)]
    enum Change {
        Set(Vec<u8>),
        Del(Vec<u8>),
    }

    fn store_with(keys: &[Vec<u8>], limits: ScanLimits) -> Keyspace {
        let mut store = Keyspace::new(Quota::default(), NOW);
        store.set_scan_limits(limits);
        for key in keys {
            apply(&mut store, &Change::Set(key.clone()));
        }
        store
    }

    fn apply(store: &mut Keyspace, change: &Change) {
        let ts = Hlc::new(NOW, "c").to_string();
        let envelope = Envelope {
            timestamp: Some(&ts),
            ..Envelope::default()
        };
        match change {
            Change::Set(key) => {
                let key = Bytes::from(key.clone());
                store.set(key, Bytes::new(), SetOptions::default(), &envelope, NOW);
            }
            Change::Del(key) => {
                store.del(Bytes::from(key.clone()), None, &envelope, NOW);
            }
        }
    }

    fn limits() -> impl Strategy<Value = ScanLimits> {
        (1..6usize, 1..8usize, 1..12usize, 1..40u64).prop_map(
            |(max_keys, max_examined, bytes, steps)| ScanLimits {
                max_keys,
                max_examined,
                max_examined_bytes: bytes,
                max_match_steps: steps,
            },
        )
    }

    /// Runs a listing, applying `changes[i]` after page i.
    fn listing(
        store: &mut Keyspace,
        pattern: &[u8],
        reply_limit: Option<usize>,
        changes: &[Change],
    ) -> Result<Vec<Bytes>, TestCaseError> {
        let envelope = Envelope {
            reply_limit,
            ..Envelope::default()
        };
        let mut keys = Vec::new();
        let mut token = None;
        for page_number in 0.. {
            let request = Request::Scan {
                pattern: Bytes::copy_from_slice(pattern),
                token: token.take(),
            };
            let reply = store.execute(request, &envelope, NOW).reply;
            let Answer::Page(page) = reply else {
                return Err(TestCaseError::fail(format!("not a page: {reply:?}")));
            };
            if let Some(limit) = reply_limit {
                prop_assert!(page.encode().len() <= limit);
            }
            keys.extend(page.keys);
            let Some(next) = page.token else {
                return Ok(keys);
            };
            token = Some(next);
            if let Some(change) = changes.get(page_number) {
                apply(store, change);
            }
            prop_assert!(page_number < 10_000, "the listing does not end");
        }
        unreachable!()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn an_unchanged_store_lists_every_match_once_in_order(
            keys in prop::collection::vec(key(), 0..40),
            pattern in pattern(),
            limits in limits(),
            reply_limit in proptest::option::of(80..200usize),
        ) {
            let mut store = store_with(&keys, limits);
            let listed = listing(&mut store, &pattern, reply_limit, &[])?;
            let expected: Vec<Bytes> = keys
                .iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|key| glob::matches(&pattern, key))
                .map(|key| Bytes::from(key.clone()))
                .collect();
            prop_assert_eq!(listed, expected);
        }

        #[test]
        fn keys_present_throughout_are_listed_exactly_once(
            keys in prop::collection::vec(key(), 0..40),
            pattern in pattern(),
            limits in limits(),
            changes in prop::collection::vec(
                prop_oneof![key().prop_map(Change::Set), key().prop_map(Change::Del)],
                0..20,
            ),
        ) {
            let mut store = store_with(&keys, limits);
            let listed = listing(&mut store, &pattern, None, &changes)?;
            let touched: BTreeSet<&Vec<u8>> = changes
                .iter()
                .map(|change| match change {
                    Change::Set(key) | Change::Del(key) => key,
                })
                .collect();
            for key in keys.iter().collect::<BTreeSet<_>>() {
                if glob::matches(&pattern, key) && !touched.contains(key) {
                    let times = listed.iter().filter(|listed| listed.as_ref() == key.as_slice()).count();
                    prop_assert_eq!(times, 1, "{:?}", key);
                }
            }
            // Never a key twice, never one that does not match.
            prop_assert!(listed.windows(2).all(|pair| pair[0] < pair[1]));
            prop_assert!(listed.iter().all(|key| glob::matches(&pattern, key)));
        }
    }
}
