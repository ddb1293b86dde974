//! Every way a key API request can fail, and the one function that turns a
//! failure into an HTTP status and an RFC 9457 `application/problem+json`
//! body.
//!
//! A reader looking for "which status does the store's reply X give" finds
//! it in [`ApiError::problem`] and the functions it hands the wrapped lower
//! errors to (`request_kind`, `pool_kind`, `watch_kind`). Responses carry a [`FailureLog`] extension so
//! the request middleware writes one log line per failed request, with the
//! route and method it knows and the cause only the error knows.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use thiserror::Error;

use crate::access::AuthFailure;
use crate::access::rules::Denied;
use crate::locks::{Holding, LockError};
use crate::mqtt::PoolError;
use crate::protocol::{HlcError, StoreError};
use crate::store::RequestError;
use crate::watch::WatchError;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying when no broker connection
/// can take its request (a pool member reconnects within about a second).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Which condition of a write did not hold (412).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// `If-None-Match: *` on a key that exists.
    KeyAbsent,
    /// `nex=true` on a key that holds another value.
    AbsentOrEqual,
    /// `DELETE ?value=` on a key that holds another value.
    ValueMatches,
}

/// Why a request failed. Messages are the `detail` of the problem body.
///
/// The lower layers' errors are wrapped as they are ([`RequestError`],
/// [`WatchError`]); [`ApiError::problem`] maps their variants.
#[derive(Debug, Error)]
pub enum ApiError {
    /// A GET, DEL or VDEL of a key that does not exist.
    #[error("the key does not exist")]
    KeyNotFound,
    /// No route for the path.
    #[error("no such resource; keys live under /keys/")]
    RouteNotFound,
    /// A method the resource does not serve.
    #[error("this resource does not support the method; the Allow header lists those it does")]
    MethodNotAllowed,
    /// The condition of a conditional write did not hold.
    #[error("{}", precondition_detail(*.0))]
    PreconditionFailed(Precondition),
    /// A store request failed: refused (`-ERR`), not carried by the pool,
    /// or answered with a reply that does not fit.
    #[error("{}", request_detail(.0))]
    Request(#[from] RequestError),
    /// A watch could not start.
    #[error("{}", watch_detail(.0))]
    Watch(#[from] WatchError),
    /// `/keys/` with nothing after it.
    #[error("the key is empty")]
    EmptyKey,
    /// A `%` not followed by two hex digits in the path or query.
    #[error("malformed percent-encoding in the {0}")]
    BadPercentEncoding(&'static str),
    /// The key is longer than `--max-key-bytes`.
    #[error("the key is {len} bytes long; the limit is {max} bytes")]
    KeyTooLong {
        /// Decoded length (or a lower bound of it).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body is larger than the value limit.
    #[error("the value is larger than the limit of {max} bytes")]
    ValueTooLarge {
        /// The limit.
        max: usize,
    },
    /// The `Fencing-Token` header is not an HLC.
    #[error("the Fencing-Token header is not a hybrid logical clock value ({0})")]
    BadFencingToken(String),
    /// The `Fencing-Token` is more than 60 s ahead of our clock.
    #[error(
        "the Fencing-Token is more than 60 s ahead of the gateway's clock; use a version the store returned"
    )]
    FencingTokenTooFarAhead,
    /// `ttl` did not parse or is zero.
    #[error(
        "invalid ttl {0:?}: use a positive duration such as 500ms, 30s, 2m, or plain milliseconds"
    )]
    BadTtl(String),
    /// A query parameter that is unknown, repeated or has a bad value.
    #[error("{0}")]
    BadQuery(String),
    /// A header the gateway cannot honour (or a malformed one).
    #[error("{0}")]
    BadHeader(String),
    /// A listing's `cursor` that does not decode, belongs to another
    /// `match`, or that the store refused.
    #[error("invalid cursor: {0}; start the listing again without a cursor")]
    BadCursor(String),
    /// `If-None-Match: *` and `nex=true` together.
    #[error(
        "If-None-Match: * (set only if absent) and nex=true (set if absent or equal) exclude each other"
    )]
    ConflictingConditions,
    /// The request body stream failed.
    #[error("the request body could not be read: {0}")]
    BodyRead(String),
    /// The client sent its body too slowly.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    /// Missing or refused bearer token.
    #[error("{0}")]
    Unauthorized(AuthFailure),
    /// The authorization rules do not let the caller do this to the key.
    #[error("{0}")]
    Forbidden(#[from] Denied),
    /// Someone else holds the lock (`None`: it was released just after
    /// the request's last try).
    #[error("{}", lock_held_detail(.0.as_ref()))]
    LockHeld(Option<Holding>),
    /// Someone else holds the lock, and the caller may not read its key:
    /// the holder is the key's value and the fencing token its version, so
    /// the answer names neither.
    #[error(
        "the lock is held by another holder, not named: the caller may not read the lock's key"
    )]
    LockHeldUnnamed,
    /// Nobody holds the lock.
    #[error("nobody holds the lock")]
    LockNotHeld,
    /// The name is a key written with a `Fencing-Token`, not a lock.
    #[error(
        "the key was written with a Fencing-Token: it is a fenced resource, not a lock, and cannot be taken or released as one"
    )]
    NotALock,
    /// `holder` is missing, empty or too long.
    #[error("{0}")]
    BadHolder(String),
    /// `wait` did not parse or is longer than allowed.
    #[error("{0}")]
    BadWait(String),
    /// A batch body that is not `{"ops": [...]}` JSON.
    #[error("{0}")]
    BadBatch(String),
    /// One op of a batch is refused as its one-key request would be; the
    /// whole batch is refused and nothing is sent.
    #[error("op {index}: {error}")]
    BatchOp {
        /// The op's position in `ops`, from 0.
        index: usize,
        /// Why the op is refused.
        error: Box<ApiError>,
    },
    /// A batch of more than `--max-batch-ops` ops.
    #[error("the batch has more ops than the limit of {max}")]
    TooManyOps {
        /// The limit.
        max: usize,
    },
    /// A batch op not sent: the ops before it on its key used up the
    /// batch's time (`--request-timeout` from its start).
    #[error("the batch's {0:?} ran out before this op's turn: it was not sent")]
    BatchOutOfTime(Duration),
    /// A batch body larger than `--max-batch-bytes`.
    #[error("the batch body is larger than the limit of {max} bytes")]
    BatchTooLarge {
        /// The limit.
        max: usize,
    },
    /// A body in a media type the route does not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The whole request outlived the gateway's backstop timeout.
    #[error("the request did not complete within {0:?}")]
    HandlerTimeout(Duration),
}

