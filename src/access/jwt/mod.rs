//! Callers identified by signed tokens (JWTs): the key set they are
//! checked against (a JWKS file read again when it changes, or a JWKS URL
//! fetched periodically and on an unknown `kid`), the checks, and the
//! cache of tokens already verified.
//!
//! Only asymmetric signatures pass (RS, PS, ES, EdDSA): `none` and HMAC
//! never do, whatever the key set holds. A token must carry the
//! configured `iss` and `aud`, a `sub` (the caller) and an `exp`; `exp`
//! and `nbf` get [`JWT_LEEWAY`](crate::settings::JWT_LEEWAY) of clock
//! skew. The signature checks are `jsonwebtoken`'s.

mod cache;
mod error;
mod fetch;
mod keys;
mod settings;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Validation, decode, decode_header};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::files::reloading::{FileError, Reload, ReloadingFile};
use crate::metrics::Metrics;
use crate::settings::{self as table, SettingError};
use cache::TokenCache;
use keys::KeySet;

pub use error::{JwksError, TokenError};
pub use settings::{JwksUrl, JwtSettings, KeySource};

/// Verified tokens kept (each a digest, a subject and an expiry).
pub const CACHED_TOKENS: usize = 4096;

/// How long one fetch of a JWKS URL may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// After a failed fetch, the next try comes this much later.
const FETCH_RETRY: Duration = Duration::from_secs(5);

/// The claims the gateway reads (the crate checks `iss`, `aud`, `nbf`,
/// and that these are present: optional here so that a missing one is
/// the crate's `MissingRequiredClaim`, not a parse error).
#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    /// A NumericDate may have a fraction.
    exp: Option<f64>,
}

/// Checks tokens against the current key set, and keeps that set fresh
/// in a background task (which ends when the last handle is dropped).
/// Cheap to clone.
#[derive(Clone)]
pub struct Verifier(Arc<Inner>);

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &*self.0.current())
            .field("source", &self.0.settings.keys)
            .finish()
    }
}

struct Inner {
    settings: JwtSettings,
    /// The checks every key's own copy starts from.
    validation: Validation,
    keys: Keys,
    cache: Mutex<TokenCache>,
    /// When unknown key ids last caused a fetch; held during any fetch,
    /// so that concurrent ones wait for it instead of fetching again.
    refetch: tokio::sync::Mutex<Option<Instant>>,
    metrics: Metrics,
}

/// The key set in force, by where it comes from.
enum Keys {
    /// A JWKS file, read again when it changes.
    File(ReloadingFile<JwksFile>),
    /// A JWKS URL, fetched periodically and for an unknown key id.
    Url {
        current: RwLock<Arc<KeySet>>,
        generation: AtomicU64,
        fetcher: fetch::Fetcher,
    },
}

/// How a JWKS file parses (each load a new generation of keys) and what
/// its loads record.
#[derive(Debug)]
struct JwksFile {
    validation: Validation,
    generation: AtomicU64,
    metrics: Metrics,
}

impl Reload for JwksFile {
    type Value = KeySet;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<KeySet, FileError> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        KeySet::parse(&contents[0], generation, &self.validation)
            .map_err(|error| error.to_string().into())
    }

    fn installed(&self, _paths: &[PathBuf], keys: &KeySet, first: bool) {
        if !first {
            self.metrics
                .jwks_updates
                .with_label_values(&["changed"])
                .inc();
        }
        tracing::info!(keys = keys.len(), "JWT key set loaded");
    }

    fn kept(&self, _paths: &[PathBuf], error: &str) {
        self.metrics
            .jwks_updates
            .with_label_values(&["failed"])
            .inc();
        tracing::warn!(%error, "JWT key set file not loaded; the previous keys stay");
    }
}

impl Verifier {
    /// Loads the key set (a file at once, an error if it is unusable; a
    /// URL in the background) and starts keeping it fresh. Must run
    /// inside a Tokio runtime.
    pub fn start(settings: JwtSettings, metrics: Metrics) -> Result<Self, SettingError> {
        let mut validation = Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.algorithms = keys::ACCEPTED.to_vec();
        validation.leeway = settings.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.audience]);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        let keys = match &settings.keys {
            KeySource::File(path) => {
                let file = JwksFile {
                    validation: validation.clone(),
                    generation: AtomicU64::new(0),
                    metrics: metrics.clone(),
                };
                let interval = Some(settings.file_check_interval);
                Keys::File(
                    ReloadingFile::load(vec![path.clone()], file, interval)
                        .map_err(|error| SettingError::new(&table::JWT_JWKS_FILE, error.message))?,
                )
            }
            KeySource::Url(url) => Keys::Url {
                current: RwLock::new(Arc::new(KeySet::empty())),
                generation: AtomicU64::new(0),
                fetcher: fetch::Fetcher::new(url)?,
            },
        };
        let fetching = matches!(keys, Keys::Url { .. });
        let inner = Arc::new(Inner {
            keys,
            cache: Mutex::new(TokenCache::new(CACHED_TOKENS)),
            refetch: tokio::sync::Mutex::new(None),
            validation,
            settings,
            metrics,
        });
        if fetching {
            tokio::spawn(keep_fetched(Arc::downgrade(&inner)));
        }
        Ok(Self(inner))
    }

    /// The token's subject if it passes every check; a token seen before
    /// is answered from the cache until it expires.
    pub async fn verify(&self, token: &str) -> Result<Arc<str>, TokenError> {
        let inner = &self.0;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = unix_now();
        let mut keys = inner.current();
        if let Some(subject) = inner.cache().get(&digest, now, keys.generation) {
            return Ok(subject);
        }
        let header = decode_header(token).map_err(|_| header_error(token))?;
        if !keys::ACCEPTED.contains(&header.alg) {
            return Err(TokenError::Algorithm);
        }
        let kid = header.kid.as_deref();
        if keys.find(kid).is_none() {
            keys = inner.refetch_for(&keys).await;
        }
        let key = keys.find(kid).ok_or(TokenError::UnknownKey)?;
        // An algorithm the key does not allow is `InvalidAlgorithm`.
        let claims = decode::<Claims>(token, &key.decoding, &key.validation)
            .map_err(|error| TokenError::from_kind(error.kind()))?
            .claims;
        let (Some(subject), Some(exp)) = (claims.sub.filter(|sub| !sub.is_empty()), claims.exp)
        else {
            return Err(TokenError::Claims);
        };
        let subject: Arc<str> = subject.into();
        // Saturating: a huge `exp` is far future, a negative one past.
        let valid_until = (exp as u64).saturating_add(inner.settings.leeway.as_secs());
        inner
            .cache()
            .insert(digest, subject.clone(), valid_until, keys.generation, now);
        Ok(subject)
    }
}

