//! The emulator's store under any sequence of requests (well-formed or
//! raw bytes through the decoder), envelopes, clock moves, expiries,
//! disconnects and restarts from its persistence records. It must never
//! panic, and it must keep its promises:
//!
//! - every reply has a shape the gateway expects for the verb;
//! - a SCAN page lists, in byte order, exactly the matching keys between
//!   the token's key and the page's, and a token resumes after that key;
//! - versions handed out only grow, and exceed the request's `__ts`;
//! - a SET that answered `+OK` is what a read sees, a DEL `:1` is gone;
//! - notifications go to exactly the clients registered for the key;
//! - the key quota holds;
//! - replaying the persistence records gives back exactly the persisted,
//!   unexpired keys.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use statestore_gateway::emulator::{
    Answer, Envelope, KEY_TOO_LONG_TO_LIST, KEY_TOO_LONG_TO_WATCH, Outcome, Quota, Record,
    ScanLimits, Keyspace,
};
use statestore_gateway::protocol::{
    Hlc, Reply, Request, SetCondition, SetOptions, StoreError, glob,
};

const START_MS: u64 = 1_700_000_000_000;
const CLIENTS: [&str; 3] = ["gw-0", "gw-1", ""];
const KEYS: [&[u8]; 4] = [b"k", b"lock", b"\x00\xff", b"k/2"];
const PATTERNS: [&[u8]; 6] = [b"*", b"k*", b"?", b"[^k]*", b"k\\/?", b"\x00*"];
const VALUES: [&[u8]; 4] = [b"", b"v", b"holder-a", b"\r\n$3\r\n"];

#[derive(Debug, Arbitrary)]
struct Input {
    max_keys: Option<u8>,
    scan_page_keys: u8,
    scan_examined: u8,
    steps: Vec<Step>,
}

#[derive(Debug, Arbitrary)]
enum Step {
    Request {
        command: Command,
        client: u8,
        timestamp: Stamp,
        fencing_token: Option<Stamp>,
        persist: bool,
        advance_ms: u16,
    },
    Expire {
        advance_ms: u32,
    },
    ClockJumpsBack {
        ms: u32,
    },
    Disconnect {
        client: u8,
    },
    Restart {
        advance_ms: u32,
    },
}

#[derive(Debug, Arbitrary)]
enum Command {
    Raw(Vec<u8>),
    Set {
        key: u8,
        value: u8,
        condition: u8,
        px: Option<u16>,
    },
    Get {
        key: u8,
    },
    Del {
        key: u8,
    },
    VDel {
        key: u8,
        value: u8,
    },
    KeyNotify {
        key: u8,
        stop: bool,
    },
    /// SCAN with the token of the last page, if `resume` and there is one.
    Scan {
        pattern: u8,
        resume: bool,
        reply_limit: Option<u8>,
    },
}

#[derive(Debug, Arbitrary)]
enum Stamp {
    Missing,
    Near { offset_ms: i32, counter: u8 },
    Text(String),
}

impl Stamp {
    fn text(&self, now: u64, node: &str) -> Option<String> {
        match self {
            Self::Missing => None,
            Self::Near { offset_ms, counter } => {
                let wall = now.saturating_add_signed(i64::from(*offset_ms));
                Some(format!("{wall}:{counter}:{node}"))
            }
            Self::Text(text) => Some(text.clone()),
        }
    }
}

fn pick<T: Copy>(items: &[T], index: u8) -> T {
    items[usize::from(index) % items.len()]
}

impl Command {
    fn payload(&self, last_token: Option<&Bytes>) -> Bytes {
        let key = |k: &u8| Bytes::from_static(pick(&KEYS, *k));
        let value = |v: &u8| Bytes::from_static(pick(&VALUES, *v));
        let request = match self {
            Self::Raw(bytes) => return Bytes::copy_from_slice(bytes),
            Self::Set {
                key: k,
                value: v,
                condition,
                px,
            } => Request::Set {
                key: key(k),
                value: value(v),
                options: SetOptions {
                    condition: match condition % 3 {
                        0 => SetCondition::Always,
                        1 => SetCondition::OnlyIfMissing,
                        _ => SetCondition::OnlyIfMissingOrEqual,
                    },
                    expires_in_ms: px.map(|ms| u64::from(ms.max(1))),
                },
            },
            Self::Get { key: k } => Request::Get { key: key(k) },
            Self::Del { key: k } => Request::Del { key: key(k) },
            Self::VDel { key: k, value: v } => Request::VDel {
                key: key(k),
                value: value(v),
            },
            Self::KeyNotify { key: k, stop } => Request::KeyNotify {
                key: key(k),
                stop: *stop,
            },
            Self::Scan {
                pattern, resume, ..
            } => Request::Scan {
                pattern: Bytes::from_static(pick(&PATTERNS, *pattern)),
                token: last_token.filter(|_| *resume).cloned(),
            },
        };
        Bytes::from(request.encode())
    }
}