fn precondition_detail(precondition: Precondition) -> &'static str {
    match precondition {
        Precondition::KeyAbsent => "the key already exists (If-None-Match: *)",
        Precondition::AbsentOrEqual => "the key exists and holds a different value (nex=true)",
        Precondition::ValueMatches => "the key holds a different value than the one given",
    }
}

fn lock_held_detail(holding: Option<&Holding>) -> String {
    match holding {
        Some(holding) => format!(
            "the lock is held by {:?}",
            String::from_utf8_lossy(&holding.holder)
                .chars()
                .take(64)
                .collect::<String>()
        ),
        None => "the lock was held by another until the request's last try".into(),
    }
}

fn request_detail(error: &RequestError) -> String {
    match error {
        // `fenced`: the client sent a `Fencing-Token`, which decides whose
        // fault a `malformed timestamp` is.
        RequestError::Refused { error, fenced } => store_detail(error, *fenced),
        RequestError::Transport(error) => pool_detail(error),
        RequestError::UnexpectedReply { .. } => error.to_string(),
    }
}

fn watch_detail(error: &WatchError) -> String {
    match error {
        WatchError::TooManyWatchers(max) => {
            format!("the gateway already serves its maximum of {max} watchers; retry later")
        }
        WatchError::TooManyWatchedKeys(max) => {
            format!("the gateway already watches its maximum of {max} distinct keys; retry later")
        }
        WatchError::TooManyPatterns(max) => format!(
            "the gateway already follows its maximum of {max} distinct patterns (--max-watch-patterns); join a followed pattern or retry later"
        ),
        WatchError::TooManyKeysPerStream(max) => format!("a stream may watch at most {max} keys"),
        WatchError::TooManyKeysPerPattern(max) => format!(
            "the pattern matches more than {max} keys, the most one followed pattern may match (--max-keys-per-pattern); narrow it"
        ),
        WatchError::NoKeys => {
            "name at least one key or pattern: /watch/{key}, /watch?key=a&key=b or /watch?match=sensor/*".into()
        }
        WatchError::EmptyKey => "the key is empty".into(),
        WatchError::Register(error) => request_detail(error),
        // The registration is a store request that got no reply in time.
        WatchError::Timeout(after) => pool_detail(&PoolError::Timeout(*after)),
        WatchError::ShuttingDown => pool_detail(&PoolError::ShuttingDown),
    }
}

