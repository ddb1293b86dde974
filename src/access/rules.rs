//! Per-key and per-topic rules (`--authz-file`): which caller may read or
//! write which keys, and publish or subscribe to which topics (Dapr's
//! pub/sub), in the shape of the broker's own BrokerAuthorization policy
//! (`stateStoreResources`, `brokerResources`), so that a team can copy
//! theirs.
//!
//! ```yaml
//! rules:
//!   - principals:
//!       subjects: ["system:serviceaccount:apps:dashboard"]   # "*": any caller
//!       apiToken: true          # the caller of the shared --api-token-file
//!     stateStoreResources:
//!       - keyType: Pattern      # Pattern | String | Binary (base64)
//!         keys: ["sensors/*"]
//!         method: Read          # Read | Write | ReadWrite
//!     brokerResources:
//!       - method: Publish       # Publish | Subscribe (Connect: ignored)
//!         topics: ["orders/+", "telemetry/#"]   # MQTT topic filters
//! ```
//!
//! With rules, everything they do not allow is denied. The file is
//! compiled once per load into [`Rules`]: each subject's grants (its own
//! rules and the `"*"` ones) merged, so a decision is one map lookup and a
//! few comparisons ([`Grants::allows`], the one place it is made). It is
//! read again every few seconds; a file that does not parse keeps the
//! rules in force, with an error logged and counted.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use axum::http::request::Parts;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde::Deserialize;
use thiserror::Error;

use crate::files::reloading::{FileError, Reload, ReloadingFile};
use crate::metrics::Metrics;
use crate::protocol::glob;
use crate::settings::{self, SettingError};
use crate::store::reserved::{is_reserved, reserved_prefix};
use crate::watch::ReadFilter;

/// Why a caller may not do something to a key (a 403).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Denied {
    /// The rules do not let the caller do it.
    #[error("the authorization rules do not allow {caller} to {need} this key")]
    Rules {
        /// Who asked, as the 403 names it.
        caller: String,
        /// The rules' method the request needed (`Read`, `Write`).
        need: &'static str,
    },
    /// The key is one of the gateway's own records, which no caller may
    /// use, whatever the rules say (and without rules).
    #[error(
        "keys starting with {prefix:?} are reserved for the gateway's own records: no caller may {need} them"
    )]
    Reserved {
        /// The reserved prefix the key starts with.
        prefix: &'static str,
        /// The rules' method the request needed (`Read`, `Write`).
        need: &'static str,
    },
}

/// What a request does to a key: the rules' `method` it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// GET, HEAD, watches, listings, a lock's GET.
    Read,
    /// PUT, DELETE, a lock's PUT and DELETE.
    Write,
}

impl Need {
    /// What a request with `method` needs of the key its path names.
    pub fn of(method: &Method) -> Need {
        if method == Method::GET || method == Method::HEAD {
            Need::Read
        } else {
            Need::Write
        }
    }

    /// As the rules spell it, and the denial metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Need::Read => "Read",
            Need::Write => "Write",
        }
    }
}

/// What a pub/sub request does to a topic: the rules' broker `method` it
/// needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicNeed {
    /// Publish on a topic.
    Publish,
    /// Subscribe to a topic filter.
    Subscribe,
}

impl TopicNeed {
    /// As the rules spell it, and the denial metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            TopicNeed::Publish => "Publish",
            TopicNeed::Subscribe => "Subscribe",
        }
    }
}

/// The keys one caller may read and those it may write, and the topic
/// filters it may publish and subscribe to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    read: KeySet,
    write: KeySet,
    publish: Vec<String>,
    subscribe: Vec<String>,
}

impl Grants {
    /// Whether these grants let a caller do `need` to `key`: never to a
    /// reserved key, which no grant matches.
    pub fn allows(&self, key: &[u8], need: Need) -> bool {
        if is_reserved(key) {
            return false;
        }
        match need {
            Need::Read => self.read.contains(key),
            Need::Write => self.write.contains(key),
        }
    }

    /// Whether these grants let a caller publish on `topic` (a topic
    /// name) or subscribe to `topic` (a filter, wildcards allowed: every
    /// topic it matches must be granted).
    pub fn allows_topic(&self, topic: &str, need: TopicNeed) -> bool {
        let granted = match need {
            TopicNeed::Publish => &self.publish,
            TopicNeed::Subscribe => &self.subscribe,
        };
        granted.iter().any(|filter| filter_covers(filter, topic))
    }

    fn add_topics(&mut self, resource: &BrokerResource) {
        let set = match resource.method {
            BrokerMethod::Connect => return,
            BrokerMethod::Publish => &mut self.publish,
            BrokerMethod::Subscribe => &mut self.subscribe,
        };
        for topic in &resource.topics {
            if !set.contains(topic) {
                set.push(topic.clone());
            }
        }
    }

