//! The typed store client: one method per verb, each returning what the
//! store did, decoded once from the reply together with its request.
//!
//! A reply means something only with its request: `:-1` is "not applied"
//! for a conditional SET and "the key holds another value" for VDEL, `:0`
//! is "no such key" for DEL and VDEL. [`decode`] is the one place that
//! reads reply shapes; everything above (the key handlers, the watch hub,
//! the pool's metrics through [`Labelled`]) matches on the outcomes here.
//!
//! Adding a verb: a method on [`StoreClient`] that builds its
//! [`Request`], an outcome type if "done" is not enough, its arm in
//! [`decode`], and its [`Labelled`] impl.

pub mod reserved;
pub mod scan_ahead;

use bytes::Bytes;
use thiserror::Error;

use crate::mqtt::{Labelled, Pool, PoolError, RequestOptions, StoreResponse};
use crate::protocol::{Hlc, KeyPage, Reply, Request, SetCondition, SetOptions, StoreError};

/// A value and the version the store gave it (its `__ts`; a store that
/// omits it gives `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// The key's version.
    pub version: Option<Hlc>,
}

/// What a SET did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    /// The key now holds the value, at this version.
    Applied(Option<Hlc>),
    /// The condition (NX or NEX) did not hold; nothing changed.
    NotApplied,
}

/// What a DEL did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelOutcome {
    /// The key was deleted; the version of the delete.
    Deleted(Option<Hlc>),
    /// There was no such key.
    Missing,
}

/// What a VDEL did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VdelOutcome {
    /// The key held the value and was deleted; the version of the delete.
    Deleted(Option<Hlc>),
    /// There was no such key.
    Missing,
    /// The key holds another value; nothing changed.
    ValueDiffers,
}

/// Why a store request has no outcome.
#[derive(Debug, Clone, Error)]
pub enum RequestError {
    /// The store answered `-ERR` (or the broker refused the request in a
    /// way the store would have: not authorized, quota).
    #[error("the state store refused the request: {}", .error.message())]
    Refused {
        /// The store's error.
        error: StoreError,
        /// Whether the request carried a fencing token (`__ft`), which
        /// decides whose fault a `malformed timestamp` is.
        fenced: bool,
    },
    /// The request got no reply: see [`PoolError`].
    #[error(transparent)]
    Transport(#[from] PoolError),
    /// A reply shape that does not answer the request (e.g. `+OK` to GET).
    #[error("the state store answered {verb} with an unexpected reply ({reply})")]
    UnexpectedReply {
        /// The request's verb.
        verb: &'static str,
        /// What came back, described.
        reply: String,
    },
}

impl RequestError {
    /// Whether the request surely did not change the store: the store
    /// refused it, or it never left the gateway. A timeout or a lost
    /// connection after sending leaves the outcome unknown.
    pub fn surely_not_applied(&self) -> bool {
        match self {
            RequestError::Refused { .. } => true,
            RequestError::Transport(error) => matches!(
                error,
                PoolError::Unavailable
                    | PoolError::Overloaded
                    | PoolError::ConnectionLost
                    | PoolError::Clock(_)
                    | PoolError::TooLarge { .. }
                    | PoolError::ShuttingDown
            ),
            RequestError::UnexpectedReply { .. } => false,
        }
    }
}

/// The store, through the pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreClient {
    pool: Pool,
    /// Requests go to this member only (KEYNOTIFY registrations belong to
    /// the connection that sent them); `None`: the least-loaded one.
    member: Option<usize>,
}

impl StoreClient {
    /// A client sending each request on the least-loaded pool member.
    pub fn new(pool: Pool) -> Self {
        Self { pool, member: None }
    }

    /// The pool underneath: readiness, notifications, member events.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The same client, sending every request on one member: KEYNOTIFY
    /// and STOP must go to the member that holds the registrations.
    pub fn on_member(&self, member: usize) -> Self {
        Self {
            pool: self.pool.clone(),
            member: Some(member),
        }
    }

    /// `GET key`: the value and its version, or `None` when the key does
    /// not exist.
    pub async fn get(&self, key: Bytes) -> Result<Option<Versioned<Bytes>>, RequestError> {
        let request = Request::Get { key };
        match self.call(&request, RequestOptions::default()).await? {
            Decoded::Get(outcome) => Ok(outcome),
            other => Err(other.mismatch(&request)),
        }
    }