/// What the harness knows independently of the store.
struct Model {
    /// key -> clients registered with KEYNOTIFY.
    registrations: HashMap<Bytes, BTreeSet<String>>,
    /// Every key a request named (to look entries up).
    keys: BTreeSet<Bytes>,
    /// The persistence log: records in the order the store emitted them.
    log: Vec<Record>,
    /// The token of the last SCAN page, and the key it resumes after.
    last_token: Option<(Bytes, Bytes)>,
    /// The newest version the store handed out.
    last_version: Option<(u64, u64)>,
    max_keys: Option<usize>,
}

fn order(hlc: &Hlc) -> (u64, u64) {
    (hlc.wall_ms, hlc.counter)
}

impl Model {
    /// A new version must be above every earlier one.
    fn advance(&mut self, version: &Hlc) {
        if let Some(last) = self.last_version {
            assert!(
                order(version) > last,
                "version {version} not after {last:?}"
            );
        }
        self.last_version = Some(order(version));
    }

    /// Notifications reach exactly the registered clients, once per change.
    fn check_events(&mut self, outcome: &Outcome) {
        let mut changes: BTreeMap<(Bytes, (u64, u64)), BTreeSet<String>> = BTreeMap::new();
        for event in &outcome.events {
            let fresh = changes
                .entry((event.key.clone(), order(&event.version)))
                .or_default()
                .insert(event.client_id.clone());
            assert!(fresh, "two notifications of one change to one client");
        }
        for ((key, _), clients) in changes {
            let registered = self.registrations.get(&key).cloned().unwrap_or_default();
            assert_eq!(clients, registered, "notified clients of {key:?}");
        }
        for record in &outcome.records {
            self.log.push(record.clone());
        }
    }

    fn check_quota(&self, store: &Keyspace) {
        if let Some(max) = self.max_keys {
            assert!(store.len() <= max, "{} keys, quota {max}", store.len());
        }
    }
}

/// Versions of expiry deletes in an outcome, oldest first.
fn expiry_versions(outcome: &Outcome) -> Vec<Hlc> {
    let mut versions: Vec<Hlc> = outcome.events.iter().map(|e| e.version.clone()).collect();
    versions.sort();
    versions.dedup_by(|a, b| order(a) == order(b));
    versions
}

