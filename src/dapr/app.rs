//! The app channel, as daprd's: how the gateway reaches the app it serves
//! (`--dapr-app-port`, `--dapr-app-protocol`) to deliver pub/sub events,
//! ask for its subscriptions and tell it of configuration changes.
//!
//! - [`AppChannel::wait_until_listening`]: daprd's wait for the app's port
//!   after it starts (a TCP dial every 100 ms, each bounded by 500 ms,
//!   until the app listens), logged when it starts, every 30 s while the
//!   app is not there, and when the app is found.
//! - HTTP apps: [`AppChannel::get`] and [`AppChannel::post`] send one
//!   request over HTTP/1.1 (keep-alive connections, hyper-util's pooled
//!   client) and read the whole answer, bounded in size and in time.
//! - gRPC apps: [`AppChannel::grpc`] is a channel for tonic's generated
//!   clients (Dapr's `AppCallback`, built on it where the protos live),
//!   over HTTP/2 without TLS (h2c, as daprd's `grpc` app protocol); each
//!   call's time is bounded by the caller with [`AppChannel::call_timeout`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use thiserror::Error;
use tokio::net::TcpStream;

use super::settings::{AppProtocol, AppSettings};

/// How often the wait for the app's port dials it (daprd: 100 ms).
const DIAL_INTERVAL: Duration = Duration::from_millis(100);
/// How long one dial of the app's port may take (daprd: 500 ms).
const DIAL_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the wait says it is still waiting.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The gRPC channel tonic's clients call the app over (h2c).
pub type GrpcChannel = Client<HttpConnector, tonic::body::Body>;

/// A call to the app that got no answer.
#[derive(Debug, Error)]
pub enum AppError {
    /// The request could not be sent, or the answer not read.
    #[error("the app at {address} did not answer: {message}")]
    Unreachable {
        /// `127.0.0.1:<port>`.
        address: String,
        /// What failed.
        message: String,
    },
    /// No whole answer within the call timeout.
    #[error("the app at {address} gave no answer within {timeout:?}")]
    Timeout {
        /// `127.0.0.1:<port>`.
        address: String,
        /// The call timeout.
        timeout: Duration,
    },
    /// The answer's body was larger than the channel takes.
    #[error("the app at {address} answered more than {limit} bytes")]
    TooLarge {
        /// `127.0.0.1:<port>`.
        address: String,
        /// The largest body taken.
        limit: usize,
    },
}

/// The app's answer to an HTTP call: its status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppResponse {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The whole body.
    pub body: Bytes,
}

/// The channel to the app: cheap to clone (the clients share their
/// connection pools).
#[derive(Debug, Clone)]
pub struct AppChannel {
    settings: AppSettings,
    address: String,
    origin: Uri,
    http: Client<HttpConnector, Full<Bytes>>,
    grpc: GrpcChannel,
    max_body_bytes: usize,
}

