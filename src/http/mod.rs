//! The gateway's HTTP side: the key API, the admin listener and the `serve`
//! runner with graceful shutdown.
//!
//! - [`keys`]: `/keys/{key}` handlers.
//! - [`problem`]: the one error enum and its RFC 9457 responses.
//! - [`admin`]: `/livez`, `/readyz`, `/metrics` on their own listener.
//! - [`watch`]: `/watch` Server-Sent Events from the watch hub.
//! - [`locks`]: `/locks/{name}`: acquire (and wait), release, read a lock.
//! - [`listener`], [`event_stream`]: the accept loop; watch streams are
//!   written straight to their sockets.
//! - [`openapi`]: `/openapi.json`, the API's OpenAPI document.
//!
//! [`router`] builds the key API so tests can drive it; [`Server`] binds
//! both listeners and runs them until [`Server::shutdown`].

pub mod admin;
pub mod event_stream;
pub mod keys;
pub mod listener;
pub mod locks;
pub mod openapi;
pub mod problem;
pub mod watch;

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

use crate::config::DEFAULT_MAX_VALUE_BYTES;
use crate::locks::{LockSettings, Locks};
use crate::metrics::Metrics;
use crate::mqtt::{ConfigError, Pool, PoolSettings};
use crate::protocol::hlc;
use crate::store::StoreClient;
use crate::watch::{WatchHub, WatchSettings};
use listener::ConnectionLimits;
use problem::{ApiError, FailureLog, Severity};

/// Open connections the admin listener takes (probes, scrapes).
const ADMIN_MAX_CONNECTIONS: usize = 256;

/// Request size and time limits of the key API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes after percent-decoding (longer: 414).
    pub max_key_bytes: usize,
    /// Largest value when configured (capped by the broker's limit once
    /// known); see [`AppState::value_limit`] (larger: 413).
    pub max_value_bytes: Option<usize>,
    /// How long a store request may take; bounds body reads too.
    pub request_timeout: Duration,
}

impl Limits {
    /// The backstop on a whole request: body read plus a slot wait plus the
    /// store round trip, and a second of slack, so nothing hangs even if an
    /// inner timeout fails to fire.
    pub fn backstop(&self) -> Duration {
        self.request_timeout * 2
            + crate::config::slot_wait(self.request_timeout)
            + Duration::from_secs(1)
    }
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

/// What every handler shares: one `Arc`, since axum clones the state for
/// each extractor of each request.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The contents of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    /// The store, through the broker connections.
    pub store: StoreClient,
    /// Metric families.
    pub metrics: Metrics,
    /// Request limits.
    pub limits: Limits,
    /// Milliseconds since the epoch; checks fencing tokens (a function so
    /// tests can move time).
    pub clock: fn() -> u64,
    /// The bearer token the key API requires, if any.
    pub api_token: Option<ApiToken>,
    /// Set once shutdown starts: `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    /// Key watches shared by every SSE stream.
    pub hub: WatchHub,
    /// Locks and their waiters (who follow keys through `hub`).
    pub locks: Locks,
}

impl AppState {
    /// State over a started pool, with the system clock; starts the watch
    /// hub's tasks (so it must run inside a Tokio runtime).
    pub fn new(
        pool: Pool,
        metrics: Metrics,
        limits: Limits,
        api_token: Option<ApiToken>,
        watch: WatchSettings,
        locks: LockSettings,
    ) -> Self {
        let store = StoreClient::new(pool);
        let hub = WatchHub::start(store.clone(), metrics.clone(), watch);
        Self(Arc::new(Shared {
            locks: Locks::new(store.clone(), hub.clone(), metrics.clone(), locks),
            hub,
            store,
            metrics,
            limits,
            clock: hlc::now_ms,
            api_token,
            draining: AtomicBool::new(false),
        }))
    }

    /// The largest value a PUT may carry right now: the configured limit,
    /// capped by what the broker's packet size allows once known; with
    /// neither, [`DEFAULT_MAX_VALUE_BYTES`].
    pub fn value_limit(&self) -> usize {
        match (
            self.limits.max_value_bytes,
            self.store.pool().max_value_bytes(),
        ) {
            (Some(configured), Some(broker)) => configured.min(broker),
            (Some(limit), None) | (None, Some(limit)) => limit,
            (None, None) => DEFAULT_MAX_VALUE_BYTES,
        }
    }