    fn add(&mut self, resource: &Resource) {
        let sets: &mut [&mut KeySet] = match resource.method {
            RuleMethod::Read => &mut [&mut self.read],
            RuleMethod::Write => &mut [&mut self.write],
            RuleMethod::ReadWrite => &mut [&mut self.read, &mut self.write],
        };
        for set in sets {
            set.add(&resource.keys);
        }
    }

    fn merge(&mut self, other: &Grants) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        for (set, others) in [
            (&mut self.publish, &other.publish),
            (&mut self.subscribe, &other.subscribe),
        ] {
            for topic in others {
                if !set.contains(topic) {
                    set.push(topic.clone());
                }
            }
        }
    }
}

/// Whether the MQTT topic filter `granted` matches every topic `asked`
/// (a topic name, or itself a filter) matches: level by level, `+` in
/// `granted` takes any one level (`+` too), `#` the rest (`#` too);
/// `asked`'s wildcards need the same or wider in `granted`. Topics
/// starting with `$` only match filters that name their first level, as
/// the broker matches them.
fn filter_covers(granted: &str, asked: &str) -> bool {
    let mut granted_levels = granted.split('/');
    let mut asked_levels = asked.split('/');
    let mut first = true;
    loop {
        match (granted_levels.next(), asked_levels.next()) {
            (Some("#"), Some(level)) => return !(first && level.starts_with('$')),
            (Some("#"), None) => return true,
            (Some("+"), Some(level)) => {
                if level == "#" || (first && level.starts_with('$')) {
                    return false;
                }
            }
            (Some(want), Some(level)) => {
                if want != level {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        first = false;
    }
}

/// Keys as the rules name them: exact keys in a hash set, globs in a list
/// (a glob without special bytes is an exact key, `*` is every key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeySet {
    everything: bool,
    exact: HashSet<Bytes>,
    globs: Vec<Bytes>,
}

impl KeySet {
    fn contains(&self, key: &[u8]) -> bool {
        self.everything
            || self.exact.contains(key)
            || self.globs.iter().any(|pattern| glob::matches(pattern, key))
    }

    fn add(&mut self, keys: &[RuleKey]) {
        for key in keys {
            match key {
                RuleKey::Exact(key) => {
                    self.exact.insert(key.clone());
                }
                RuleKey::Glob(pattern) if pattern.iter().all(|&byte| byte == b'*') => {
                    self.everything = true;
                }
                RuleKey::Glob(pattern) if !pattern.iter().any(|byte| b"*?[\\".contains(byte)) => {
                    self.exact.insert(pattern.clone());
                }
                RuleKey::Glob(pattern) => {
                    if !self.globs.contains(pattern) {
                        self.globs.push(pattern.clone());
                    }
                }
            }
        }
    }

    fn merge(&mut self, other: &KeySet) {
        self.everything |= other.everything;
        self.exact.extend(other.exact.iter().cloned());
        for pattern in &other.globs {
            if !self.globs.contains(pattern) {
                self.globs.push(pattern.clone());
            }
        }
    }
}

/// A rules file, compiled: the grants of each subject it names (its own
/// rules merged with the `"*"` ones), of any other subject, and of the
/// shared API token's caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    subjects: HashMap<Arc<str>, Arc<Grants>>,
    anyone: Arc<Grants>,
    api_token: Arc<Grants>,
    count: usize,
}

impl Rules {
    /// Parses and compiles a rules file; the error names the line and
    /// column of what is wrong.
    pub fn parse(text: &str) -> Result<Rules, String> {
        let file: RulesFile = serde_saphyr::from_str(text).map_err(|error| {
            // The first line says where and what; the rest is a snippet.
            let text = error.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.trim_start_matches("error: ").to_owned()
        })?;
        let mut anyone = Grants::default();
        let mut api_token = Grants::default();
        let mut subjects: HashMap<Arc<str>, Grants> = HashMap::new();
        for rule in &file.rules {
            let mut grants = Grants::default();
            for resource in &rule.resources {
                grants.add(resource);
            }
            for resource in &rule.broker_resources {
                grants.add_topics(resource);
            }
            let principals = &rule.principals;
            if principals.subjects.iter().any(|subject| subject == "*") {
                anyone.merge(&grants);
            }
            if principals.api_token {
                api_token.merge(&grants);
            }
            for subject in principals.subjects.iter().filter(|s| *s != "*") {
                subjects
                    .entry(Arc::from(subject.as_str()))
                    .or_default()
                    .merge(&grants);
            }
        }
        // `"*"` is every caller: merged into each one's own grants, so a
        // decision looks up one entry.
        api_token.merge(&anyone);
        let subjects = subjects
            .into_iter()
            .map(|(subject, mut grants)| {
                grants.merge(&anyone);
                (subject, Arc::new(grants))
            })
            .collect();
        Ok(Rules {
            subjects,
            anyone: Arc::new(anyone),
            api_token: Arc::new(api_token),
            count: file.rules.len(),
        })
    }

    /// The grants of `principal`.
    pub fn grants(&self, principal: &Principal) -> Arc<Grants> {
        match principal {
            Principal::ApiToken => Arc::clone(&self.api_token),
            Principal::Subject(subject) => {
                Arc::clone(self.subjects.get(subject.as_ref()).unwrap_or(&self.anyone))
            }
            Principal::Nobody => Arc::default(),
        }
    }

    /// Whether `principal` may do `need` to `key`: the one decision.
    pub fn allows(&self, principal: &Principal, key: &[u8], need: Need) -> bool {
        self.grants(principal).allows(key, need)
    }

    /// How many rules the file holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the file holds no rule (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// `--authz-file` and how often it is read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzSettings {
    /// The rules file.
    pub file: PathBuf,
    /// How often it is read again.
    pub check_interval: Duration,
}

impl AuthzSettings {
    /// `file`, read again every [`settings::DEFAULT_AUTHZ_CHECK_INTERVAL`].
    pub fn new(file: PathBuf) -> Self {
        Self {
            file,
            check_interval: settings::DEFAULT_AUTHZ_CHECK_INTERVAL,
        }
    }
}

/// The rules in force, read again from their file when it changes; cheap
/// to clone.
#[derive(Debug, Clone)]
pub struct Authz(ReloadingFile<RulesReload>);

/// How the rules file parses, and what its loads record.
#[derive(Debug)]
struct RulesReload {
    metrics: Metrics,
}

impl Reload for RulesReload {
    type Value = Rules;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<Rules, FileError> {
        let text =
            std::str::from_utf8(&contents[0]).map_err(|_| "the file is not UTF-8".to_owned())?;
        Ok(Rules::parse(text)?)
    }

    fn installed(&self, paths: &[PathBuf], rules: &Rules, first: bool) {
        self.metrics.authz_rules.set(rules.len() as i64);
        self.metrics.authz_reload_ok.set(1);
        let file = paths[0].display();
        if first {
            tracing::info!(%file, rules = rules.len(), "authorization rules loaded");
        } else {
            tracing::info!(%file, rules = rules.len(), "authorization rules reloaded");
        }
    }

    fn kept(&self, paths: &[PathBuf], error: &str) {
        self.metrics.authz_reload_failures.inc();
        self.metrics.authz_reload_ok.set(0);
        tracing::error!(file = %paths[0].display(), %error, "cannot reload the authorization rules; keeping the previous ones");
    }
}

impl Authz {
    /// Reads the rules file (a bad one is a bad `--authz-file`) and, when
    /// `check_interval` is given, starts reading it again that often in
    /// the background (so this must run inside a Tokio runtime), for as
    /// long as the returned handle or a clone of it lives.
    pub fn load(
        file: PathBuf,
        check_interval: Option<Duration>,
        metrics: Metrics,
    ) -> Result<Authz, SettingError> {
        ReloadingFile::load(vec![file], RulesReload { metrics }, check_interval)
            .map(Authz)
            .map_err(|error| SettingError::new(&settings::AUTHZ_FILE, error.message))
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.0.current()
    }
}

/// Whom a request's grants are looked up for: the guard's caller, as the
/// rules name callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The caller of the shared API token (`apiToken: true`, and `"*"`).
    ApiToken,
    /// A token's subject (`subjects`, and `"*"`).
    Subject(Arc<str>),
    /// Nobody authenticated the request: no rule names it.
    Nobody,
}