fn pool_detail(error: &PoolError) -> String {
    match error {
        PoolError::OutcomeUnknown | PoolError::Timeout(_) => {
            format!("{error}; a write may or may not have been applied")
        }
        other => other.to_string(),
    }
}

fn store_detail(error: &StoreError, client_token: bool) -> String {
    match error {
        StoreError::FencingTokenRequired => {
            "the key is protected by a fencing token: send the Fencing-Token header".into()
        }
        StoreError::FencingTokenLowerVersion => {
            "the Fencing-Token is older than the token protecting the key".into()
        }
        StoreError::FencingTokenSkew => {
            "the store finds the Fencing-Token too far in the future".into()
        }
        StoreError::TimestampSkew => {
            "the gateway's clock is ahead of the state store's; the request was refused".into()
        }
        StoreError::QuotaExceeded => "the state store's quota has been exceeded".into(),
        StoreError::NotAuthorized => "the gateway may not access this key".into(),
        StoreError::KeyLengthZero => "the key is empty".into(),
        StoreError::MalformedTimestamp if client_token => {
            "the store refused the Fencing-Token as malformed".into()
        }
        other => format!("the state store refused the request: {}", other.message()),
    }
}

/// How loudly a failure is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Routine client-side outcomes (404, 412, bad input).
    Info,
    /// Failures an operator may need to act on (403, 507, 503, 504).
    Warn,
    /// The gateway or the store misbehave (502, 500, clock skew).
    Error,
}

/// The cause of a failed response, for the request log line. Put in the
/// response's extensions by [`ApiError::into_response`].
#[derive(Debug, Clone)]
pub struct FailureLog {
    /// How loudly to log.
    pub severity: Severity,
    /// The error's text (never secrets: tokens are not part of any error).
    pub cause: String,
}

/// The problem document (RFC 9457) plus the status and extra headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Stable relative URI naming the problem type.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Short summary of the type.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// The raw `-ERR` text from the store, when the store sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
    /// Who holds the lock (409 on a lock), when UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Who holds the lock, base64: always with `holder`'s 409, so a
    /// holder that is not UTF-8 is still named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_base64: Option<String>,
    /// The fencing token of the current holder's hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
    /// The index of the batch op that made the whole batch refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<usize>,
    #[serde(skip)]
    retry_after: bool,
    #[serde(skip)]
    severity: Severity,
}

/// A problem type: the status, the type's URI and title, and how loudly it
/// is logged.
type Kind = (u16, &'static str, &'static str, Severity);