    /// Whether shutdown has started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// The key API (everything but the admin endpoints), with its middleware:
/// request metrics and failure logs outermost, then the bearer token check,
/// then a backstop timeout.
pub fn router(state: AppState) -> Router {
    let backstop = state.limits.backstop();
    api_routes()
        .fallback(route_not_found)
        .layer(from_fn_with_state(
            Guard {
                token: state.api_token.clone(),
                backstop,
                lock_wait: state.locks.settings().max_wait,
            },
            guard,
        ))
        // The dashboard's static files are public; the API calls it makes
        // are not (it asks for the token; its stream sends it as
        // `access_token`, see `query_token`).
        .merge(crate::ui::router())
        .layer(from_fn_with_state(state.metrics.clone(), observe))
        // Bodies are read by the handlers against the value limit.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// The API's routes; the watch routes merge in here.
fn api_routes() -> Router<AppState> {
    Router::new()
        .merge(keys::routes())
        .merge(watch::routes())
        .merge(locks::routes())
        .route(
            "/openapi.json",
            axum::routing::get(openapi::document).fallback(keys::method_not_allowed),
        )
}

async fn route_not_found() -> ApiError {
    ApiError::RouteNotFound
}

/// A path as logged: its first 256 characters.
fn log_path(path: &str) -> &str {
    path.char_indices()
        .nth(256)
        .map_or(path, |(end, _)| &path[..end])
}

/// Counts every request by route template, method and status, times it,
/// and writes one log line per failure with the cause the error left in
/// the response.
async fn observe(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    // Both cheap to clone (shared buffers): no allocation per request.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let uri = request.uri().clone();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let path = log_path(uri.path());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status();
    metrics
        .http_requests
        .with_label_values(&[route, method, status.as_str()])
        .inc();
    metrics
        .http_latency
        .with_label_values(&[route, method])
        .observe(elapsed.as_secs_f64());
    let Some(failure) = response.extensions().get::<FailureLog>() else {
        tracing::debug!(
            method,
            route,
            path,
            status = status.as_u16(),
            "request served"
        );
        return response;
    };
    let status = status.as_u16();
    // Microsecond precision is plenty for a log line.
    let ms = (elapsed.as_secs_f64() * 1e6).round() / 1e3;
    let cause = failure.cause.as_str();
    match failure.severity {
        Severity::Info => tracing::info!(method, route, path, status, ms, cause, "request failed"),
        Severity::Warn => tracing::warn!(method, route, path, status, ms, cause, "request failed"),
        Severity::Error => {
            tracing::error!(method, route, path, status, ms, cause, "request failed")
        }
    }
    response
}

/// A bounded method label: custom methods would make the label set unbounded.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// What [`guard`] checks (one middleware for both: each layer costs a
/// service clone and a boxed future per request).
#[derive(Debug, Clone)]
struct Guard {
    /// Required as `Authorization: Bearer <token>` when configured.
    token: Option<ApiToken>,
    /// See [`Limits::backstop`].
    backstop: Duration,
    /// Added to the backstop of lock requests, which may wait this long.
    lock_wait: Duration,
}

/// The bearer token check, then the request under the backstop timeout.
async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    if let Some(token) = &guard.token {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| bearer_token(value.as_bytes()))
            .map(Cow::Borrowed)
            .or_else(|| query_token(&request).map(Cow::Owned));
        if !presented.is_some_and(|presented| token.matches(&presented)) {
            return ApiError::Unauthorized.into_response();
        }
    }
    let backstop = if request.uri().path().starts_with(locks::LOCKS_PREFIX) {
        guard.backstop + guard.lock_wait
    } else {
        guard.backstop
    };
    match tokio::time::timeout(backstop, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::HandlerTimeout(backstop).into_response(),
    }
}

