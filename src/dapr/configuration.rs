//! Dapr's configuration API over the store's keys and the watch hub: an
//! item is a key (`--dapr-configuration-key-prefix` then its name), its
//! value the key's bytes as they are (read as UTF-8 text, since Dapr's
//! items are strings), its version the store's version of the key (the
//! HLC, as etags are).
//!
//! - A get names keys (an absent one is left out, as Dapr's stores leave
//!   it out) or none: every key under the prefix, read from SCAN pages,
//!   at most [`MAX_ITEMS`] (more fails and says so).
//! - A subscription follows the keys through the watch hub: one store
//!   registration per key whatever the number of subscribers, and after
//!   an outage the hub's resync tells which keys moved. A subscription of
//!   no keys follows the prefix as a pattern (its keys, and those created
//!   later). Each change is one update of one item; a delete is the item
//!   with an empty value, as Dapr's Redis store tells it.
//! - Subscriptions have ids, so that an unsubscribe (over either
//!   protocol) ends the one it names.
//! - An HTTP subscription's changes go to the app, as daprd sends them:
//!   `POST /configuration/{store}/{key}` on the app channel with
//!   `{"id", "items"}`, once per key changed; a delivery the app fails is
//!   logged and not retried (daprd's without a resiliency policy).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt as _};
use tokio::sync::watch;

use super::app::AppChannel;
use super::config_subscriptions::Subscriptions;
use super::{DaprError, DaprStore};
use crate::protocol::glob;
use crate::store::reserved::is_reserved;
use crate::watch::{EventKind, KeyEvent, ReadFilter, Selection, WatchHub, Watcher};

/// The most items a get of every key answers.
pub const MAX_ITEMS: usize = 1_000;

/// Reads a get keeps in flight.
const CONCURRENT_READS: usize = 16;

/// One configuration item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigurationItem {
    /// The key's value as text (empty for a deleted key).
    pub value: String,
    /// The store's version of the key (of its delete, for a deleted key).
    pub version: String,
}

/// Items by name.
pub type Items = BTreeMap<String, ConfigurationItem>;

