//! The Dapr API's settings (a leaf: the operations and the conditional
//! writes both read them).

use std::time::Duration;

use crate::settings;

/// How state keys are named in the store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeyPrefix {
    /// Keys as given, shared with `/keys`, watches and the SDKs.
    #[default]
    None,
    /// `<app-id>||<key>`: Dapr's default, so the gateway reads and writes
    /// the data an app wrote through Dapr and the AIO state component.
    AppId,
}

/// The Dapr API's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaprSettings {
    /// The state store's name (`/v1.0/state/{store}`).
    pub state_store: String,
    /// The lock store's name (`/v1.0-alpha1/lock/{lockstore}`).
    pub lock_store: String,
    /// The app id the metadata names (and the key prefix uses).
    pub app_id: String,
    /// How state keys are named in the store.
    pub key_prefix: KeyPrefix,
    /// How long a conditional write's per-key lease lasts: a gateway that
    /// dies holding one delays other etag writes of that key this long.
    pub etag_lease: Duration,
    /// Transactions: on, the state store is `TRANSACTIONAL`, every Dapr
    /// write takes its key's lease and every read checks it first.
    pub transactions: bool,
    /// How long an etag write waits for another's lease before failing.
    pub lease_wait: Duration,
}

impl Default for DaprSettings {
    fn default() -> Self {
        Self {
            state_store: settings::DAPR_STATE_STORE.default.to_owned(),
            lock_store: settings::DAPR_LOCK_STORE.default.to_owned(),
            app_id: settings::DAPR_APP_ID.default.to_owned(),
            key_prefix: KeyPrefix::None,
            etag_lease: settings::DEFAULT_DAPR_ETAG_LEASE,
            transactions: false,
            lease_wait: settings::DEFAULT_REQUEST_TIMEOUT,
        }
    }
}