/// The `access_token` query parameter (RFC 6750, section 2.3) of a watch
/// request: a browser's `EventSource` cannot send an `Authorization`
/// header, so a dashboard on a gateway with a token has no other way.
/// Only watch streams take it; the gateway logs paths, never queries.
fn query_token(request: &Request) -> Option<Vec<u8>> {
    if request.method() != Method::GET || !watch::is_watch_path(request.uri().path()) {
        return None;
    }
    let value = request.uri().query()?.split('&').find_map(|pair| {
        pair.strip_prefix(watch::ACCESS_TOKEN_PARAMETER)?
            .strip_prefix('=')
    })?;
    // Form encoding, as RFC 6750 says (and as the watch `key`s are).
    let decoded = keys::form_decode(value.as_bytes(), true);
    (!decoded.is_empty()).then_some(decoded)
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

/// Everything `serve` needs, validated (see `ServeArgs::settings`).
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Key API listener (port 0: any free port).
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// The pool.
    pub pool: PoolSettings,
    /// Request limits.
    pub limits: Limits,
    /// Bearer token for the key API.
    pub api_token: Option<ApiToken>,
    /// How long in-flight requests may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Watch limits and keep-alive.
    pub watch: WatchSettings,
    /// Lock request limits.
    pub locks: LockSettings,
    /// Origins allowed to call the API from a browser (CORS); empty: none.
    pub cors_allow_origins: Vec<String>,
    /// How long a client may take to send a request's headers; also how
    /// long an idle keep-alive connection stays open (both listeners).
    pub header_read_timeout: Duration,
    /// Open connections on the API listener before it stops accepting.
    pub max_connections: usize,
}

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A listener could not bind.
    #[error("cannot listen on {addr} ({setting}): {source}")]
    Bind {
        /// The flag naming the address.
        setting: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The pool refused its settings (TLS material, the SAT file, ...);
    /// the message names the setting.
    #[error("{0}")]
    Pool(#[from] ConfigError),
    /// A listener failed while serving.
    #[error("the {listener} listener failed: {source}")]
    Serve {
        /// `api` or `admin`.
        listener: &'static str,
        /// Why.
        source: io::Error,
    },
}

/// A running gateway: both listeners and the pool.
#[derive(Debug)]
pub struct Server {
    api_addr: SocketAddr,
    admin_addr: SocketAddr,
    state: AppState,
    grace: Duration,
    stop_api: signal::Sender<bool>,
    stop_admin: signal::Sender<bool>,
    api_task: JoinHandle<io::Result<()>>,
    admin_task: JoinHandle<io::Result<()>>,
}

impl Server {
    /// Binds both listeners, starts the pool and serves; returns at once
    /// (the pool connects in the background; `/readyz` says when it is up).
    pub async fn start(settings: ServeSettings, metrics: Metrics) -> Result<Server, ServeError> {
        let api_listener = bind("--listen", settings.listen).await?;
        let admin_listener = bind("--admin-listen", settings.admin_listen).await?;
        let api_addr = local_addr("--listen", settings.listen, &api_listener)?;
        let admin_addr = local_addr("--admin-listen", settings.admin_listen, &admin_listener)?;
        let pool = Pool::start(settings.pool, metrics.clone())?;
        let state = AppState::new(
            pool,
            metrics,
            settings.limits,
            settings.api_token,
            settings.watch,
            settings.locks,
        );
        let api = cors(router(state.clone()), &settings.cors_allow_origins);
        let limits = ConnectionLimits {
            header_read_timeout: settings.header_read_timeout,
            max_header_bytes: listener::MAX_HEADER_BYTES,
            max_connections: settings.max_connections,
        };
        // Probes and scrapes need few connections; a flood on the API
        // listener cannot take them.
        let admin_limits = ConnectionLimits {
            max_connections: ADMIN_MAX_CONNECTIONS,
            ..limits
        };
        let (stop_api, api_stopped) = signal::channel(false);
        let (stop_admin, admin_stopped) = signal::channel(false);
        let api_task = tokio::spawn(listener::serve(
            api_listener,
            api,
            limits,
            stopped(api_stopped),
        ));
        let admin_task = tokio::spawn(listener::serve(
            admin_listener,
            admin::router(state.clone()),
            admin_limits,
            stopped(admin_stopped),
        ));
        tracing::info!(%api_addr, %admin_addr, "gateway listening");
        Ok(Server {
            api_addr,
            admin_addr,
            state,
            grace: settings.shutdown_grace,
            stop_api,
            stop_admin,
            api_task,
            admin_task,
        })
    }

    /// Where the key API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// Where the admin endpoints listen.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The shared state (pool, metrics), e.g. for the watch hub or tests.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Graceful shutdown: `/readyz` turns 503, the key listener stops
    /// accepting and in-flight requests get the grace period to finish
    /// (then their connections are dropped), the pool disconnects cleanly,
    /// and the admin listener stops last.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let Server {
            state,
            grace,
            stop_api,
            stop_admin,
            mut api_task,
            mut admin_task,
            ..
        } = self;
        state.draining.store(true, Ordering::Release);
        // SSE streams never end by themselves: end them so the drain can finish.
        state.hub.shutdown();
        let _ = stop_api.send(true);
        let api_result = match tokio::time::timeout(grace, &mut api_task).await {
            Ok(joined) => flatten("api", joined),
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "requests still in flight after the shutdown grace period; closing them"
                );
                api_task.abort();
                Ok(())
            }
        };
        state.store.pool().shutdown().await;
        let _ = stop_admin.send(true);
        let admin_result = match tokio::time::timeout(Duration::from_secs(1), &mut admin_task).await
        {
            Ok(joined) => flatten("admin", joined),
            Err(_) => {
                admin_task.abort();
                Ok(())
            }
        };
        tracing::info!("gateway stopped");
        api_result.and(admin_result)
    }

    /// Serves until `signal` resolves, then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), ServeError> {
        signal.await;
        tracing::info!("shutdown requested");
        self.shutdown().await
    }
}

