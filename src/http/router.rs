//! The key API's router and its middleware: request metrics and failure
//! logs, the token check and backstop, CORS.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tracing::Instrument as _;

use super::api::{batch, extract, keys, listing, locks, openapi, subscribe, watch};
use super::dapr;
use super::guard::{Guard, guard};
use super::problem::{ApiError, FailureLog, Severity};
use super::state::AppState;
use crate::metrics::Metrics;
use crate::trace::{self, TraceContext};

/// The key API (everything but the admin endpoints), with its middleware:
/// request metrics and failure logs outermost, then the bearer token check,
/// then a backstop timeout.
pub fn router(state: AppState) -> Router {
    let backstop = state.backstop();
    api_routes(&state)
        .fallback(route_not_found)
        .layer(from_fn_with_state(
            // Cloned for every request: one reference count, not one per field.
            Arc::new(Guard {
                callers: state.callers.clone(),
                metrics: state.metrics.clone(),
                backstop,
                lock_wait: state.locks.settings().max_wait,
            }),
            guard,
        ))
        // The dashboard's static files are public; the API calls it makes
        // are not (it asks for the token; its stream sends it as
        // `access_token`, see `query_token`).
        .merge(crate::ui::router())
        .merge(dapr::health_routes())
        .layer(from_fn_with_state(state.metrics.clone(), observe))
        // Bodies are read by the handlers against the value limit.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// The API's routes; the watch routes merge in here.
fn api_routes(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(dapr::routes(state))
        .merge(keys::routes())
        .merge(batch::routes())
        .merge(listing::routes())
        .merge(watch::routes())
        .merge(subscribe::routes())
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
/// runs it in the caller's trace context or, with span export, under its
/// server span (its log lines in a span with `trace_id` and `span_id`), and writes one log line per failure with the cause the error left in
/// the response; an answer given before the request's body was read says
/// so ([`BodyWatch`]).
async fn observe(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    // Both cheap to clone (shared buffers): no allocation per request.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let uri = request.uri().clone();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let path = log_path(uri.path());
    let method = method_label(request.method());
    let (request, body_watch) = BodyWatch::start(request);
    let started = Instant::now();
    // The caller's trace context goes on to every store request this one
    // causes; without a `traceparent` nothing is allocated. With span
    // export, the server span's context goes on instead (when sampled).
    let incoming = TraceContext::from_headers(request.headers());
    let server = trace::Span::server(
        incoming.as_ref(),
        method,
        matched.as_ref().map(MatchedPath::as_str),
    );
    let context = server
        .as_ref()
        .map(|span| span.context().clone())
        .or(incoming);
    let (mut response, span) = match context {
        None => (next.run(request).await, tracing::Span::none()),
        Some(context) => traced(context, next.run(request)).await,
    };
    let _in_span = span.enter();
    body_watch.finish(&mut response);
    let elapsed = started.elapsed();
    let status = response.status();
    // A watch's span ends here, once its stream is set up.
    if let Some(server) = server {
        server.end_http(status.as_u16());
    }
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

/// Runs `response` in the caller's trace `context` and in a log span
/// carrying its ids; returns the span for the request's last log lines.
/// Boxed so that untraced requests do not carry its state.
fn traced(
    context: TraceContext,
    response: impl Future<Output = Response> + Send + 'static,
) -> Pin<Box<dyn Future<Output = (Response, tracing::Span)> + Send>> {
    let span = context.log_span();
    Box::pin(async move {
        let response = trace::scope(Some(context), response)
            .instrument(span.clone())
            .await;
        (response, span)
    })
}

/// Whether a request's body was read to its end before the answer: if not,
/// the answer says `Connection: close` (RFC 9112 9.6), since hyper does not
/// read a large unread remainder but closes, and a client that sent it all
/// would reuse the dead connection.
struct BodyWatch(Option<Arc<AtomicBool>>);

impl BodyWatch {
    /// Watches the body, if the request has one (GETs and DELETEs pay nothing).
    fn start(request: Request) -> (Request, Self) {
        if request.body().is_end_stream() {
            return (request, Self(None));
        }
        let flag = Arc::new(AtomicBool::new(false));
        let request = request.map(|inner| {
            Body::new(ReadToEnd {
                inner,
                flag: flag.clone(),
            })
        });
        (request, Self(Some(flag)))
    }

    fn finish(self, response: &mut Response) {
        if self.0.is_some_and(|flag| !flag.load(Ordering::Acquire)) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

/// [`BodyWatch`] as a middleware, for routers without the API's `observe`
/// (the admission webhook).
pub async fn close_unless_body_read(request: Request, next: Next) -> Response {
    let (request, body_watch) = BodyWatch::start(request);
    let mut response = next.run(request).await;
    body_watch.finish(&mut response);
    response
}

/// How a body read whole before the handler must arrive: see
/// [`read_body_first`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyReadLimits {
    /// The largest body (413 above it).
    pub max_bytes: usize,
    /// How long the whole body may take to arrive (408 after it).
    pub timeout: Duration,
}

/// Reads the request body whole ([`extract::read_body`], as the key API's
/// PUT does) before the handler runs, for routes whose handlers read their
/// body with an extractor that has no deadline: a client that sends its
/// body too slowly gets 408 instead of holding its connection. Put it
/// inside [`close_unless_body_read`], so that such an answer closes the
/// connection.
pub async fn read_body_first(
    State(limits): State<BodyReadLimits>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, mut body) = request.into_parts();
    let started = Instant::now();
    // Read up to the limit even when Content-Length is over it, then up
    // to as much again (dropped) within the deadline: a client answered
    // while it is still writing its body fails on the write (the socket is
    // reset) and never sees the 413.
    match extract::read_body(&mut body, None, limits.max_bytes, limits.timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(error @ ApiError::ValueTooLarge { .. }) => {
            let left = limits.timeout.saturating_sub(started.elapsed());
            let _ = tokio::time::timeout(left, discard(&mut body, limits.max_bytes)).await;
            // What is left of the body, if anything, is not read.
            let mut response = error.into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
        Err(error) => error.into_response(),
    }
}

/// Reads and drops up to `at_most` more bytes of `body`.
async fn discard(body: &mut Body, at_most: usize) {
    let mut dropped = 0;
    while dropped <= at_most {
        match body.frame().await {
            Some(Ok(frame)) => dropped += frame.data_ref().map_or(0, Bytes::len),
            Some(Err(_)) | None => return,
        }
    }
}

/// A request body that raises its flag once read to its end.
struct ReadToEnd {
    inner: Body,
    flag: Arc<AtomicBool>,
}

impl http_body::Body for ReadToEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.flag.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
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

/// Lets browsers on the configured origins call the API and read its
/// versions; `*` allows any origin (never with credentials).
pub(super) fn cors(router: Router, origins: &[String]) -> Router {
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
        .allow_methods([
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::DELETE,
            Method::POST,
        ])
        .allow_headers([
            header::CONTENT_TYPE,
            header::IF_NONE_MATCH,
            header::AUTHORIZATION,
            HeaderName::from_static(extract::FENCING_TOKEN_HEADER),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([header::ETAG, header::RETRY_AFTER])
        .max_age(Duration::from_secs(600));
    router.layer(layer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{ApiToken, CallerChecks};
    use crate::http::Limits;
    use crate::http::problem;
    use crate::locks::LockSettings;
    use crate::mqtt::{BrokerSettings, Pool, PoolSettings};
    use crate::watch::WatchSettings;
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
            ..Limits::default()
        };
        AppState::new(
            pool,
            metrics,
            limits,
            CallerChecks {
                api_token,
                ..CallerChecks::default()
            },
            WatchSettings::default(),
            LockSettings::default(),
            crate::dapr::DaprSettings::default(),
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
    async fn watch_and_topic_streams_may_carry_the_token_as_access_token() {
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
        // Past the guard to the filter check (a stream would not end here).
        let uri = "/subscribe?topic=a%23&access_token=t0%2Fk%20en";
        let (status, _, body) = send(&state, request("GET", uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("MQTT topic filter"),
            "{body}"
        );
        for (method, uri) in [
            ("GET", "/watch/k?access_token=t0%2Fk%20em"),
            ("GET", "/watch/k?access_token="),
            ("GET", "/watch/k?token=t0%2Fk%20en"),
            // Only watch streams: everything else can send the header.
            ("GET", "/keys/k?access_token=t0%2Fk%20en"),
            ("PUT", "/keys/k?access_token=t0%2Fk%20en"),
            ("GET", "/watchers?access_token=t0%2Fk%20en"),
            ("GET", "/subscribe?topic=a&access_token=t0%2Fk%20em"),
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
    fn method_labels_are_bounded() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "OTHER");
    }
}