impl Principal {
    /// As a 403 names it.
    fn name(&self) -> String {
        match self {
            Principal::ApiToken => "the API token's caller".into(),
            Principal::Subject(subject) => {
                format!("{:?}", subject.chars().take(256).collect::<String>())
            }
            Principal::Nobody => "an unauthenticated caller".into(),
        }
    }
}

/// What the caller of one request may do, put into the request's
/// extensions by the guard when rules are configured; without rules it is
/// absent and every key but the gateway's reserved ones
/// ([`crate::store::reserved`]) is allowed. An extractor (in `extract`),
/// so that any handler can take it; the key routes check through
/// [`Key`](crate::http::api::extract::Key). Every check of a key a caller
/// names goes through here: this is where reserved keys are refused.
#[derive(Debug, Clone, Default)]
pub struct Access(Option<Checked>);

#[derive(Debug, Clone)]
struct Checked {
    authz: Authz,
    principal: Principal,
    /// The caller's grants under the rules in force when the request came.
    grants: Arc<Grants>,
}

impl Authz {
    /// What `principal` may do under the rules in force now.
    pub fn access(&self, principal: Principal) -> Access {
        let grants = self.rules().grants(&principal);
        Access(Some(Checked {
            authz: self.clone(),
            principal,
            grants,
        }))
    }
}