fn run(input: Input) {
    let quota = Quota {
        max_keys: input.max_keys.map(usize::from),
        max_bytes: None,
    };
    let mut now = START_MS;
    let scan_limits = ScanLimits {
        max_keys: usize::from(input.scan_page_keys % 4) + 1,
        max_examined: usize::from(input.scan_examined % 6) + 1,
        ..ScanLimits::default()
    };
    let mut store = Keyspace::new(quota, now);
    // A fixed id keeps runs reproducible (the real one is random).
    store.set_id(7);
    store.set_scan_limits(scan_limits);
    let mut model = Model {
        registrations: HashMap::new(),
        keys: BTreeSet::new(),
        log: Vec::new(),
        last_token: None,
        last_version: None,
        max_keys: quota.max_keys,
    };
    for step in input.steps.into_iter().take(64) {
        match step {
            Step::Request {
                command,
                client,
                timestamp,
                fencing_token,
                persist,
                advance_ms,
            } => {
                now += u64::from(advance_ms);
                let client_id = pick(&CLIENTS, client);
                let timestamp = timestamp.text(now, client_id);
                let fencing_token = fencing_token.and_then(|t| t.text(now, "StateStore"));
                let reply_limit = match &command {
                    Command::Scan { reply_limit, .. } => reply_limit.map(|n| usize::from(n) + 20),
                    _ => None,
                };
                let envelope = Envelope {
                    client_id,
                    timestamp: timestamp.as_deref(),
                    fencing_token: fencing_token.as_deref(),
                    persist,
                    reply_limit,
                    acl: None,
                };
                let last_token = model.last_token.as_ref().map(|(token, _)| token);
                let Ok(request) = Request::decode(&command.payload(last_token)) else {
                    continue;
                };
                if let Some(key) = request.key() {
                    model.keys.insert(key.clone());
                }
                let sent_ts = timestamp.as_deref().and_then(|t| Hlc::parse(t).ok());
                let outcome = store.execute(request.clone(), &envelope, now);
                // Expiry deletes happen first; their versions come first.
                let own_version = match (&request, &outcome.reply) {
                    (Request::Set { .. }, Answer::Reply(Reply::Ok))
                    | (
                        Request::Del { .. } | Request::VDel { .. },
                        Answer::Reply(Reply::Integer(1)),
                    ) => outcome.version.clone(),
                    _ => None,
                };
                for version in expiry_versions(&outcome) {
                    if own_version
                        .as_ref()
                        .is_none_or(|own| order(own) != order(&version))
                    {
                        model.advance(&version);
                    }
                }
                if let Some(version) = &own_version {
                    model.advance(version);
                    if let Some(ts) = &sent_ts {
                        assert!(
                            order(version) > order(ts),
                            "version {version} not after __ts {ts}"
                        );
                    }
                }
                model.check_events(&outcome);
                match &outcome.reply {
                    Answer::Reply(reply) => {
                        check_reply(&request, reply, &outcome, &store, client_id, &mut model);
                    }
                    Answer::Page(page) => check_page(&request, page, reply_limit, &store, &mut model),
                }
                model.check_quota(&store);
            }
            Step::Expire { advance_ms } => {
                now += u64::from(advance_ms);
                let outcome = store.expire(now);
                for version in expiry_versions(&outcome) {
                    model.advance(&version);
                }
                model.check_events(&outcome);
                if let Some(next) = store.next_expiry() {
                    assert!(next > now, "a due key survived expire");
                }
            }
            Step::ClockJumpsBack { ms } => now -= u64::from(ms),
            Step::Disconnect { client } => {
                let client_id = pick(&CLIENTS, client);
                store.client_disconnected(client_id);
                for clients in model.registrations.values_mut() {
                    clients.remove(client_id);
                }
                model.registrations.retain(|_, clients| !clients.is_empty());
                assert_eq!(store.registrations(), registrations(&model));
            }
            Step::Restart { advance_ms } => {
                now += u64::from(advance_ms);
                store = restart(&store, &mut model, quota, scan_limits, now);
            }
        }
    }
}

fn registrations(model: &Model) -> usize {
    model.registrations.values().map(BTreeSet::len).sum()
}

/// Replays the log into a new store (as the emulator does at start) and
/// checks it holds exactly the persisted keys that have not expired.
fn restart(
    old: &Keyspace,
    model: &mut Model,
    quota: Quota,
    scan_limits: ScanLimits,
    now: u64,
) -> Keyspace {
    let mut store = Keyspace::new(quota, now);
    for record in &model.log {
        match record {
            Record::Set { key, entry } => store.restore(key.clone(), entry.clone(), now),
            Record::Delete { key } => store.forget(key),
        }
    }
    let expected: BTreeMap<Bytes, _> = old
        .persistent_entries()
        .filter(|(_, entry)| entry.expires_at_ms.is_none_or(|at| at > now))
        .map(|(key, entry)| (key.clone(), entry.clone()))
        .collect();
    let restored: BTreeMap<Bytes, _> = store
        .persistent_entries()
        .map(|(key, entry)| (key.clone(), entry.clone()))
        .collect();
    assert_eq!(restored, expected, "replayed persistence log");
    assert_eq!(store.len(), expected.len(), "only persisted keys come back");
    // Registrations belong to connections: a restart drops them; a token
    // survives only with the store's id, which the emulator persists.
    model.registrations.clear();
    store.set_id(old.id());
    store.set_scan_limits(scan_limits);
    model.log = expected
        .into_iter()
        .map(|(key, entry)| Record::Set { key, entry })
        .collect();
    // New versions only need to pass the restored ones.
    model.last_version = store
        .persistent_entries()
        .map(|(_, entry)| order(&entry.version))
        .max();
    store
}