impl AppChannel {
    /// The channel to the app `settings` name; answers larger than
    /// `max_body_bytes` are refused (daprd's `--max-body-size`).
    pub fn new(settings: AppSettings, max_body_bytes: usize) -> Self {
        let address = format!("127.0.0.1:{}", settings.port);
        let origin = Uri::builder()
            .scheme("http")
            .authority(address.as_str())
            .path_and_query("/")
            .build()
            .unwrap_or_else(|_| Uri::from_static("http://127.0.0.1/"));
        let connector = || {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(settings.call_timeout));
            connector
        };
        let http = Client::builder(TokioExecutor::new()).build(connector());
        let grpc = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector());
        Self {
            settings,
            address,
            origin,
            http,
            grpc,
            max_body_bytes,
        }
    }

    /// How the app is called.
    pub fn protocol(&self) -> AppProtocol {
        self.settings.protocol
    }

    /// The app's port.
    pub fn port(&self) -> u16 {
        self.settings.port
    }

    /// How long one call may take.
    pub fn call_timeout(&self) -> Duration {
        self.settings.call_timeout
    }

    /// The origin gRPC clients send their calls to (`http://127.0.0.1:<port>/`).
    pub fn origin(&self) -> Uri {
        self.origin.clone()
    }

    /// A channel for tonic's generated clients (`AppCallbackClient::with_origin(channel.grpc(), channel.origin())`).
    pub fn grpc(&self) -> GrpcChannel {
        self.grpc.clone()
    }

    /// Returns once the app listens on its port, as daprd blocks until it
    /// does; never gives up (drop the future to stop waiting).
    pub async fn wait_until_listening(&self) {
        tracing::info!(
            protocol = self.settings.protocol.as_str(),
            port = self.settings.port,
            "waiting for the app on its port"
        );
        let started = Instant::now();
        let mut next_log = started + WAIT_LOG_INTERVAL;
        loop {
            if let Ok(Ok(_)) =
                tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(&self.address)).await
            {
                tracing::info!(
                    port = self.settings.port,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "the app listens on its port"
                );
                return;
            }
            if Instant::now() >= next_log {
                tracing::warn!(
                    port = self.settings.port,
                    waited_s = started.elapsed().as_secs(),
                    "still waiting for the app on its port"
                );
                next_log += WAIT_LOG_INTERVAL;
            }
            tokio::time::sleep(DIAL_INTERVAL).await;
        }
    }

    /// `GET /<path>` on the app (`dapr/subscribe`).
    pub async fn get(&self, path: &str) -> Result<AppResponse, AppError> {
        self.send(Method::GET, path, HeaderMap::new(), Bytes::new())
            .await
    }

    /// `POST /<path>` of `body` as `content_type`, with `headers` beside.
    pub async fn post(
        &self,
        path: &str,
        content_type: &str,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<AppResponse, AppError> {
        if let Ok(value) = HeaderValue::from_str(content_type) {
            headers.insert(CONTENT_TYPE, value);
        }
        self.send(Method::POST, path, headers, body).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<AppResponse, AppError> {
        let uri = format!("http://{}/{}", self.address, path.trim_start_matches('/'));
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(body))
            .map_err(|error| self.unreachable(error))?;
        request.headers_mut().extend(headers);
        let timeout = self.settings.call_timeout;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|error| self.unreachable(error))?;
            let (parts, body) = response.into_parts();
            if http_body::Body::size_hint(&body).lower() > self.max_body_bytes as u64 {
                return Err(AppError::TooLarge {
                    address: self.address.clone(),
                    limit: self.max_body_bytes,
                });
            }
            let body = Limited::new(body, self.max_body_bytes)
                .collect()
                .await
                .map_err(|error| {
                    if error.is::<http_body_util::LengthLimitError>() {
                        AppError::TooLarge {
                            address: self.address.clone(),
                            limit: self.max_body_bytes,
                        }
                    } else {
                        self.unreachable(error)
                    }
                })?
                .to_bytes();
            Ok(AppResponse {
                status: parts.status,
                content_type: parts
                    .headers
                    .get(CONTENT_TYPE)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned),
                body,
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(AppError::Timeout {
                    address: self.address.clone(),
                    timeout,
                })
            })
    }

    fn unreachable(&self, error: impl std::fmt::Display) -> AppError {
        AppError::Unreachable {
            address: self.address.clone(),
            message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// A one-shot HTTP/1.1 server on a free port: reads one request, gives
    /// it to the test, answers `answer`.
    async fn one_answer(answer: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Headers, then the body its Content-Length announces.
            loop {
                let n = socket.read(&mut buffer).await.unwrap();
                request.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length: "))
                        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            socket.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (port, task)
    }

    fn channel(port: u16, timeout: Duration) -> AppChannel {
        let mut settings = AppSettings::new(port, AppProtocol::Http);
        settings.call_timeout = timeout;
        AppChannel::new(settings, 1024)
    }

    #[tokio::test]
    async fn a_post_sends_the_body_its_type_and_headers_and_reads_the_answer() {
        let (port, server) = one_answer(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n{\"status\":\"SUCCESS\"}",
        )
        .await;
        let mut headers = HeaderMap::new();
        headers.insert("pubsubname", HeaderValue::from_static("pubsub"));
        let answer = channel(port, Duration::from_secs(5))
            .post(
                "/orders",
                "application/cloudevents+json",
                headers,
                Bytes::from_static(b"{\"id\":\"1\"}"),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.content_type.as_deref(), Some("application/json"));
        assert_eq!(&answer.body[..], b"{\"status\":\"SUCCESS\"}");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /orders HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("content-type: application/cloudevents+json\r\n"));
        assert!(request.contains("pubsubname: pubsub\r\n"));
        assert!(request.ends_with("{\"id\":\"1\"}"));
    }

    #[tokio::test]
    async fn an_app_that_never_answers_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and holds the connection without answering.
        let _held = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(socket);
        });
        let error = channel(port, Duration::from_millis(200))
            .get("dapr/subscribe")
            .await
            .unwrap_err();
        assert!(matches!(error, AppError::Timeout { .. }), "{error}");
    }

    #[tokio::test]
    async fn an_answer_larger_than_the_limit_is_refused() {
        // Announced (Content-Length) and not announced (chunked).
        let (port, _server) = one_answer("HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n").await;
        let error = channel(port, Duration::from_secs(5))
            .get("dapr/subscribe")
            .await
            .unwrap_err();
        assert!(
            matches!(error, AppError::TooLarge { limit: 1024, .. }),
            "{error}"
        );
        let chunked: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7d0\r\n{}\r\n0\r\n\r\n",
                "x".repeat(2000)
            )
            .into_boxed_str(),
        );
        let (port, _server) = one_answer(chunked).await;
        let error = channel(port, Duration::from_secs(5))
            .get("dapr/subscribe")
            .await
            .unwrap_err();
        assert!(
            matches!(error, AppError::TooLarge { limit: 1024, .. }),
            "{error}"
        );
    }

    #[tokio::test]
    async fn no_app_is_unreachable_and_the_wait_ends_when_it_listens() {
        // A port nobody listens on (bound, then freed).
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let app = channel(port, Duration::from_secs(5));
        let error = app.get("dapr/subscribe").await.unwrap_err();
        assert!(matches!(error, AppError::Unreachable { .. }), "{error}");
        let waiting = tokio::spawn({
            let app = app.clone();
            async move { app.wait_until_listening().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished());
        let _listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends once the app listens")
            .unwrap();
    }
}