    /// `SET key value [NX|NEX] [PX ms]`, with the envelope's fencing token
    /// and persistence.
    pub async fn set(
        &self,
        key: Bytes,
        value: Bytes,
        options: SetOptions,
        envelope: &RequestOptions,
    ) -> Result<SetOutcome, RequestError> {
        let request = Request::Set {
            key,
            value,
            options,
        };
        match self.call(&request, envelope.clone()).await? {
            Decoded::Set(outcome) => Ok(outcome),
            other => Err(other.mismatch(&request)),
        }
    }

    /// `DEL key`, fenced by `fencing_token` when given.
    pub async fn del(
        &self,
        key: Bytes,
        fencing_token: Option<Hlc>,
    ) -> Result<DelOutcome, RequestError> {
        let request = Request::Del { key };
        match self.call(&request, fenced(fencing_token)).await? {
            Decoded::Del(outcome) => Ok(outcome),
            other => Err(other.mismatch(&request)),
        }
    }

    /// `VDEL key value`: delete only while the key holds `value`; fenced
    /// by `fencing_token` when given.
    pub async fn vdel(
        &self,
        key: Bytes,
        value: Bytes,
        fencing_token: Option<Hlc>,
    ) -> Result<VdelOutcome, RequestError> {
        let request = Request::VDel { key, value };
        match self.call(&request, fenced(fencing_token)).await? {
            Decoded::Vdel(outcome) => Ok(outcome),
            other => Err(other.mismatch(&request)),
        }
    }

    /// `KEYNOTIFY key`: the store notifies this client's member of every
    /// change of the key (use [`StoreClient::on_member`]).
    pub async fn keynotify(&self, key: Bytes) -> Result<(), RequestError> {
        let request = Request::KeyNotify { key, stop: false };
        self.call(&request, RequestOptions::default()).await?;
        Ok(())
    }

    /// `KEYNOTIFY key STOP`: ends the registration (stopping one that does
    /// not exist is no error).
    pub async fn stop(&self, key: Bytes) -> Result<(), RequestError> {
        let request = Request::KeyNotify { key, stop: true };
        self.call(&request, RequestOptions::default()).await?;
        Ok(())
    }

    /// `SCAN pattern [token]`: one page of the keys matching the glob
    /// `pattern`, starting where `token` (from the previous page) left off.
    /// A page may be empty while it still has a token; the listing is
    /// complete at the first page without one.
    pub async fn scan(
        &self,
        pattern: Bytes,
        token: Option<Bytes>,
    ) -> Result<KeyPage, RequestError> {
        let request = Request::Scan { pattern, token };
        match self.call(&request, RequestOptions::default()).await? {
            Decoded::Scan(page) => Ok(page),
            other => Err(other.mismatch(&request)),
        }
    }

    /// Sends the request and decodes its reply once; the pool labels its
    /// metrics from the decoded result.
    async fn call(
        &self,
        request: &Request,
        options: RequestOptions,
    ) -> Result<Decoded, RequestError> {
        let options = RequestOptions {
            member: self.member,
            ..options
        };
        let fenced = options.fencing_token.is_some();
        let read = |response| decode(request, fenced, response);
        self.pool.request(request, &options, read).await?
    }
}

fn fenced(fencing_token: Option<Hlc>) -> RequestOptions {
    RequestOptions {
        fencing_token,
        ..RequestOptions::default()
    }
}

/// A reply decoded with its request: one variant per verb.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decoded {
    Get(Option<Versioned<Bytes>>),
    Set(SetOutcome),
    Del(DelOutcome),
    Vdel(VdelOutcome),
    /// KEYNOTIFY and KEYNOTIFY STOP.
    Done,
    Scan(KeyPage),
}

impl Decoded {
    /// Cannot happen: [`decode`] answers each verb with its own variant.
    fn mismatch(&self, request: &Request) -> RequestError {
        RequestError::UnexpectedReply {
            verb: request.verb(),
            reply: format!("{self:?}"),
        }
    }
}