/// The problem types that more than one failure leads to.
const EMPTY_KEY: Kind = (400, "/problems/empty-key", "Empty key", Severity::Info);
const INVALID_QUERY: Kind = (
    400,
    "/problems/invalid-query",
    "Invalid query",
    Severity::Info,
);
const INVALID_FENCING_TOKEN: Kind = (
    400,
    "/problems/invalid-fencing-token",
    "Invalid fencing token",
    Severity::Info,
);
const FENCING_TOKEN_TOO_FAR_AHEAD: Kind = (
    400,
    "/problems/fencing-token-too-far-ahead",
    "Fencing token too far in the future",
    Severity::Info,
);
const VALUE_TOO_LARGE: Kind = (
    413,
    "/problems/value-too-large",
    "Value too large",
    Severity::Info,
);
const BAD_STORE_REPLY: Kind = (
    502,
    "/problems/bad-store-reply",
    "Bad reply from the state store",
    Severity::Error,
);
/// The store refused the gateway, or the rules the caller.
const FORBIDDEN: Kind = (403, "/problems/forbidden", "Forbidden", Severity::Warn);
/// No broker connection can take the request now: the one 503 that
/// carries `Retry-After`.
const UNAVAILABLE: Kind = (
    503,
    "/problems/unavailable",
    "State store unavailable",
    Severity::Warn,
);

impl ApiError {
    /// The one mapping from failure to status, problem type and log level.
    pub fn problem(&self) -> Problem {
        use Severity::{Info, Warn};
        if let Self::BatchOp { index, error } = self {
            return Problem {
                detail: self.to_string(),
                op: Some(*index),
                ..error.problem()
            };
        }
        let (status, kind, title, severity) = match self {
            Self::KeyNotFound => (404, "/problems/key-not-found", "Key not found", Info),
            Self::RouteNotFound => (404, "/problems/not-found", "Not found", Info),
            Self::MethodNotAllowed => (
                405,
                "/problems/method-not-allowed",
                "Method not allowed",
                Info,
            ),
            Self::PreconditionFailed(_) => (
                412,
                "/problems/precondition-failed",
                "Precondition failed",
                Info,
            ),
            Self::Request(error) => request_kind(error),
            Self::Watch(error) => watch_kind(error),
            Self::EmptyKey => EMPTY_KEY,
            Self::BadPercentEncoding(_) => (
                400,
                "/problems/bad-percent-encoding",
                "Malformed percent-encoding",
                Info,
            ),
            Self::KeyTooLong { .. } => (414, "/problems/key-too-long", "Key too long", Info),
            Self::ValueTooLarge { .. } => VALUE_TOO_LARGE,
            Self::BadFencingToken(_) => INVALID_FENCING_TOKEN,
            Self::FencingTokenTooFarAhead => FENCING_TOKEN_TOO_FAR_AHEAD,
            Self::BadTtl(_) => (400, "/problems/invalid-ttl", "Invalid ttl", Info),
            Self::BadQuery(_) => INVALID_QUERY,
            Self::BadHeader(_) => (400, "/problems/invalid-header", "Invalid header", Info),
            Self::BadCursor(_) => (400, "/problems/invalid-cursor", "Invalid cursor", Info),
            Self::ConflictingConditions => (
                400,
                "/problems/conflicting-conditions",
                "Conflicting conditions",
                Info,
            ),
            Self::BodyRead(_) => (400, "/problems/bad-body", "Unreadable body", Info),
            Self::BodyTimeout(_) => (408, "/problems/request-timeout", "Request timeout", Info),
            Self::Unauthorized(_) => (401, "/problems/unauthorized", "Unauthorized", Info),
            Self::Forbidden(Denied::Rules { .. }) => FORBIDDEN,
            Self::Forbidden(Denied::Reserved { .. }) => {
                (403, "/problems/reserved-key", "Reserved key", Warn)
            }
            Self::HandlerTimeout(_) => (504, "/problems/timeout", "Gateway timeout", Warn),
            Self::BadBatch(_) => (400, "/problems/invalid-batch", "Invalid batch", Info),
            // Answered above, with the op's own problem.
            Self::BatchOp { .. } => (400, "/problems/invalid-batch", "Invalid batch", Info),
            Self::BatchOutOfTime(_) => UNAVAILABLE,
            Self::TooManyOps { .. } => (413, "/problems/too-many-ops", "Too many ops", Info),
            Self::BatchTooLarge { .. } => {
                (413, "/problems/batch-too-large", "Batch too large", Info)
            }
            Self::UnsupportedMediaType(_) => (
                415,
                "/problems/unsupported-media-type",
                "Unsupported media type",
                Info,
            ),
            Self::LockHeld(_) | Self::LockHeldUnnamed => {
                (409, "/problems/lock-held", "Lock held", Info)
            }
            Self::LockNotHeld => (404, "/problems/lock-not-held", "Lock not held", Info),
            Self::NotALock => (409, "/problems/not-a-lock", "Not a lock", Info),
            Self::BadHolder(_) => (400, "/problems/invalid-holder", "Invalid holder", Info),
            Self::BadWait(_) => (400, "/problems/invalid-wait", "Invalid wait", Info),
        };
        let holding = match self {
            Self::LockHeld(Some(holding)) => Some(holding),
            _ => None,
        };
        let store_error = match self.request_error() {
            Some(RequestError::Refused { error, .. }) => Some(error.message().to_owned()),
            _ => None,
        };
        Problem {
            kind,
            title,
            status,
            detail: self.to_string(),
            store_error,
            holder: holding.and_then(|h| std::str::from_utf8(&h.holder).ok().map(str::to_owned)),
            holder_base64: holding.map(|h| BASE64.encode(&h.holder)),
            fencing_token: holding.and_then(|h| h.fencing_token.as_ref().map(ToString::to_string)),
            op: None,
            retry_after: status == 429 || kind == UNAVAILABLE.1,
            severity,
        }
    }