impl Access {
    /// The access of a request under `authz` (none: every key but the
    /// reserved ones is allowed): the one the guard put into its
    /// extensions; a request the guard did not see is nobody's.
    pub fn of(parts: &Parts, authz: Option<&Authz>) -> Access {
        match authz {
            None => Access(None),
            Some(authz) => parts
                .extensions
                .get::<Access>()
                .cloned()
                .unwrap_or_else(|| authz.access(Principal::Nobody)),
        }
    }

    /// Whether the caller may do `need` to `key`.
    pub fn allows(&self, key: &[u8], need: Need) -> bool {
        match &self.0 {
            Some(checked) => checked.grants.allows(key, need),
            None => !is_reserved(key),
        }
    }

    /// Whether the caller may read every one of `keys` (for a listing's
    /// page: true lets it skip the key by key check).
    pub fn reads_all(&self, keys: &[Bytes]) -> bool {
        self.0.is_none() && !keys.iter().any(|key| is_reserved(key))
    }

    /// `Ok` when the caller may do `need` to `key`, else 403: a reserved
    /// key whatever the rules, or one the rules refuse (naming the caller
    /// and `need`, and counted by `need`).
    pub fn require(&self, key: &[u8], need: Need) -> Result<(), Denied> {
        if let Some(prefix) = reserved_prefix(key) {
            return Err(Denied::Reserved {
                prefix,
                need: need.as_str(),
            });
        }
        match &self.0 {
            Some(checked) if !checked.grants.allows(key, need) => Err(self.denied(need)),
            _ => Ok(()),
        }
    }

    /// Whether the caller may do `need` to `key` under the rules in force
    /// now, not those of when the request came: for a request that waited.
    pub fn allows_now(&self, key: &[u8], need: Need) -> bool {
        match &self.0 {
            Some(checked) => checked
                .authz
                .rules()
                .grants(&checked.principal)
                .allows(key, need),
            None => !is_reserved(key),
        }
    }

    /// `Ok` when the caller may `need` on `topic` (always, without rules),
    /// else the 403 naming the caller (counted by `need`).
    pub fn require_topic(&self, topic: &str, need: TopicNeed) -> Result<(), Denied> {
        match &self.0 {
            Some(checked) if !checked.grants.allows_topic(topic, need) => {
                Err(self.denial(need.as_str()))
            }
            _ => Ok(()),
        }
    }

    /// The 403 of a caller the rules refuse `need` (counted by `need`).
    pub fn denied(&self, need: Need) -> Denied {
        self.denial(need.as_str())
    }

    /// The 403 of a caller the rules refuse the method `need`.
    fn denial(&self, need: &'static str) -> Denied {
        let caller = match &self.0 {
            Some(checked) => {
                checked
                    .authz
                    .0
                    .reload()
                    .metrics
                    .authz_denials
                    .with_label_values(&[need])
                    .inc();
                checked.principal.name()
            }
            None => Principal::Nobody.name(),
        };
        Denied::Rules { caller, need }
    }

    /// For a watch stream: whether the caller may read a key under the
    /// rules in force when it is asked (a reload applies to open streams);
    /// a reserved key never. `None` without rules: the hub's patterns
    /// never follow reserved keys, and a named key was checked by
    /// [`Access::require`].
    pub fn live_read_filter(&self) -> Option<ReadFilter> {
        let checked = self.0.as_ref()?;
        let authz = checked.authz.clone();
        let principal = checked.principal.clone();
        Some(Arc::new(move |key: &[u8]| {
            authz.rules().grants(&principal).allows(key, Need::Read)
        }))
    }
}

/// The file as written: `rules:` and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    rules: Vec<Rule>,
}

/// One rule: who, which keys with which method, which topics with which
/// method (at least one of the two).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", try_from = "RuleFile")]
struct Rule {
    principals: Principals,
    resources: Vec<Resource>,
    broker_resources: Vec<BrokerResource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuleFile {
    principals: Principals,
    #[serde(rename = "stateStoreResources")]
    resources: Option<Vec<Resource>>,
    broker_resources: Option<Vec<BrokerResource>>,
}

impl TryFrom<RuleFile> for Rule {
    type Error = String;