/// The one reading of reply shapes: what `reply` means as the answer to
/// `request`. `fenced`: the request carried a fencing token.
fn decode(
    request: &Request,
    fenced: bool,
    response: StoreResponse,
) -> Result<Decoded, RequestError> {
    let StoreResponse { reply, version } = response;
    let decoded = match (request, reply) {
        (_, Reply::Error(error)) => return Err(RequestError::Refused { error, fenced }),
        (Request::Get { .. }, Reply::Value(value)) => {
            Decoded::Get(Some(Versioned { value, version }))
        }
        (Request::Get { .. }, Reply::NotFound) => Decoded::Get(None),
        (Request::Set { .. }, Reply::Ok) => Decoded::Set(SetOutcome::Applied(version)),
        (Request::Set { options, .. }, Reply::Integer(-1))
            if options.condition != SetCondition::Always =>
        {
            Decoded::Set(SetOutcome::NotApplied)
        }
        (Request::Del { .. }, Reply::Integer(n)) if n >= 1 => {
            Decoded::Del(DelOutcome::Deleted(version))
        }
        (Request::Del { .. }, Reply::Integer(0)) => Decoded::Del(DelOutcome::Missing),
        (Request::VDel { .. }, Reply::Integer(n)) if n >= 1 => {
            Decoded::Vdel(VdelOutcome::Deleted(version))
        }
        (Request::VDel { .. }, Reply::Integer(0)) => Decoded::Vdel(VdelOutcome::Missing),
        (Request::VDel { .. }, Reply::Integer(-1)) => Decoded::Vdel(VdelOutcome::ValueDiffers),
        (Request::KeyNotify { stop: false, .. }, Reply::Ok) => Decoded::Done,
        // STOP answers `:0` when there was nothing to stop.
        (Request::KeyNotify { stop: true, .. }, Reply::Ok | Reply::Integer(_)) => Decoded::Done,
        (Request::Scan { .. }, Reply::Keys(page)) => Decoded::Scan(page),
        (request, reply) => {
            return Err(RequestError::UnexpectedReply {
                verb: request.verb(),
                reply: describe(&reply),
            });
        }
    };
    Ok(decoded)
}

/// A reply as written on the wire, for error messages (values by length).
fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Ok => "+OK".to_owned(),
        Reply::Integer(n) => format!(":{n}"),
        Reply::Value(value) => format!("a value of {} bytes", value.len()),
        Reply::NotFound => "$-1".to_owned(),
        Reply::Error(error) => format!("-ERR {}", error.message()),
        Reply::Keys(page) => format!("a page of {} keys", page.keys.len()),
    }
}