    /// The store request under the failure, if there is one.
    fn request_error(&self) -> Option<&RequestError> {
        match self {
            Self::Request(error) | Self::Watch(WatchError::Register(error)) => Some(error),
            _ => None,
        }
    }
}

fn request_kind(error: &RequestError) -> Kind {
    use Severity::{Error, Info, Warn};
    match error {
        RequestError::Refused { error, fenced } => match error {
            StoreError::FencingTokenRequired => (
                428,
                "/problems/fencing-token-required",
                "Fencing token required",
                Info,
            ),
            StoreError::FencingTokenLowerVersion => (
                409,
                "/problems/fencing-token-outdated",
                "Fencing token outdated",
                Info,
            ),
            StoreError::FencingTokenSkew => FENCING_TOKEN_TOO_FAR_AHEAD,
            StoreError::KeyLengthZero => EMPTY_KEY,
            // Whose fault a malformed timestamp is: the client's when it
            // sent the fencing token.
            StoreError::MalformedTimestamp if *fenced => INVALID_FENCING_TOKEN,
            StoreError::NotAuthorized => FORBIDDEN,
            StoreError::QuotaExceeded => (507, "/problems/quota-exceeded", "Quota exceeded", Warn),
            StoreError::TimestampSkew => (503, "/problems/clock-skew", "Clock skew", Error),
            StoreError::SyntaxError
            | StoreError::UnknownCommand
            | StoreError::WrongNumberOfArguments
            | StoreError::MissingTimestamp
            | StoreError::MalformedTimestamp
            | StoreError::Unknown(_) => (502, "/problems/store-error", "State store error", Error),
        },
        RequestError::Transport(error) => pool_kind(error),
        RequestError::UnexpectedReply { .. } => BAD_STORE_REPLY,
    }
}