/// The reply has a shape the gateway expects for the verb, and the store
/// agrees with it afterwards.
fn check_reply(
    request: &Request,
    reply: &Reply,
    outcome: &Outcome,
    store: &Keyspace,
    client_id: &str,
    model: &mut Model,
) {
    let entry = request.key().and_then(|key| store.entry(key));
    match (request, reply) {
        (_, Reply::Error(error)) => {
            // The strings the emulator adds: keys too long for a topic or a page.
            if let StoreError::Unknown(text) = error {
                assert!(text == KEY_TOO_LONG_TO_WATCH || text == KEY_TOO_LONG_TO_LIST);
            }
            if let Request::Scan { token: Some(token), .. } = request {
                let issued = model.last_token.as_ref().is_some_and(|(last, _)| last == token);
                assert!(!issued || *error != StoreError::SyntaxError, "own token refused");
            }
            assert_eq!(outcome.version, None, "an error carries no version");
        }
        (Request::Set { value, .. }, Reply::Ok) => {
            let entry = entry.expect("a key that was just set");
            assert_eq!(&entry.value, value);
            assert_eq!(Some(&entry.version), outcome.version.as_ref());
        }
        (Request::Set { options, .. }, Reply::Integer(-1)) => {
            assert_ne!(options.condition, SetCondition::Always);
            assert!(
                entry.is_some(),
                "a condition can only fail on an existing key"
            );
        }
        (Request::Get { .. }, Reply::Value(value)) => {
            let entry = entry.expect("a key that was just read");
            assert_eq!(&entry.value, value);
            assert_eq!(Some(&entry.version), outcome.version.as_ref());
        }
        (Request::Get { .. }, Reply::NotFound) => assert!(entry.is_none()),
        (Request::Del { .. } | Request::VDel { .. }, Reply::Integer(1)) => {
            assert!(entry.is_none(), "a deleted key is gone");
        }
        (Request::Del { .. } | Request::VDel { .. }, Reply::Integer(0)) => {
            assert!(entry.is_none());
            assert_eq!(outcome.version, None);
        }
        (Request::VDel { value, .. }, Reply::Integer(-1)) => {
            assert_ne!(&entry.expect("a key that holds another value").value, value);
        }
        (Request::KeyNotify { key, stop: false }, Reply::Ok) => {
            model
                .registrations
                .entry(key.clone())
                .or_default()
                .insert(client_id.to_owned());
        }
        (Request::KeyNotify { key, stop: true }, Reply::Ok | Reply::Integer(0)) => {
            let was = model
                .registrations
                .get_mut(key)
                .is_some_and(|clients| clients.remove(client_id));
            assert_eq!(
                was,
                *reply == Reply::Ok,
                "STOP of {key:?} answered {reply:?}"
            );
            model.registrations.retain(|_, clients| !clients.is_empty());
        }
        (request, reply) => panic!("{} answered {reply:?}", request.verb()),
    }
    assert_eq!(store.registrations(), registrations(model));
}

/// A SCAN page lists exactly the matching keys after the token's key, in
/// order, up to the page's token (or to the end), within the reply limit.
fn check_page(request: &Request, page: &statestore_gateway::protocol::KeyPage, reply_limit: Option<usize>, store: &Keyspace, model: &mut Model) {
    let Request::Scan { pattern, token } = request else {
        panic!("{} answered a page", request.verb());
    };
    if let Some(limit) = reply_limit {
        assert!(page.encode().len() <= limit, "page over the reply limit");
    }
    // `{id};{key}`: the store accepted the token, so it has the prefix.
    let id = format!("{};", store.id());
    let key_of = |token: &Bytes| {
        assert!(token.starts_with(id.as_bytes()), "a token starts with the store id");
        token.slice(id.len()..)
    };
    let after = token.as_ref().map(key_of);
    let upto = page.token.as_ref().map(key_of);
    let expected: Vec<Bytes> = model
        .keys
        .iter()
        .filter(|key| store.entry(key).is_some())
        .filter(|key| after.as_ref().is_none_or(|after| *key > after))
        .filter(|key| upto.as_ref().is_none_or(|upto| *key <= upto))
        .filter(|key| glob::matches(pattern, key))
        .cloned()
        .collect();
    assert_eq!(page.keys, expected, "page of {pattern:?} after {after:?}");
    if let Some(upto) = upto {
        assert!(after.is_none_or(|after| upto > after), "a token moves forward");
        model.last_token = page.token.clone().map(|token| (token, upto));
    } else {
        model.last_token = None;
    }
}

fuzz_target!(|input: Input| run(input));