impl Labelled for Result<Decoded, RequestError> {
    fn outcome(&self) -> &'static str {
        match self {
            Ok(Decoded::Get(None)) => "not_found",
            Ok(Decoded::Set(SetOutcome::NotApplied) | Decoded::Vdel(VdelOutcome::ValueDiffers)) => {
                "not_applied"
            }
            Ok(_) => "ok",
            Err(RequestError::Refused { .. }) => "error",
            Err(RequestError::UnexpectedReply { .. }) => "unexpected_reply",
            Err(RequestError::Transport(error)) => error.kind(),
        }
    }

    fn store_error(&self) -> Option<&'static str> {
        match self {
            Err(RequestError::Refused { error, .. }) => Some(error.kind()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::SetOptions;

    fn version() -> Option<Hlc> {
        Some(Hlc::new(1_700_000_000_000, "StateStore"))
    }

    fn reply(request: &Request, reply: Reply) -> Result<Decoded, RequestError> {
        decode(
            request,
            false,
            StoreResponse {
                reply,
                version: version(),
            },
        )
    }

    fn key() -> Bytes {
        Bytes::from_static(b"k")
    }

    fn set(condition: SetCondition) -> Request {
        Request::Set {
            key: key(),
            value: Bytes::from_static(b"v"),
            options: SetOptions {
                condition,
                expires_in_ms: None,
            },
        }
    }

    #[test]
    fn minus_one_means_not_applied_for_a_conditional_set_only() {
        for condition in [
            SetCondition::OnlyIfMissing,
            SetCondition::OnlyIfMissingOrEqual,
        ] {
            assert_eq!(
                reply(&set(condition), Reply::Integer(-1)).unwrap(),
                Decoded::Set(SetOutcome::NotApplied)
            );
        }
        assert!(matches!(
            reply(&set(SetCondition::Always), Reply::Integer(-1)),
            Err(RequestError::UnexpectedReply { verb: "SET", .. })
        ));
        assert_eq!(
            reply(&set(SetCondition::Always), Reply::Ok).unwrap(),
            Decoded::Set(SetOutcome::Applied(version()))
        );
    }

    #[test]
    fn integers_mean_deleted_missing_or_value_differs() {
        let del = Request::Del { key: key() };
        let vdel = Request::VDel {
            key: key(),
            value: Bytes::from_static(b"v"),
        };
        assert_eq!(
            reply(&del, Reply::Integer(1)).unwrap(),
            Decoded::Del(DelOutcome::Deleted(version()))
        );
        assert_eq!(
            reply(&del, Reply::Integer(0)).unwrap(),
            Decoded::Del(DelOutcome::Missing)
        );
        assert!(reply(&del, Reply::Integer(-1)).is_err());
        assert_eq!(
            reply(&vdel, Reply::Integer(1)).unwrap(),
            Decoded::Vdel(VdelOutcome::Deleted(version()))
        );
        assert_eq!(
            reply(&vdel, Reply::Integer(0)).unwrap(),
            Decoded::Vdel(VdelOutcome::Missing)
        );
        assert_eq!(
            reply(&vdel, Reply::Integer(-1)).unwrap(),
            Decoded::Vdel(VdelOutcome::ValueDiffers)
        );
    }

    #[test]
    fn get_gives_a_versioned_value_or_none() {
        let get = Request::Get { key: key() };
        assert_eq!(
            reply(&get, Reply::Value(Bytes::from_static(b"x"))).unwrap(),
            Decoded::Get(Some(Versioned {
                value: Bytes::from_static(b"x"),
                version: version()
            }))
        );
        assert_eq!(reply(&get, Reply::NotFound).unwrap(), Decoded::Get(None));
        assert!(matches!(
            reply(&get, Reply::Ok),
            Err(RequestError::UnexpectedReply { verb: "GET", reply }) if reply == "+OK"
        ));
    }

    #[test]
    fn store_errors_carry_whether_the_request_was_fenced() {
        let del = Request::Del { key: key() };
        let response = StoreResponse {
            reply: Reply::Error(StoreError::MalformedTimestamp),
            version: None,
        };
        assert!(matches!(
            decode(&del, true, response),
            Err(RequestError::Refused {
                error: StoreError::MalformedTimestamp,
                fenced: true
            })
        ));
    }

    #[test]
    fn only_a_refusal_or_a_request_never_sent_surely_changed_nothing() {
        let unknown: Vec<&str> = PoolError::one_of_each()
            .into_iter()
            .filter(|error| !RequestError::Transport(error.clone()).surely_not_applied())
            .map(|error| error.kind())
            .collect();
        assert_eq!(
            unknown,
            ["timeout", "outcome_unknown", "decode", "bad_version"]
        );
        let refused = RequestError::Refused {
            error: StoreError::QuotaExceeded,
            fenced: false,
        };
        assert!(refused.surely_not_applied());
    }

    #[test]
    fn keynotify_wants_ok_and_stop_accepts_a_count() {
        let notify = Request::KeyNotify {
            key: key(),
            stop: false,
        };
        let stop = Request::KeyNotify {
            key: key(),
            stop: true,
        };
        assert_eq!(reply(&notify, Reply::Ok).unwrap(), Decoded::Done);
        assert!(reply(&notify, Reply::Integer(0)).is_err());
        assert_eq!(reply(&stop, Reply::Integer(0)).unwrap(), Decoded::Done);
        assert_eq!(reply(&stop, Reply::Ok).unwrap(), Decoded::Done);
    }

    #[test]
    fn scan_wants_a_page_and_other_verbs_refuse_one() {
        let scan = Request::Scan {
            pattern: Bytes::from_static(b"*"),
            token: None,
        };
        let page = KeyPage {
            keys: vec![key()],
            token: Some(Bytes::from_static(b"1;k")),
        };
        assert_eq!(
            reply(&scan, Reply::Keys(page.clone())).unwrap(),
            Decoded::Scan(page.clone())
        );
        assert_eq!(reply(&scan, Reply::Keys(page.clone())).outcome(), "ok");
        assert!(matches!(
            reply(&scan, Reply::Ok),
            Err(RequestError::UnexpectedReply { verb: "SCAN", .. })
        ));
        assert!(matches!(
            reply(&Request::Get { key: key() }, Reply::Keys(page)),
            Err(RequestError::UnexpectedReply { verb: "GET", reply }) if reply == "a page of 1 keys"
        ));
    }

    #[test]
    fn metric_labels_name_the_meaning() {
        let get = Request::Get { key: key() };
        assert_eq!(reply(&get, Reply::NotFound).outcome(), "not_found");
        assert_eq!(
            reply(&set(SetCondition::OnlyIfMissing), Reply::Integer(-1)).outcome(),
            "not_applied"
        );
        let refused = reply(&get, Reply::Error(StoreError::QuotaExceeded));
        assert_eq!(refused.outcome(), "error");
        assert_eq!(refused.store_error(), Some("quota_exceeded"));
        assert_eq!(reply(&get, Reply::NotFound).store_error(), None);
    }
}