fn pool_kind(error: &PoolError) -> Kind {
    use Severity::{Error, Warn};
    match error {
        PoolError::Unavailable
        | PoolError::ConnectionLost
        | PoolError::Overloaded
        | PoolError::ShuttingDown => UNAVAILABLE,
        PoolError::Timeout(_) => (504, "/problems/store-timeout", "State store timeout", Warn),
        PoolError::OutcomeUnknown => (504, "/problems/outcome-unknown", "Outcome unknown", Warn),
        PoolError::Decode(_) | PoolError::BadVersion(_) => BAD_STORE_REPLY,
        PoolError::TooLarge { .. } => VALUE_TOO_LARGE,
        PoolError::Clock(_) => (500, "/problems/clock-error", "Gateway clock error", Error),
    }
}

fn watch_kind(error: &WatchError) -> Kind {
    use Severity::{Info, Warn};
    match error {
        WatchError::TooManyWatchers(_) => (
            429,
            "/problems/too-many-watchers",
            "Too many watchers",
            Warn,
        ),
        WatchError::TooManyWatchedKeys(_) => (
            429,
            "/problems/too-many-watched-keys",
            "Too many watched keys",
            Warn,
        ),
        WatchError::TooManyPatterns(_) => (
            429,
            "/problems/too-many-watch-patterns",
            "Too many watch patterns",
            Warn,
        ),
        WatchError::TooManyKeysPerStream(_) => {
            (429, "/problems/too-many-keys", "Too many keys", Info)
        }
        WatchError::TooManyKeysPerPattern(_) => (
            429,
            "/problems/too-many-pattern-keys",
            "Pattern matches too many keys",
            Info,
        ),
        WatchError::NoKeys => INVALID_QUERY,
        WatchError::EmptyKey => EMPTY_KEY,
        WatchError::Register(error) => request_kind(error),
        WatchError::Timeout(after) => pool_kind(&PoolError::Timeout(*after)),
        WatchError::ShuttingDown => pool_kind(&PoolError::ShuttingDown),
    }
}

impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        match error {
            // Only a key written with a Fencing-Token makes the store want
            // one for a lock's SET or VDEL: the name is a fenced resource.
            LockError::Store(RequestError::Refused {
                error: StoreError::FencingTokenRequired,
                ..
            }) => Self::NotALock,
            LockError::Store(error) => Self::Request(error),
            LockError::Watch(error) => Self::Watch(error),
        }
    }
}

impl Problem {
    /// Whether the response carries `Retry-After`.
    pub fn retry_after(&self) -> bool {
        self.retry_after
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        super::headers::set_common_headers(headers, PROBLEM_JSON);
        if problem.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if let Self::Unauthorized(failure) = &self {
            headers.insert(header::WWW_AUTHENTICATE, challenge(*failure));
        }
        response.extensions_mut().insert(FailureLog {
            severity: problem.severity,
            cause: problem_cause(&self, &problem),
        });
        response
    }
}

/// The log text: the detail, plus the raw store error or the pool error's
/// source when they say more.
fn problem_cause(error: &ApiError, problem: &Problem) -> String {
    match (error.request_error(), &problem.store_error) {
        (_, Some(raw)) => format!("{} (store: {raw})", problem.detail),
        (Some(RequestError::Transport(PoolError::Clock(HlcError::CounterOverflow))), None) => {
            format!("{} (counter overflow)", problem.detail)
        }
        _ => problem.detail.clone(),
    }
}

