//! The watch hub: key changes fanned out to SSE watchers.
//!
//! One KEYNOTIFY registration per key for the whole gateway, on one pool
//! member (the *holder*), shared by every watcher of that key and stopped
//! when the last one leaves. A single reconciler task owns the registrations:
//! it compares the keys that have watchers with the keys registered on the
//! holder and sends KEYNOTIFY / KEYNOTIFY STOP in order, so a watcher that
//! arrives while a STOP is pending cannot be lost. When the holder reconnects
//! (the store drops registrations of a disconnected client) or goes away, the
//! reconciler registers every key again, GETs each and tells watchers whose
//! key moved with a `resync` sync event.
//!
//! Fan-out uses bounded broadcast channels: dispatch never waits on a
//! watcher; a watcher that falls behind skips to the latest state (kept in
//! the key's snapshot) instead of growing memory. Each event carries its
//! number in the key's order, so a stream tells what it already has by one
//! number per key.
//!
//! A stream may also follow patterns (`match=`): the keys matching a glob,
//! each an ordinary hub key the pattern holds a watcher reference on. The
//! events of a pattern's keys go through one channel per pattern, shared by
//! its streams: a stream holds one subscription per pattern, not one per
//! key, and reads each key's initial `sync` from the key's state as it
//! sends it.
//!
//! - `settings`: [`WatchSettings`], the hub's limits.
//! - `error`: [`WatchError`], why a watch could not start.
//! - `event`: [`KeyEvent`] and [`Snapshot`], what watchers are told, and
//!   the ids that never go back.
//! - `key`: one watched key: its snapshot, registration and channels.
//! - `shared`: what the hub's handles, watchers and tasks share.
//! - `selection`: [`Selection`], what one stream follows, within its
//!   limits.
//! - `hub`: [`WatchHub`], which admits streams and ends them at shutdown.
//! - `watcher`: [`Watcher`], one stream's events: a cursor per key it
//!   follows and the events queued to send; [`ReadFilter`], which keys it
//!   may see.
//! - `pattern`: the patterns streams follow: their listing, rescans and
//!   the keys this gateway writes.
//! - `reconciler`: the tasks that route notifications to keys and keep the
//!   store's registrations equal to the watched keys.
//! - `topics`: [`TopicHub`], the MQTT topics streams follow
//!   (`GET /subscribe`): one broker subscription per filter, fanned out.

mod error;
mod event;
mod hub;
mod key;
mod pattern;
mod reconciler;
mod selection;
mod settings;
mod shared;
mod topics;
mod watcher;

pub use error::WatchError;
pub use event::{EventKind, KeyEvent, MAX_EVENT_VALUE_BYTES, Snapshot, WatchedValue};
pub use hub::WatchHub;
pub use selection::Selection;
pub use settings::WatchSettings;
pub use topics::{Followed, TopicFollow, TopicHub};
pub use watcher::{ReadFilter, Watcher};
