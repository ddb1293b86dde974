//! Why a key set did not load, and why a token was refused.

use jsonwebtoken::errors::ErrorKind;
use thiserror::Error;

/// Why a key set could not be loaded (the previous one stays).
#[derive(Debug, Clone, Error)]
pub enum JwksError {
    /// The document is not a JWKS or has no usable key.
    #[error("{0}")]
    Invalid(String),
    /// The URL could not be fetched.
    #[error("cannot fetch {url}: {message}")]
    Fetch {
        /// The URL.
        url: String,
        /// Why.
        message: String,
    },
}

/// Why a token was refused: the `error_description` of the 401 and, by
/// [`reason`](Self::reason), the label of the failure metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header and claims.
    #[error("the token is not a well-formed JWT")]
    Malformed,
    /// `none`, HMAC, or an algorithm the token's key does not allow.
    #[error("the token's algorithm is not accepted (only RS, PS, ES and EdDSA signatures are)")]
    Algorithm,
    /// Its `kid` is not in the key set (or it has none and the set has
    /// more than one key).
    #[error("the token's signing key is not in the key set")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still ahead.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("the token's issuer is not accepted")]
    Issuer,
    /// `aud` does not hold the configured audience.
    #[error("the token's audience does not include this gateway")]
    Audience,
    /// `sub`, `exp`, `iss` or `aud` is missing or malformed.
    #[error("the token lacks a required claim (sub, exp, iss, aud) or has a malformed one")]
    Claims,
}

impl TokenError {
    /// A short label (metrics, logs).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Algorithm => "algorithm",
            Self::UnknownKey => "unknown_key",
            Self::Signature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Issuer => "issuer",
            Self::Audience => "audience",
            Self::Claims => "claims",
        }
    }

    pub(super) fn from_kind(kind: &ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidSignature => Self::Signature,
            ErrorKind::ExpiredSignature => Self::Expired,
            ErrorKind::ImmatureSignature => Self::NotYetValid,
            ErrorKind::InvalidIssuer => Self::Issuer,
            ErrorKind::InvalidAudience => Self::Audience,
            ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => Self::Claims,
            ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm => Self::Algorithm,
            // A key the crypto library cannot use (an RSA key under 2048
            // bits) verifies nothing.
            ErrorKind::InvalidRsaKey(_)
            | ErrorKind::InvalidEcdsaKey
            | ErrorKind::InvalidEddsaKey
            | ErrorKind::InvalidKeyFormat => Self::Signature,
            _ => Self::Malformed,
        }
    }
}