/// Items as Dapr's JSON writes them (`configuration.Item`): by name,
/// `value` and `version`, each left out when empty.
pub fn items_json(items: &Items) -> serde_json::Value {
    items
        .iter()
        .map(|(name, item)| {
            let mut json = serde_json::Map::new();
            if !item.value.is_empty() {
                json.insert("value".into(), item.value.clone().into());
            }
            if !item.version.is_empty() {
                json.insert("version".into(), item.version.clone().into());
            }
            (name.clone(), serde_json::Value::Object(json))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A path segment as it goes into the app's URL: what is not unreserved
/// is percent-encoded.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One subscription: its id and the changes of its keys. Dropping it ends
/// it (its keys' registrations go with their last watcher).
pub struct Subscription {
    /// The id an unsubscribe names.
    pub id: String,
    watcher: Watcher,
    stopped: watch::Receiver<bool>,
    registry: Arc<Subscriptions>,
    prefix: Bytes,
    store: DaprStore,
    readable: Option<ReadFilter>,
    /// Whether it follows the prefix as a pattern (no keys named).
    pattern: bool,
    /// The pattern's first listing is done: a key first told of after it
    /// is a new key, a change.
    listed: bool,
    /// Keys whose first state was told (the state when it began).
    known: HashSet<Bytes>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.registry.close(&self.id);
    }
}

impl DaprStore {
    /// The store key of configuration item `name`.
    pub fn configuration_key(&self, name: &str) -> Bytes {
        let mut key = self.settings.configuration_key_prefix.as_bytes().to_vec();
        key.extend_from_slice(name.as_bytes());
        Bytes::from(key)
    }

    /// The item name of `store_key`, when it is an item this API names: it
    /// has the prefix, the rest is text, and it is none of the gateway's
    /// own records.
    fn configuration_name(&self, store_key: &[u8]) -> Option<String> {
        if is_reserved(store_key) {
            return None;
        }
        let name = store_key.strip_prefix(self.settings.configuration_key_prefix.as_bytes())?;
        std::str::from_utf8(name)
            .ok()
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
    }

    /// The items `names` (an absent key is left out), or with no names
    /// every item under the prefix that `readable` allows (at most
    /// [`MAX_ITEMS`]). The caller checks the rules of the names it gives.
    pub async fn get_configuration(
        &self,
        names: Vec<String>,
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
    ) -> Result<Items, DaprError> {
        let names = if names.is_empty() {
            self.configuration_names(readable).await?
        } else {
            names
        };
        let reads: Vec<_> = stream::iter(names)
            .map(|name| async move {
                let read = self.store.get(self.configuration_key(&name)).await;
                (name, read)
            })
            .buffered(CONCURRENT_READS)
            .collect()
            .await;
        let mut items = Items::new();
        for (name, read) in reads {
            if let Some(versioned) = read? {
                let item = ConfigurationItem {
                    value: String::from_utf8_lossy(&versioned.value).into_owned(),
                    version: versioned
                        .version
                        .map(|version| version.encode())
                        .unwrap_or_default(),
                };
                items.insert(name, item);
            }
        }
        Ok(items)
    }

    /// Every item name under the prefix that `readable` allows, from the
    /// store's SCAN pages.
    async fn configuration_names(
        &self,
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
    ) -> Result<Vec<String>, DaprError> {
        let pattern = Bytes::from(glob::prefix_pattern(
            self.settings.configuration_key_prefix.as_bytes(),
        ));
        let mut names = Vec::new();
        let mut token = None;
        loop {
            let page = self.store.scan(pattern.clone(), token).await?;
            for key in &page.keys {
                if !readable(key) {
                    continue;
                }
                if let Some(name) = self.configuration_name(key) {
                    if names.len() == MAX_ITEMS {
                        return Err(DaprError::TooManyItems(MAX_ITEMS));
                    }
                    names.push(name);
                }
            }
            match page.token {
                Some(next) => token = Some(next),
                None => return Ok(names),
            }
        }
    }

    /// Subscribes to the items `names` (none: every item under the
    /// prefix, as a pattern that `readable` filters) through `hub`;
    /// returns once every key is followed. The caller checks the rules of
    /// the names it gives; `readable` also filters every change.
    pub async fn subscribe_configuration(
        &self,
        hub: &WatchHub,
        names: &[String],
        readable: Option<ReadFilter>,
    ) -> Result<Subscription, DaprError> {
        let watching = |error: crate::watch::WatchError| DaprError::Subscribe(error.to_string());
        let mut selection = Selection::new(hub.settings().max_keys_per_stream);
        if names.is_empty() {
            let pattern = glob::prefix_pattern(self.settings.configuration_key_prefix.as_bytes());
            selection
                .add_pattern(Bytes::from(pattern))
                .map_err(watching)?;
        } else {
            for name in names {
                selection
                    .add_key(self.configuration_key(name))
                    .map_err(watching)?;
            }
        }
        let watcher = hub
            .follow(selection, None, readable.clone())
            .await
            .map_err(watching)?;
        let (id, stopped) = self.subscriptions.open();
        Ok(Subscription {
            id,
            watcher,
            stopped,
            registry: Arc::clone(&self.subscriptions),
            prefix: Bytes::copy_from_slice(self.settings.configuration_key_prefix.as_bytes()),
            store: self.clone(),
            readable,
            pattern: names.is_empty(),
            listed: false,
            known: HashSet::new(),
        })
    }

    /// Ends the subscription `id` (its stream ends); an unknown id fails.
    pub fn unsubscribe_configuration(&self, id: &str) -> Result<(), DaprError> {
        if self.subscriptions.close(id) {
            Ok(())
        } else {
            Err(DaprError::NoSubscription(id.to_owned()))
        }
    }
}

impl Subscription {
    /// Delivers each change to the app on `app`, as daprd delivers an HTTP
    /// subscription's (see the module's summary), until unsubscribed or
    /// the gateway shuts down.
    pub async fn deliver_to(mut self, app: AppChannel, store: String) {
        while let Some(items) = self.next().await {
            let body = self.update_body(&items);
            for name in items.keys() {
                let path = format!(
                    "/configuration/{}/{}",
                    percent_encoding::utf8_percent_encode(&store, SEGMENT),
                    percent_encoding::utf8_percent_encode(name, SEGMENT)
                );
                let posted = app
                    .post(&path, "application/json", Default::default(), body.clone())
                    .await;
                match posted {
                    Ok(answer) if answer.status.is_success() => {}
                    Ok(answer) => tracing::warn!(
                        subscription = %self.id,
                        %path,
                        status = answer.status.as_u16(),
                        "the app refused a configuration update"
                    ),
                    Err(error) => tracing::warn!(
                        subscription = %self.id,
                        %path,
                        %error,
                        "a configuration update did not reach the app"
                    ),
                }
            }
        }
    }

    /// A change as daprd sends it to the app, over HTTP or gRPC:
    /// `{"id", "items"}` in JSON.
    pub fn update_body(&self, items: &Items) -> Bytes {
        let event = serde_json::json!({ "id": self.id, "items": items_json(items) });
        Bytes::from(event.to_string())
    }

    /// The next change, as the items it changed; `None` once unsubscribed
    /// or when the gateway shuts down.
    pub async fn next(&mut self) -> Option<Items> {
        loop {
            // Stopped first: nothing is told once an unsubscribe answered.
            let event = tokio::select! {
                biased;
                _ = self.stopped.wait_for(|stopped| *stopped) => return None,
                event = self.watcher.next() => event?,
            };
            if let Some(items) = self.change(&event).await {
                return Some(items);
            }
        }
    }

    /// What `event` changed, if anything the app is told of: the states
    /// the subscription began with are not changes, nor a pattern's own
    /// events or the hub's errors (a resync follows them).
    async fn change(&mut self, event: &KeyEvent) -> Option<Items> {
        let first = match event.kind {
            EventKind::Listed { .. } => {
                self.listed = true;
                return None;
            }
            EventKind::PatternError | EventKind::Error => return None,
            EventKind::Sync { resync, lagged } => {
                let first = self.known.insert(event.key.clone());
                first && !resync && !lagged
            }
            EventKind::Set | EventKind::Delete => {
                self.known.insert(event.key.clone());
                false
            }
        };
        // A key a pattern finds after its listing is new: a change.
        if first && !(self.pattern && self.listed) {
            return None;
        }
        if self
            .readable
            .as_ref()
            .is_some_and(|readable| !readable(&event.key))
        {
            return None;
        }
        let name = std::str::from_utf8(event.key.strip_prefix(&self.prefix[..])?).ok()?;
        let version = event
            .version
            .as_ref()
            .map(|version| version.encode())
            .unwrap_or_default();
        let value = match &event.value {
            None => String::new(),
            Some(value) => match value.bytes() {
                Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                // Too large for the hub to keep: read it.
                None => match self.store.store.get(event.key.clone()).await {
                    Ok(Some(read)) => String::from_utf8_lossy(&read.value).into_owned(),
                    Ok(None) | Err(_) => String::new(),
                },
            },
        };
        Some(Items::from([(
            name.to_owned(),
            ConfigurationItem { value, version },
        )]))
    }
}