impl Inner {
    fn current(&self) -> Arc<KeySet> {
        match &self.keys {
            Keys::File(file) => file.current(),
            Keys::Url { current, .. } => current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs a fetched document's keys unless it is the one in use; a
    /// new set is a new generation, which empties the token cache (tokens
    /// of a removed key stop passing).
    fn install(&self, document: &[u8]) -> Result<bool, JwksError> {
        let Keys::Url {
            current,
            generation,
            ..
        } = &self.keys
        else {
            return Ok(false);
        };
        let fingerprint: [u8; 32] = Sha256::digest(document).into();
        if self.current().fingerprint == fingerprint {
            return Ok(false);
        }
        let generation = generation.fetch_add(1, Ordering::Relaxed) + 1;
        let keys = KeySet::parse(document, generation, &self.validation)?;
        let count = keys.len();
        *current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(keys);
        self.metrics
            .jwks_updates
            .with_label_values(&["changed"])
            .inc();
        tracing::info!(keys = count, "JWT key set loaded");
        Ok(true)
    }

    /// The key set after a fetch of the URL for a token naming a key not
    /// in `seen`, if none happened lately; else the current set.
    async fn refetch_for(&self, seen: &Arc<KeySet>) -> Arc<KeySet> {
        let Keys::Url { fetcher, .. } = &self.keys else {
            return seen.clone();
        };
        let mut last = self.refetch.lock().await;
        let current = self.current();
        // Another request's fetch (or the periodic one) got here first.
        if current.generation != seen.generation {
            return current;
        }
        if last.is_some_and(|at| at.elapsed() < self.settings.min_refetch_interval) {
            return current;
        }
        *last = Some(Instant::now());
        if let Err(error) = self.fetch_and_install(fetcher).await {
            tracing::warn!(%error, "JWT key set fetch for an unknown key id failed");
        }
        self.current()
    }

    async fn fetch_and_install(&self, fetcher: &fetch::Fetcher) -> Result<bool, JwksError> {
        let outcome = match fetch::fetch(fetcher, FETCH_TIMEOUT).await {
            Ok(document) => self.install(&document),
            Err(error) => Err(error),
        };
        if outcome.is_err() {
            self.metrics
                .jwks_updates
                .with_label_values(&["failed"])
                .inc();
        }
        outcome
    }
}

/// Keeps a URL's key set fresh until the verifier is dropped: fetched at
/// once, then every refresh interval (sooner again after a failure).
async fn keep_fetched(inner: Weak<Inner>) {
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let Keys::Url { fetcher, .. } = &inner.keys else {
                return;
            };
            let _fetching = inner.refetch.lock().await;
            match inner.fetch_and_install(fetcher).await {
                Ok(_) => inner.settings.refresh_interval,
                Err(error) => {
                    tracing::warn!(%error, "JWT key set not refreshed; the previous keys stay");
                    FETCH_RETRY.min(inner.settings.refresh_interval)
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Why a header did not decode: an `alg` the crate does not know
/// (`none`, or anything else) is the algorithm's fault, anything else the
/// token's shape.
fn header_error(token: &str) -> TokenError {
    use base64::Engine as _;
    let names_an_alg = token
        .split('.')
        .next()
        .and_then(|part| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part.trim_end_matches('='))
                .ok()
        })
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
        .is_some_and(|header| header.get("alg").is_some_and(serde_json::Value::is_string));
    if names_an_alg {
        TokenError::Algorithm
    } else {
        TokenError::Malformed
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_alg_is_the_algorithms_fault_and_garbage_is_malformed() {
        // {"alg":"none","typ":"JWT"}
        assert_eq!(
            header_error("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.e30."),
            TokenError::Algorithm
        );
        assert_eq!(header_error("not a token"), TokenError::Malformed);
        assert_eq!(header_error("a.b.c"), TokenError::Malformed);
    }
}