/// The `WWW-Authenticate` challenge (RFC 6750, section 3): without a
/// token no error code; with a refused one `invalid_token` and why
/// (the descriptions are fixed ASCII text, never the token's own).
fn challenge(failure: AuthFailure) -> HeaderValue {
    const REALM: &str = "Bearer realm=\"statestore-gateway\"";
    if failure == AuthFailure::Missing {
        return HeaderValue::from_static(REALM);
    }
    let value = format!("{REALM}, error=\"invalid_token\", error_description=\"{failure}\"");
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(REALM))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::jwt::TokenError;
    use crate::protocol::DecodeError;

    fn status(error: ApiError) -> u16 {
        error.problem().status
    }

    fn refused(error: StoreError, fenced: bool) -> ApiError {
        RequestError::Refused { error, fenced }.into()
    }

    fn pool(error: PoolError) -> ApiError {
        RequestError::Transport(error).into()
    }

    #[test]
    fn store_replies_map_to_the_documented_statuses() {
        let cases = [
            (StoreError::FencingTokenRequired, false, 428),
            (StoreError::FencingTokenLowerVersion, true, 409),
            (StoreError::FencingTokenSkew, true, 400),
            (StoreError::NotAuthorized, false, 403),
            (StoreError::QuotaExceeded, false, 507),
            (StoreError::TimestampSkew, false, 503),
            (StoreError::SyntaxError, false, 502),
            (StoreError::UnknownCommand, false, 502),
            (StoreError::WrongNumberOfArguments, false, 502),
            (StoreError::MissingTimestamp, false, 502),
            (StoreError::MalformedTimestamp, false, 502),
            (StoreError::MalformedTimestamp, true, 400),
            (StoreError::KeyLengthZero, false, 400),
            (StoreError::Unknown("brand new".into()), false, 502),
        ];
        for (error, client_token, expected) in cases {
            let problem = refused(error.clone(), client_token).problem();
            assert_eq!(problem.status, expected, "{error:?} token={client_token}");
            assert_eq!(problem.store_error.as_deref(), Some(error.message()));
            assert!(!problem.retry_after(), "{error:?} has no Retry-After");
        }
    }

    #[test]
    fn every_documented_store_error_has_a_status() {
        for error in StoreError::KNOWN {
            let status = status(refused(error.clone(), false));
            assert!((400..600).contains(&status), "{error:?} -> {status}");
        }
    }

    #[test]
    fn pool_failures_are_503_with_retry_after_or_504() {
        for error in [
            PoolError::Unavailable,
            PoolError::ConnectionLost,
            PoolError::Overloaded,
            PoolError::ShuttingDown,
        ] {
            let problem = pool(error).problem();
            assert_eq!(problem.status, 503);
            assert!(problem.retry_after());
        }
        for error in [
            PoolError::Timeout(Duration::from_secs(1)),
            PoolError::OutcomeUnknown,
        ] {
            let problem = pool(error).problem();
            assert_eq!(problem.status, 504);
            assert!(!problem.retry_after());
            assert!(problem.detail.contains("may or may not have been applied"));
        }
        assert_eq!(
            status(pool(PoolError::Decode(DecodeError::Incomplete))),
            502
        );
        assert_eq!(status(pool(PoolError::TooLarge { size: 2, max: 1 })), 413);
    }

    #[test]
    fn local_failures_map_to_their_statuses() {
        let cases = [
            (ApiError::KeyNotFound, 404),
            (ApiError::PreconditionFailed(Precondition::KeyAbsent), 412),
            (
                ApiError::PreconditionFailed(Precondition::ValueMatches),
                412,
            ),
            (ApiError::EmptyKey, 400),
            (ApiError::BadPercentEncoding("key"), 400),
            (ApiError::BadFencingToken("x".into()), 400),
            (ApiError::FencingTokenTooFarAhead, 400),
            (ApiError::BadTtl("x".into()), 400),
            (ApiError::ConflictingConditions, 400),
            (ApiError::KeyTooLong { len: 2, max: 1 }, 414),
            (ApiError::ValueTooLarge { max: 1 }, 413),
            (ApiError::Unauthorized(AuthFailure::Missing), 401),
            (ApiError::MethodNotAllowed, 405),
            (
                ApiError::Request(RequestError::UnexpectedReply {
                    verb: "GET",
                    reply: "+OK".into(),
                }),
                502,
            ),
            (ApiError::BodyTimeout(Duration::from_secs(1)), 408),
            (ApiError::HandlerTimeout(Duration::from_secs(1)), 504),
        ];
        for (error, expected) in cases {
            assert_eq!(status(error), expected);
        }
    }

    #[test]
    fn response_is_problem_json_with_headers() {
        let response = pool(PoolError::Unavailable).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert!(response.extensions().get::<FailureLog>().is_some());

        let response = ApiError::Unauthorized(AuthFailure::Missing).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"statestore-gateway\""
        );
        let response = ApiError::Unauthorized(TokenError::Expired.into()).into_response();
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"statestore-gateway\", error=\"invalid_token\", \
             error_description=\"the token has expired\""
        );
    }

    #[test]
    fn body_has_the_rfc_9457_members_and_the_raw_store_error() {
        let problem = refused(StoreError::QuotaExceeded, false).problem();
        let json = serde_json::to_value(&problem).unwrap();
        assert_eq!(json["type"], "/problems/quota-exceeded");
        assert_eq!(json["title"], "Quota exceeded");
        assert_eq!(json["status"], 507);
        assert!(json["detail"].as_str().unwrap().contains("quota"));
        assert_eq!(json["store_error"], "the quota has been exceeded");

        let json = serde_json::to_value(ApiError::KeyNotFound.problem()).unwrap();
        assert!(json.get("store_error").is_none());
    }

    #[test]
    fn watch_errors_answer_as_the_api_errors_they_stand_for() {
        let after = Duration::from_secs(1);
        let cases = [
            (
                WatchError::NoKeys,
                ApiError::BadQuery(
                    "name at least one key or pattern: /watch/{key}, /watch?key=a&key=b or /watch?match=sensor/*".into(),
                ),
            ),
            (WatchError::EmptyKey, ApiError::EmptyKey),
            (WatchError::Timeout(after), pool(PoolError::Timeout(after))),
            (WatchError::ShuttingDown, pool(PoolError::ShuttingDown)),
            (
                WatchError::Register(RequestError::Transport(PoolError::Unavailable)),
                pool(PoolError::Unavailable),
            ),
            (
                WatchError::Register(RequestError::Refused {
                    error: StoreError::NotAuthorized,
                    fenced: false,
                }),
                refused(StoreError::NotAuthorized, false),
            ),
        ];
        for (watch, api) in cases {
            assert_eq!(
                ApiError::Watch(watch.clone()).problem(),
                api.problem(),
                "{watch:?}"
            );
        }
        let limits = [
            (
                WatchError::TooManyWatchers(3),
                429,
                "/problems/too-many-watchers",
                true,
            ),
            (
                WatchError::TooManyWatchedKeys(3),
                429,
                "/problems/too-many-watched-keys",
                true,
            ),
            (
                WatchError::TooManyPatterns(3),
                429,
                "/problems/too-many-watch-patterns",
                true,
            ),
            (
                WatchError::TooManyKeysPerStream(3),
                429,
                "/problems/too-many-keys",
                true,
            ),
            (
                WatchError::TooManyKeysPerPattern(3),
                429,
                "/problems/too-many-pattern-keys",
                true,
            ),
        ];
        for (watch, status, kind, retry_after) in limits {
            let problem = ApiError::Watch(watch).problem();
            assert_eq!((problem.status, problem.kind), (status, kind));
            assert_eq!(problem.retry_after(), retry_after);
            assert!(problem.detail.contains('3'), "{}", problem.detail);
        }
    }

    #[test]
    fn only_an_unavailable_store_and_limits_ask_to_retry_after() {
        assert!(pool(PoolError::Overloaded).problem().retry_after());
        // A clock-skew 503 is not cured by retrying soon.
        let skew = refused(StoreError::TimestampSkew, false).problem();
        assert_eq!(skew.status, 503);
        assert!(!skew.retry_after());
    }
}