    fn try_from(file: RuleFile) -> Result<Self, String> {
        if file.resources.is_none() && file.broker_resources.is_none() {
            return Err(
                "a rule grants nothing: give stateStoreResources, brokerResources or both".into(),
            );
        }
        Ok(Rule {
            principals: file.principals,
            resources: file.resources.unwrap_or_default(),
            broker_resources: file.broker_resources.unwrap_or_default(),
        })
    }
}

/// A `brokerResources` entry's `method`, as the broker spells it.
#[derive(Debug, Clone, Copy, Deserialize)]
enum BrokerMethod {
    Connect,
    Publish,
    Subscribe,
}

/// One `brokerResources` entry: topic filters and what may be done on
/// them (`Connect`, whose `clientIds` the gateway cannot see, grants
/// nothing here).
#[derive(Debug, Deserialize)]
#[serde(try_from = "BrokerResourceFile")]
struct BrokerResource {
    method: BrokerMethod,
    topics: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BrokerResourceFile {
    method: BrokerMethod,
    #[serde(default)]
    topics: Vec<String>,
    #[serde(default)]
    client_ids: Vec<String>,
}

impl TryFrom<BrokerResourceFile> for BrokerResource {
    type Error = String;

    fn try_from(file: BrokerResourceFile) -> Result<Self, String> {
        match file.method {
            BrokerMethod::Connect => {
                if !file.topics.is_empty() {
                    return Err("method Connect takes clientIds, not topics".into());
                }
            }
            BrokerMethod::Publish | BrokerMethod::Subscribe => {
                if !file.client_ids.is_empty() {
                    return Err("clientIds go with method Connect only".into());
                }
                if file.topics.is_empty() {
                    return Err("topics is empty: name at least one topic filter".into());
                }
            }
        }
        for topic in &file.topics {
            if topic.contains("{principal.") {
                return Err(format!(
                    "{topic:?}: the broker's {{principal.*}} variables are not supported; name the topics"
                ));
            }
            if !is_topic_filter(topic) {
                return Err(format!(
                    "{topic:?} is not an MQTT topic filter: not empty, '+' and '#' a whole level each, '#' last"
                ));
            }
        }
        Ok(BrokerResource {
            method: file.method,
            topics: file.topics,
        })
    }
}

/// Whether `topic` is a valid MQTT topic filter.
fn is_topic_filter(topic: &str) -> bool {
    if topic.is_empty() || topic.contains('\0') {
        return false;
    }
    let levels: Vec<&str> = topic.split('/').collect();
    levels.iter().enumerate().all(|(at, level)| match *level {
        "#" => at == levels.len() - 1,
        "+" => true,
        other => !other.contains(['+', '#']),
    })
}

/// Whom a rule applies to: token subjects (`"*"`: every caller, the API
/// token's included) and the caller of the shared API token.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    try_from = "PrincipalsFile"
)]
struct Principals {
    subjects: Vec<String>,
    api_token: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrincipalsFile {
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default)]
    api_token: bool,
}

impl TryFrom<PrincipalsFile> for Principals {
    type Error = String;

    fn try_from(file: PrincipalsFile) -> Result<Self, String> {
        if file.subjects.is_empty() && !file.api_token {
            return Err(
                "principals names nobody: give subjects (\"*\" for every caller) or apiToken: true"
                    .into(),
            );
        }
        if file.subjects.iter().any(String::is_empty) {
            return Err("a subject is empty".into());
        }
        Ok(Principals {
            subjects: file.subjects,
            api_token: file.api_token,
        })
    }
}

/// `keyType`, as the broker spells it.
#[derive(Debug, Clone, Copy, Deserialize)]
enum KeyType {
    Pattern,
    String,
    Binary,
}

/// `method`, as the broker spells it.
#[derive(Debug, Clone, Copy, Deserialize)]
enum RuleMethod {
    Read,
    Write,
    ReadWrite,
}

/// One `stateStoreResources` entry, its keys decoded.
#[derive(Debug, Deserialize)]
#[serde(try_from = "ResourceFile")]
struct Resource {
    keys: Vec<RuleKey>,
    method: RuleMethod,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResourceFile {
    key_type: KeyType,
    keys: Vec<String>,
    method: RuleMethod,
}

/// A key of a rule: a glob or exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleKey {
    Glob(Bytes),
    Exact(Bytes),
}

impl TryFrom<ResourceFile> for Resource {
    type Error = String;

