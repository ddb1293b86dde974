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

/// How lock resources are named in the store, as Dapr's lock component
/// names them by its `keyPrefix` (`lock||<prefix>||<resource>`): apart
/// from every state key, whatever the state keys' prefix.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LockKeyPrefix {
    /// `lock||<app-id>||<resource>`: Dapr's default (`appid`).
    #[default]
    AppId,
    /// `lock||<lock store name>||<resource>` (`name`).
    StoreName,
    /// `lock||<resource>` (`none`).
    None,
    /// `lock||<prefix>||<resource>`: any other value, lower-cased as Dapr
    /// lower-cases it.
    Custom(String),
}

/// What separates a key prefix from the key (`<app-id>||<key>`): Dapr
/// refuses keys and lock resources that hold it.
pub const SEPARATOR: &str = "||";

/// What every lock key starts with, as in Dapr.
pub const LOCK_KEY_PREFIX: &str = "lock||";

impl LockKeyPrefix {
    /// Dapr's lock `keyPrefix` values, read as Dapr reads them (whatever
    /// their case): `appid` (`app-id` too, as `--dapr-key-prefix` spells
    /// it), `name`, `none`, or a custom prefix without `||`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.to_lowercase();
        match text.as_str() {
            "appid" | "app-id" => Ok(Self::AppId),
            "name" => Ok(Self::StoreName),
            "none" => Ok(Self::None),
            "" => Err("expected appid, name, none or a prefix".to_owned()),
            custom if custom.contains(SEPARATOR) => Err(format!(
                "input key/keyPrefix '{custom}' can't contain '{SEPARATOR}'"
            )),
            custom => Ok(Self::Custom(custom.to_owned())),
        }
    }
}

/// How the gateway calls the app (daprd's `--app-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AppProtocol {
    /// JSON over HTTP/1.1.
    #[default]
    Http,
    /// Dapr's `AppCallback` gRPC service over HTTP/2 without TLS (h2c).
    Grpc,
}

impl AppProtocol {
    /// `http` or `grpc`, as daprd's `--app-protocol` spells them.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "http" => Ok(Self::Http),
            "grpc" => Ok(Self::Grpc),
            _ => Err("expected `http` or `grpc`".to_owned()),
        }
    }

    /// The protocol as daprd's metadata names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
        }
    }
}

/// The app the gateway calls (daprd's `--app-port` and `--app-protocol`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSettings {
    /// The app's port on 127.0.0.1.
    pub port: u16,
    /// How the gateway calls it.
    pub protocol: AppProtocol,
    /// How long one call to the app may take, connecting included.
    pub call_timeout: Duration,
}

impl AppSettings {
    /// The app on `port`, called over `protocol`, with the default call
    /// timeout.
    pub fn new(port: u16, protocol: AppProtocol) -> Self {
        Self {
            port,
            protocol,
            call_timeout: DEFAULT_APP_CALL_TIMEOUT,
        }
    }
}

/// How long one call to the app may take: daprd sets none by default (its
/// resiliency policies can), the gateway bounds every call; an event whose
/// delivery times out is retried.
pub const DEFAULT_APP_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The state store's outbox (daprd's `outboxPublishPubsub` and
/// `outboxPublishTopic` metadata): a committed transaction's upserts are
/// published as events on `topic` through `pubsub`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSettings {
    /// The pub/sub component the events go out through (one of
    /// `--dapr-pubsub`).
    pub pubsub: String,
    /// The topic they go out on.
    pub topic: String,
}

/// The Dapr API's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaprSettings {
    /// The state store's name (`/v1.0/state/{store}`).
    pub state_store: String,
    /// The lock store's name (`/v1.0-alpha1/lock/{lockstore}`).
    pub lock_store: String,
    /// The pub/sub component names (`/v1.0/publish/{pubsub}/...`): every
    /// one publishes to the broker.
    pub pubsubs: Vec<String>,
    /// The app id the metadata names (and the key prefix uses).
    pub app_id: String,
    /// How state keys are named in the store.
    pub key_prefix: KeyPrefix,
    /// How lock resources are named in the store.
    pub lock_key_prefix: LockKeyPrefix,
    /// The configuration store's name (`/v1.0/configuration/{store}`).
    pub configuration_store: String,
    /// What the store keys of configuration items start with.
    pub configuration_key_prefix: String,
    /// How long a conditional write's per-key lease lasts: a gateway that
    /// dies holding one delays other etag writes of that key this long.
    pub etag_lease: Duration,
    /// Transactions: on, the state store is `TRANSACTIONAL`, every Dapr
    /// write takes its key's lease and every read checks it first.
    pub transactions: bool,
    /// How long an etag write waits for another's lease before failing.
    pub lease_wait: Duration,
    /// The app the gateway delivers to (`--dapr-app-port`); none: no app.
    pub app: Option<AppSettings>,
    /// Declarative subscriptions (`--dapr-subscriptions`): a file or a
    /// directory of Dapr `Subscription` resources.
    pub subscriptions: Option<std::path::PathBuf>,
    /// The state store's outbox; none: transactions publish nothing.
    pub outbox: Option<OutboxSettings>,
}

impl Default for DaprSettings {
    fn default() -> Self {
        Self {
            state_store: settings::DAPR_STATE_STORE.default.to_owned(),
            lock_store: settings::DAPR_LOCK_STORE.default.to_owned(),
            pubsubs: vec![settings::DAPR_PUBSUB.default.to_owned()],
            app_id: settings::DAPR_APP_ID.default.to_owned(),
            key_prefix: KeyPrefix::None,
            lock_key_prefix: LockKeyPrefix::AppId,
            configuration_store: settings::DAPR_CONFIGURATION_STORE.default.to_owned(),
            configuration_key_prefix: settings::DAPR_CONFIGURATION_KEY_PREFIX.default.to_owned(),
            etag_lease: settings::DEFAULT_DAPR_ETAG_LEASE,
            transactions: false,
            lease_wait: settings::DEFAULT_REQUEST_TIMEOUT,
            app: None,
            subscriptions: None,
            outbox: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_key_prefixes_are_read_as_dapr_reads_them() {
        assert_eq!(LockKeyPrefix::parse("appid"), Ok(LockKeyPrefix::AppId));
        assert_eq!(LockKeyPrefix::parse("AppId"), Ok(LockKeyPrefix::AppId));
        assert_eq!(LockKeyPrefix::parse("app-id"), Ok(LockKeyPrefix::AppId));
        assert_eq!(LockKeyPrefix::parse("name"), Ok(LockKeyPrefix::StoreName));
        assert_eq!(LockKeyPrefix::parse("NONE"), Ok(LockKeyPrefix::None));
        assert_eq!(
            LockKeyPrefix::parse("Orders"),
            Ok(LockKeyPrefix::Custom("orders".into()))
        );
        // Dapr has no `namespace` strategy for locks: a custom prefix.
        assert_eq!(
            LockKeyPrefix::parse("namespace"),
            Ok(LockKeyPrefix::Custom("namespace".into()))
        );
        assert!(LockKeyPrefix::parse("").is_err());
        assert_eq!(
            LockKeyPrefix::parse("a||b"),
            Err("input key/keyPrefix 'a||b' can't contain '||'".to_owned())
        );
        assert_eq!(
            LockKeyPrefix::parse(settings::DAPR_LOCK_KEY_PREFIX.default),
            Ok(LockKeyPrefix::default())
        );
    }
}
