//! Who calls: the shared API token or a signed token (JWT), found in a
//! request's headers and checked, making the request's [`Caller`].

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;
use thiserror::Error;

use super::jwt::{TokenError, Verifier};
use super::rules::Authz;

/// The header Dapr's SDKs send the API token in.
pub const DAPR_API_TOKEN: &str = "dapr-api-token";

/// Who a request comes from, as the guard established it (a request
/// extension when the key API requires authentication).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Presented the shared `--api-token-file` token.
    ApiToken,
    /// Presented a valid signed token: its `sub` claim.
    Subject(std::sync::Arc<str>),
}

/// A bearer token the key API requires. Never printed.
#[derive(Clone)]
pub struct ApiToken(Arc<[u8]>);

impl ApiToken {
    /// A token from its bytes (as read from the token file).
    pub fn new(token: impl Into<Arc<[u8]>>) -> Self {
        Self(token.into())
    }

    /// Constant-time comparison, so response timing does not reveal how
    /// much of a guess was right.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_ref().ct_eq(presented).into()
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

/// Who may call the key API and what each caller may do: the shared
/// token, signed tokens and the per-key rules, each optional (none: anyone
/// may do anything).
#[derive(Debug, Clone, Default)]
pub struct CallerChecks {
    /// The shared bearer token (`--api-token-file`).
    pub api_token: Option<ApiToken>,
    /// Checks any other bearer token as a JWT.
    pub jwt: Option<Verifier>,
    /// The per-key rules: without them every caller may do everything.
    pub authz: Option<Authz>,
}

/// Why the key API's guard refused a request's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AuthFailure {
    /// No bearer token (header or, on a watch, `access_token`).
    #[error("a bearer token is required")]
    Missing,
    /// A token that is not the API token, where no JWTs are accepted.
    #[error("the bearer token is not the API token")]
    NotTheApiToken,
    /// A JWT that failed a check.
    #[error("{0}")]
    Token(#[from] TokenError),
}

impl AuthFailure {
    /// A short label (the failure metric).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::NotTheApiToken => "api_token",
            Self::Token(error) => error.reason(),
        }
    }
}

/// The token a request presents in its headers: `Authorization: Bearer`,
/// else Dapr's `dapr-api-token` (its SDKs send it there, HTTP and gRPC).
pub fn presented_token(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| bearer_token(value.as_bytes()))
        .or_else(|| headers.get(DAPR_API_TOKEN).map(|value| value.as_bytes()))
}

/// The caller a presented token makes: the API token, else the token
/// checked as a JWT.
pub async fn authenticate(checks: &CallerChecks, presented: &[u8]) -> Result<Caller, AuthFailure> {
    if checks
        .api_token
        .as_ref()
        .is_some_and(|token| token.matches(presented))
    {
        return Ok(Caller::ApiToken);
    }
    let Some(verifier) = &checks.jwt else {
        return Err(AuthFailure::NotTheApiToken);
    };
    // A JWT is base64url and dots: anything else cannot be one.
    let token = std::str::from_utf8(presented).map_err(|_| TokenError::Malformed)?;
    // Boxed: the check's future (a key set fetch among its states) would
    // otherwise make every request's guard future as large, and be copied
    // with it, token or not.
    let subject: Arc<str> = Box::pin(verifier.verify(token)).await?;
    Ok(Caller::Subject(subject))
}

/// The credentials of a `Bearer` authorization header (scheme case-insensitive).
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_is_taken_from_the_authorization_header() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
    }

    #[test]
    fn api_token_compares_whole_tokens_and_never_prints() {
        let token = ApiToken::new(b"s3cret".to_vec());
        assert!(token.matches(b"s3cret"));
        assert!(!token.matches(b"s3cre"));
        assert!(!token.matches(b"s3cret!"));
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