/// Lets browsers on the configured origins call the API and read its
/// versions; `*` allows any origin (never with credentials).
fn cors(router: Router, origins: &[String]) -> Router {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return router;
    }
    let allow_origin = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|origin| HeaderValue::from_str(origin).ok()),
        )
    };
    let layer = CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::HEAD, Method::PUT, Method::DELETE])
        .allow_headers([
            header::CONTENT_TYPE,
            header::IF_NONE_MATCH,
            header::AUTHORIZATION,
            HeaderName::from_static(keys::FENCING_TOKEN_HEADER),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([header::ETAG, header::RETRY_AFTER])
        .max_age(Duration::from_secs(600));
    router.layer(layer)
}

async fn bind(setting: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            setting,
            addr,
            source,
        })
}

fn local_addr(
    setting: &'static str,
    addr: SocketAddr,
    listener: &TcpListener,
) -> Result<SocketAddr, ServeError> {
    listener.local_addr().map_err(|source| ServeError::Bind {
        setting,
        addr,
        source,
    })
}

async fn stopped(mut receiver: signal::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = receiver.wait_for(|stop| *stop).await;
}

fn flatten(
    listener: &'static str,
    joined: Result<io::Result<()>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(ServeError::Serve { listener, source }),
        Err(error) => Err(ServeError::Serve {
            listener,
            source: io::Error::other(error.to_string()),
        }),
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the gateway");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mqtt::BrokerSettings;
    use axum::body::Body;
    use axum::http::{HeaderValue, StatusCode};
    use tower::ServiceExt;

    /// State over a pool pointed at a port nothing listens on: every store
    /// request fails as unavailable, which is what these tests need.
    fn state(api_token: Option<ApiToken>) -> AppState {
        let settings = PoolSettings {
            broker: BrokerSettings {
                keep_alive: Duration::from_secs(60),
                session_expiry: Duration::from_secs(60),
                ..BrokerSettings::new("127.0.0.1", 9)
            },
            sat_check_interval: Duration::from_secs(5),
            client_id: "http-unit".into(),
            size: 1,
            request_timeout: Duration::from_millis(200),
            max_in_flight_per_member: 4,
            slot_wait: Duration::from_millis(50),
        };
        let metrics = Metrics::new();
        let pool = Pool::start(settings, metrics.clone()).unwrap();
        let limits = Limits {
            max_key_bytes: 8,
            max_value_bytes: Some(16),
            request_timeout: Duration::from_millis(200),
        };
        AppState::new(
            pool,
            metrics,
            limits,
            api_token,
            WatchSettings::default(),
            LockSettings::default(),
        )
    }

    async fn send(
        state: &AppState,
        request: axum::http::Request<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
        let response = router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        (status, headers, json)
    }

    fn request(method: &str, uri: &str) -> axum::http::Request<Body> {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn bad_requests_are_refused_before_the_store_is_asked() {
        let state = state(None);
        for (method, uri, status, kind) in [
            ("GET", "/keys/", 400, "/problems/empty-key"),
            ("PUT", "/keys/", 400, "/problems/empty-key"),
            ("GET", "/keys/%zz", 400, "/problems/bad-percent-encoding"),
            ("GET", "/keys/%4", 400, "/problems/bad-percent-encoding"),
            ("GET", "/keys/123456789", 414, "/problems/key-too-long"),
            ("PUT", "/keys/k?ttl=soon", 400, "/problems/invalid-ttl"),
            ("PUT", "/keys/k?ttl=0", 400, "/problems/invalid-ttl"),
            ("PUT", "/keys/k?tll=1s", 400, "/problems/invalid-query"),
            ("GET", "/keys/k?x=1", 400, "/problems/invalid-query"),
            (
                "DELETE",
                "/keys/k?value=%zz",
                400,
                "/problems/bad-percent-encoding",
            ),
            ("GET", "/nothing", 404, "/problems/not-found"),
        ] {
            let (got, headers, body) = send(&state, request(method, uri)).await;
            assert_eq!(got.as_u16(), status, "{method} {uri}: {body}");
            assert_eq!(body["type"], kind, "{method} {uri}");
            assert_eq!(body["status"], status);
            assert_eq!(headers[header::CONTENT_TYPE], problem::PROBLEM_JSON);
        }
    }

    #[tokio::test]
    async fn other_methods_get_405_with_allow() {
        let state = state(None);
        let (status, headers, body) = send(&state, request("POST", "/keys/k")).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let allow = headers[header::ALLOW].to_str().unwrap();
        for method in ["GET", "HEAD", "PUT", "DELETE"] {
            assert!(allow.contains(method), "{allow}");
        }
        assert_eq!(body["type"], "/problems/method-not-allowed");
    }

    #[tokio::test]
    async fn conflicting_and_unsupported_conditions_are_400() {
        let state = state(None);
        let with = |method: &str, uri: &str, name: &'static str, value: &'static str| {
            let mut request = request(method, uri);
            request
                .headers_mut()
                .insert(name, HeaderValue::from_static(value));
            request
        };
        for request in [
            with("PUT", "/keys/k?nex=true", "if-none-match", "*"),
            with("PUT", "/keys/k", "if-none-match", "\"abc\""),
            with("PUT", "/keys/k", "if-match", "*"),
            with("DELETE", "/keys/k", "if-none-match", "*"),
            with("PUT", "/keys/k", "fencing-token", "nonsense"),
            with("PUT", "/keys/k", "fencing-token", "99999999999999:0:x"),
        ] {
            let (status, _, body) = send(&state, request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        }
    }

    #[tokio::test]
    async fn oversized_body_is_413_problem_json() {
        let state = state(None);
        let request = axum::http::Request::builder()
            .method("PUT")
            .uri("/keys/k")
            .body(Body::from(vec![0u8; 17]))
            .unwrap();
        let (status, headers, body) = send(&state, request).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(headers[header::CONTENT_TYPE], problem::PROBLEM_JSON);
        assert_eq!(body["type"], "/problems/value-too-large");
    }

    #[tokio::test]
    async fn no_broker_is_503_with_retry_after() {
        let state = state(None);
        let (status, headers, body) = send(&state, request("GET", "/keys/k")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(headers[header::RETRY_AFTER], "1");
    }

    #[tokio::test]
    async fn api_token_is_required_when_configured() {
        let state = state(Some(ApiToken::new(b"t0ken".to_vec())));
        let (status, headers, body) = send(&state, request("GET", "/keys/")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .starts_with("Bearer")
        );
        assert_eq!(body["type"], "/problems/unauthorized");
        let mut wrong = request("GET", "/keys/");
        wrong.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t0kem"),
        );
        assert_eq!(send(&state, wrong).await.0, StatusCode::UNAUTHORIZED);
        let mut right = request("GET", "/keys/");
        right.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t0ken"),
        );
        assert_eq!(send(&state, right).await.0, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn watch_streams_may_carry_the_token_as_access_token() {
        let state = state(Some(ApiToken::new(b"t0/k en".to_vec())));
        // Past the guard: the store is unreachable here, so 503.
        for uri in [
            "/watch/k?access_token=t0%2Fk%20en",
            "/watch/k?access_token=t0%2Fk+en",
            "/watch?key=k&access_token=t0%2Fk%20en",
        ] {
            let (status, _, body) = send(&state, request("GET", uri)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{uri}: {body}");
        }
        for (method, uri) in [
            ("GET", "/watch/k?access_token=t0%2Fk%20em"),
            ("GET", "/watch/k?access_token="),
            ("GET", "/watch/k?token=t0%2Fk%20en"),
            // Only watch streams: everything else can send the header.
            ("GET", "/keys/k?access_token=t0%2Fk%20en"),
            ("PUT", "/keys/k?access_token=t0%2Fk%20en"),
            ("GET", "/watchers?access_token=t0%2Fk%20en"),
        ] {
            let (status, _, body) = send(&state, request(method, uri)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {uri}: {body}");
        }
    }

    #[tokio::test]
    async fn requests_are_counted_by_route_template() {
        let state = state(None);
        send(&state, request("GET", "/keys/%zz")).await;
        send(&state, request("BREW", "/keys/a")).await;
        send(&state, request("GET", "/elsewhere")).await;
        let text = state.metrics.render();
        for line in [
            r#"http_requests_total{method="GET",route="/keys/{*key}",status="400"} 1"#,
            r#"http_requests_total{method="OTHER",route="/keys/{*key}",status="405"} 1"#,
            r#"http_requests_total{method="GET",route="unmatched",status="404"} 1"#,
            r#"http_request_duration_seconds_count{method="GET",route="/keys/{*key}"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

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

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "OTHER");
    }
}