    fn try_from(file: ResourceFile) -> Result<Self, String> {
        if file.keys.is_empty() {
            return Err("keys is empty: name at least one key".into());
        }
        let keys = file
            .keys
            .into_iter()
            .map(|key| {
                if key.is_empty() {
                    return Err("a key is empty".to_owned());
                }
                if key.contains("{principal.") {
                    return Err(format!(
                        "{key:?}: the broker's {{principal.*}} variables are not supported; name the keys"
                    ));
                }
                Ok(match file.key_type {
                    KeyType::Pattern => RuleKey::Glob(Bytes::from(key)),
                    KeyType::String => RuleKey::Exact(Bytes::from(key)),
                    KeyType::Binary => {
                        let bytes = BASE64.decode(key.as_bytes()).map_err(|error| {
                            format!("{key:?} is not base64 (keyType Binary): {error}")
                        })?;
                        if bytes.is_empty() {
                            return Err("a key is empty".to_owned());
                        }
                        RuleKey::Exact(Bytes::from(bytes))
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Resource {
            keys,
            method: file.method,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(name: &str) -> Principal {
        Principal::Subject(Arc::from(name))
    }

    const DASHBOARD: &str = "system:serviceaccount:apps:dashboard";

    fn rules(text: &str) -> Rules {
        Rules::parse(text).unwrap_or_else(|error| panic!("{error}\n{text}"))
    }

    #[test]
    fn the_brokers_shape_is_read_and_patterns_match_as_the_listing_does() {
        let rules = rules(&format!(
            r#"
rules:
  - principals:
      subjects: ["{DASHBOARD}"]
    stateStoreResources:
      - keyType: Pattern
        keys: ["sensors/*", "room?/[a-c]"]
        method: Read
"#
        ));
        let dashboard = subject(DASHBOARD);
        let caller = &dashboard;
        assert!(rules.allows(caller, b"sensors/1", Need::Read));
        assert!(rules.allows(caller, b"sensors/", Need::Read));
        assert!(rules.allows(caller, b"room1/b", Need::Read));
        assert!(!rules.allows(caller, b"room1/d", Need::Read));
        assert!(!rules.allows(caller, b"sensors", Need::Read));
        assert!(!rules.allows(caller, b"sensors/1", Need::Write));
        let other = subject("system:serviceaccount:apps:other");
        assert!(!rules.allows(&other, b"sensors/1", Need::Read));
        assert!(!rules.allows(&Principal::ApiToken, b"sensors/1", Need::Read));
        assert!(!rules.allows(&Principal::Nobody, b"sensors/1", Need::Read));
        assert_eq!(rules.len(), 1);
    }

    #[test]
    fn broker_resources_grant_topics_by_mqtt_filter() {
        let rules = rules(
            r#"
rules:
  - principals: {subjects: [a]}
    brokerResources:
      - {method: Connect, clientIds: ["a-*"]}
      - {method: Publish, topics: ["orders/+", "telemetry/#"]}
      - {method: Subscribe, topics: ["orders/#"]}
  - principals: {subjects: ["*"]}
    brokerResources:
      - {method: Publish, topics: ["public"]}
"#,
        );
        let a = rules.grants(&subject("a"));
        assert!(a.allows_topic("orders/eu", TopicNeed::Publish));
        assert!(!a.allows_topic("orders/eu/1", TopicNeed::Publish));
        assert!(!a.allows_topic("orders", TopicNeed::Publish));
        assert!(a.allows_topic("telemetry", TopicNeed::Publish));
        assert!(a.allows_topic("telemetry/a/b", TopicNeed::Publish));
        assert!(a.allows_topic("public", TopicNeed::Publish));
        // A subscription's filter must be covered whole.
        assert!(a.allows_topic("orders/+", TopicNeed::Subscribe));
        assert!(a.allows_topic("orders/#", TopicNeed::Subscribe));
        assert!(a.allows_topic("orders", TopicNeed::Subscribe));
        assert!(!a.allows_topic("#", TopicNeed::Subscribe));
        assert!(!a.allows_topic("+/eu", TopicNeed::Subscribe));
        assert!(!a.allows_topic("telemetry/x", TopicNeed::Subscribe));
        let other = rules.grants(&subject("b"));
        assert!(other.allows_topic("public", TopicNeed::Publish));
        assert!(!other.allows_topic("orders/eu", TopicNeed::Publish));
        // Rules without keys grant no key.
        assert!(!a.allows(b"orders/eu", Need::Read));
    }

    #[test]
    fn a_dollar_topic_is_not_under_a_leading_wildcard() {
        assert!(!filter_covers("#", "$SYS/x"));
        assert!(!filter_covers("+/x", "$SYS/x"));
        assert!(filter_covers("$SYS/#", "$SYS/x"));
        assert!(filter_covers("a/#", "a"));
    }

    #[test]
    fn bad_broker_resources_are_refused_by_name() {
        for (resource, expected) in [
            ("{method: Publish, topics: []}", "topics is empty"),
            (
                "{method: Publish, topics: [\"a/#/b\"]}",
                "not an MQTT topic filter",
            ),
            (
                "{method: Subscribe, topics: [\"a+\"]}",
                "not an MQTT topic filter",
            ),
            (
                "{method: Publish, topics: [\"{principal.clientId}/x\"]}",
                "not supported",
            ),
            ("{method: Connect, topics: [a]}", "Connect takes clientIds"),
            ("{method: Listen, topics: [a]}", "Listen"),
        ] {
            let text = format!(
                "rules:\n  - principals: {{subjects: [a]}}\n    brokerResources:\n      - {resource}\n"
            );
            let error = Rules::parse(&text).unwrap_err();
            assert!(error.contains(expected), "{resource}: {error}");
        }
        let error = Rules::parse("rules:\n  - principals: {subjects: [a]}\n").unwrap_err();
        assert!(error.contains("grants nothing"), "{error}");
    }

    #[test]
    fn string_keys_are_exact_and_binary_keys_are_base64() {
        let rules = rules(
            r#"
rules:
  - principals: {subjects: [a]}
    stateStoreResources:
      - {keyType: String, keys: ["config/*"], method: Write}
      - {keyType: Binary, keys: ["AP8="], method: ReadWrite}
"#,
        );
        let a = &subject("a");
        // A String key is the key itself, never a glob.
        assert!(rules.allows(a, b"config/*", Need::Write));
        assert!(!rules.allows(a, b"config/x", Need::Write));
        assert!(!rules.allows(a, b"config/*", Need::Read));
        assert!(rules.allows(a, &[0x00, 0xff], Need::Read));
        assert!(rules.allows(a, &[0x00, 0xff], Need::Write));
        assert!(!rules.allows(a, &[0x00], Need::Read));
        assert!(!rules.allows(a, b"AP8=", Need::Read));
    }

    #[test]
    fn star_is_every_caller_and_merges_with_their_own_rules() {
        let rules = rules(
            r#"
rules:
  - principals: {subjects: ["*"]}
    stateStoreResources:
      - {keyType: Pattern, keys: ["public/*"], method: Read}
  - principals: {subjects: [writer]}
    stateStoreResources:
      - {keyType: Pattern, keys: ["public/*"], method: Write}
"#,
        );
        let writer = subject("writer");
        let stranger = subject("stranger");
        for caller in [&writer, &stranger, &Principal::ApiToken] {
            assert!(rules.allows(caller, b"public/x", Need::Read), "{caller:?}");
        }
        assert!(rules.allows(&writer, b"public/x", Need::Write));
        assert!(!rules.allows(&stranger, b"public/x", Need::Write));
        assert!(!rules.allows(&Principal::ApiToken, b"public/x", Need::Write));
        assert!(!rules.allows(&Principal::Nobody, b"public/x", Need::Read));
    }

    #[test]
    fn the_api_token_caller_is_named_by_api_token_only() {
        let rules = rules(
            r#"
rules:
  - principals: {apiToken: true}
    stateStoreResources:
      - {keyType: Pattern, keys: ["*"], method: ReadWrite}
"#,
        );
        assert!(rules.allows(&Principal::ApiToken, b"any", Need::Write));
        assert!(rules.allows(&Principal::ApiToken, b"any", Need::Read));
        // No subject can claim it, not even one spelled like it.
        for name in ["apiToken", "api-token", "*"] {
            assert!(!rules.allows(&subject(name), b"any", Need::Read), "{name}");
        }
    }

    #[test]
    fn no_grant_matches_the_gateways_own_records() {
        use crate::store::reserved::{INTENT_PREFIX, LEASE_PREFIX};
        let rules = rules(
            r#"
rules:
  - principals: {apiToken: true}
    stateStoreResources:
      - {keyType: Pattern, keys: ["*", "*/orders/*"], method: ReadWrite}
      - {keyType: String, keys: ["dapr-txn||x"], method: ReadWrite}
"#,
        );
        let caller = &Principal::ApiToken;
        for key in [&b"dapr-txn||x"[..], b"dapr-etag-lease||t1/orders/1"] {
            for need in [Need::Read, Need::Write] {
                assert!(!rules.allows(caller, key, need), "{key:?} {need:?}");
            }
        }
        assert!(rules.allows(caller, b"t1/orders/1", Need::Write));

        // Without rules too, and through every check of a request.
        let open = Access::default();
        assert!(open.allows(b"x", Need::Write));
        assert!(!open.allows(b"dapr-txn||x", Need::Read));
        assert!(!open.allows_now(b"dapr-etag-lease||x", Need::Write));
        assert_eq!(open.require(b"x", Need::Write), Ok(()));
        assert_eq!(
            open.require(b"dapr-txn||x", Need::Write),
            Err(Denied::Reserved {
                prefix: INTENT_PREFIX,
                need: "Write"
            })
        );
        assert_eq!(
            open.require(b"dapr-etag-lease||x", Need::Read),
            Err(Denied::Reserved {
                prefix: LEASE_PREFIX,
                need: "Read"
            })
        );
        let page = [Bytes::from_static(b"x"), Bytes::from_static(b"dapr-txn||x")];
        assert!(open.reads_all(&page[..1]));
        assert!(!open.reads_all(&page));
    }

    #[test]
    fn no_rules_deny_everything() {
        let rules = rules("rules: []\n");
        assert!(rules.is_empty());
        assert!(!rules.allows(&Principal::ApiToken, b"k", Need::Read));
        assert!(!rules.allows(&subject("a"), b"k", Need::Read));
    }

    #[test]
    fn mistakes_are_refused_with_their_line_and_column() {
        let resource = |body: &str| {
            format!(
                "rules:\n  - principals:\n      subjects: [a]\n    stateStoreResources:\n{body}"
            )
        };
        for (text, says) in [
            (
                resource("      - {keyType: Patern, keys: [x], method: Read}\n"),
                "line 5 column 19: unknown variant `Patern`",
            ),
            (
                resource("      - {keyType: Pattern, keys: [x], method: Reed}\n"),
                "unknown variant `Reed`",
            ),
            (
                resource("      - {keyType: Pattern, keys: [x], method: Read, extra: 1}\n"),
                "unknown field `extra`",
            ),
            (
                resource("      - {keyType: Binary, keys: [\"not base64!\"], method: Read}\n"),
                "is not base64",
            ),
            (
                resource("      - {keyType: String, keys: [\"\"], method: Read}\n"),
                "a key is empty",
            ),
            (
                resource("      - {keyType: String, keys: [], method: Read}\n"),
                "keys is empty",
            ),
            (
                resource(
                    "      - {keyType: Pattern, keys: [\"c/{principal.clientId}/*\"], method: Read}\n",
                ),
                "variables are not supported",
            ),
            (
                resource("      - {keyType: Pattern, method: Read}\n"),
                "missing field `keys`",
            ),
            (
                "rules:\n  - principals:\n      clientIds: [a]\n    stateStoreResources: []\n"
                    .into(),
                "line 3 column 7: unknown field `clientIds`",
            ),
            (
                "rules:\n  - principals: {}\n    stateStoreResources: []\n".into(),
                "principals names nobody",
            ),
            (
                "rules:\n  - principals: {subjects: [\"\"]}\n    stateStoreResources: []\n".into(),
                "a subject is empty",
            ),
            ("rule: []\n".into(), "unknown field `rule`"),
            ("rules: [\n".into(), "line 1"),
            ("".into(), "end of input"),
        ] {
            let error = Rules::parse(&text).expect_err(&text);
            assert!(
                error.contains(says),
                "{error:?} should say {says:?}\n{text}"
            );
            assert!(!error.contains('\n'), "one line: {error:?}");
        }
    }

    async fn settled(expect: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !expect() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not applied in time"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_changed_file_is_applied_and_a_bad_one_keeps_the_previous_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let allowing = |key: &str| {
            format!(
                "rules:\n  - principals: {{subjects: [a]}}\n    stateStoreResources:\n      - {{keyType: String, keys: [{key}], method: Read}}\n"
            )
        };
        std::fs::write(&path, allowing("one")).unwrap();
        let metrics = Metrics::new();
        let authz = Authz::load(
            path.clone(),
            Some(Duration::from_millis(20)),
            metrics.clone(),
        )
        .unwrap();
        let a = subject("a");
        let reads = |key: &[u8]| authz.rules().allows(&a, key, Need::Read);
        assert!(reads(b"one"));
        std::fs::write(&path, allowing("two")).unwrap();
        settled(|| reads(b"two") && !reads(b"one")).await;
        assert_eq!(metrics.authz_reload_ok.get(), 1);

        std::fs::write(&path, "rules: [oops\n").unwrap();
        settled(|| metrics.authz_reload_failures.get() == 1).await;
        assert_eq!(metrics.authz_reload_ok.get(), 0);
        assert!(reads(b"two"), "the previous rules stay");

        std::fs::remove_file(&path).unwrap();
        settled(|| metrics.authz_reload_failures.get() == 2).await;
        assert!(reads(b"two"), "the previous rules stay");

        std::fs::write(&path, allowing("three")).unwrap();
        settled(|| reads(b"three")).await;
        assert_eq!(metrics.authz_reload_ok.get(), 1);
    }

    #[test]
    fn a_bad_file_at_start_is_a_bad_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, "rules:\n  - nope\n").unwrap();
        let error = Authz::load(path.clone(), None, Metrics::new()).unwrap_err();
        assert_eq!(error.setting, "--authz-file");
        assert!(error.message.contains("rules.yaml"), "{error}");
        let error = Authz::load(dir.path().join("missing"), None, Metrics::new()).unwrap_err();
        assert!(error.message.contains("cannot read"), "{error}");
    }
}
