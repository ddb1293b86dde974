//! What a JWT must satisfy and where the keys come from.

use std::path::PathBuf;
use std::time::Duration;

use hyper::Uri;

use crate::settings as table;

/// Where the public keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A JWKS file, read again when it changes.
    File(PathBuf),
    /// A JWKS URL, fetched periodically and when a token names an unknown key.
    Url(JwksUrl),
}

/// A JWKS URL and how to fetch it (the files are read when the verifier
/// starts, not here).
#[derive(Debug, Clone)]
pub struct JwksUrl {
    /// `http://` or `https://`.
    pub uri: Uri,
    /// For `https`: a PEM bundle of the roots its certificate must chain
    /// to; without one, the system's.
    pub ca_file: Option<PathBuf>,
    /// A file holding a bearer token for the request, read at each fetch.
    pub token_file: Option<PathBuf>,
}

/// What a token must satisfy, and where its keys come from.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The key set.
    pub keys: KeySource,
    /// The `iss` a token must carry.
    pub issuer: String,
    /// A value its `aud` must hold.
    pub audience: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// How often a JWKS file is read again.
    pub file_check_interval: Duration,
    /// How often a JWKS URL is fetched again.
    pub refresh_interval: Duration,
    /// The least time between two fetches caused by unknown key ids.
    pub min_refetch_interval: Duration,
}

impl JwtSettings {
    /// Settings with the defaults for everything but the essentials.
    pub fn new(keys: KeySource, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            keys,
            issuer: issuer.into(),
            audience: audience.into(),
            leeway: table::JWT_LEEWAY,
            file_check_interval: table::DEFAULT_JWKS_FILE_CHECK_INTERVAL,
            refresh_interval: table::DEFAULT_JWKS_REFRESH_INTERVAL,
            min_refetch_interval: table::DEFAULT_JWKS_MIN_REFETCH_INTERVAL,
        }
    }
}
