//! The gateway in-process on port-0 listeners (the real HTTP server over
//! TCP), and a whole stack: mosquitto + emulator (or a scripted store) +
//! gateway.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, percent_encode};
use statestore_gateway::access::ApiToken;
use statestore_gateway::access::jwt::JwtSettings;
use statestore_gateway::access::rules::AuthzSettings;
use statestore_gateway::dapr::DaprSettings;
use statestore_gateway::emulator::{Emulator, EmulatorConfig};
use statestore_gateway::http::transport::tls::CertificateFiles;
use statestore_gateway::http::{Limits, ServeSettings, Server};
use statestore_gateway::locks::LockSettings;
use statestore_gateway::metrics::Metrics;
use statestore_gateway::mqtt::{BrokerSettings, PoolSettings};
use statestore_gateway::watch::WatchSettings;

use super::mosquitto::MosquittoConfig;
use super::scripted_store::{Script, ScriptedStore};
use super::{Mosquitto, init_logging};

/// What the tests vary about a gateway.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Pool members.
    pub pool_size: usize,
    /// Store request timeout.
    pub request_timeout: Duration,
    /// `--max-key-bytes`
    pub max_key_bytes: usize,
    /// `--max-value-bytes`
    pub max_value_bytes: Option<usize>,
    /// `--api-token-file` contents.
    pub api_token: Option<String>,
    /// JWTs accepted (`--jwt-*`); see `support::tokens`.
    pub jwt: Option<JwtSettings>,
    /// `--shutdown-grace`
    pub shutdown_grace: Duration,
    /// Client id prefix of the pool members.
    pub client_id: String,
    /// Watch limits.
    pub watch: WatchSettings,
    /// `--cors-allow-origin`
    pub cors_allow_origins: Vec<String>,
    /// `--max-connections`
    pub max_connections: usize,
    /// Lock request limits.
    pub locks: LockSettings,
    /// `--max-in-flight`
    pub max_in_flight: usize,
    /// `--max-batch-ops`
    pub max_batch_ops: usize,
    /// `--max-batch-bytes`
    pub max_batch_bytes: usize,
    /// `--dapr-max-body-size`
    pub dapr_max_body_size: usize,
    /// `--api-tls-cert-file` and `--api-tls-key-file`
    pub api_tls: Option<(PathBuf, PathBuf)>,
    /// `--header-read-timeout`
    pub header_read_timeout: Duration,
    /// `--authz-file`, and how often it is read again.
    pub authz: Option<AuthzSettings>,
    /// Dapr's API: store names, key prefix, etag leases.
    pub dapr: DaprSettings,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            pool_size: 2,
            request_timeout: Duration::from_secs(5),
            max_key_bytes: 1024,
            max_value_bytes: None,
            api_token: None,
            jwt: None,
            shutdown_grace: Duration::from_secs(5),
            client_id: format!("gw-{:08x}", rand::random::<u32>()),
            watch: WatchSettings::default(),
            cors_allow_origins: Vec::new(),
            max_connections: 20_000,
            locks: LockSettings::default(),
            max_in_flight: statestore_gateway::settings::DEFAULT_MAX_IN_FLIGHT,
            max_batch_ops: statestore_gateway::settings::DEFAULT_MAX_BATCH_OPS,
            max_batch_bytes: statestore_gateway::settings::DEFAULT_MAX_BATCH_BYTES,
            dapr_max_body_size: statestore_gateway::settings::DEFAULT_DAPR_MAX_BODY_SIZE,
            api_tls: None,
            header_read_timeout: statestore_gateway::settings::DEFAULT_HEADER_READ_TIMEOUT,
            authz: None,
            dapr: DaprSettings::default(),
        }
    }
}

/// A running gateway and an HTTP client for it.
#[derive(Debug)]
pub struct Gateway {
    server: Option<Server>,
    /// Key API address.
    pub api: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    /// A client with a timeout, so no test waits forever.
    pub http: reqwest::Client,
    /// Its metrics.
    pub metrics: Metrics,
}

/// A client that never hangs a test and ignores proxy settings. Each wait
/// is bounded rather than the whole request: a watch stream outlives any
/// one wait, and a total timeout would end it mid-test on a busy machine.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .expect("http client")
}

/// Percent-encodes every byte but ASCII letters and digits.
pub fn encode(bytes: &[u8]) -> String {
    percent_encode(bytes, NON_ALPHANUMERIC).to_string()
}

impl Gateway {
    /// Starts a gateway against the broker at `broker_port` (plain TCP).
    pub async fn start(broker_port: u16, options: GatewayOptions) -> Gateway {
        init_logging();
        let broker = BrokerSettings {
            keep_alive: Duration::from_secs(30),
            session_expiry: Duration::from_secs(60),
            ..BrokerSettings::new("127.0.0.1", broker_port)
        };
        let settings = ServeSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            pool: PoolSettings {
                size: options.pool_size,
                max_in_flight_per_member: options.max_in_flight,
                ..PoolSettings::new(broker, options.client_id.clone())
            },
            limits: Limits {
                max_key_bytes: options.max_key_bytes,
                max_value_bytes: options.max_value_bytes,
                max_batch_ops: options.max_batch_ops,
                max_batch_bytes: options.max_batch_bytes,
                dapr_max_body_size: options.dapr_max_body_size,
            },
            api_token: options
                .api_token
                .as_ref()
                .map(|token| ApiToken::new(token.as_bytes().to_vec())),
            jwt: options.jwt.clone(),
            shutdown_grace: options.shutdown_grace,
            watch: options.watch.clone(),
            cors_allow_origins: options.cors_allow_origins.clone(),
            max_connections: options.max_connections,
            locks: options.locks,
            authz: options.authz.clone(),
            api_tls: options
                .api_tls
                .as_ref()
                .map(|(cert, key)| CertificateFiles {
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                    cert_setting: &statestore_gateway::settings::API_TLS_CERT_FILE,
                    key_setting: &statestore_gateway::settings::API_TLS_KEY_FILE,
                }),
            header_read_timeout: options.header_read_timeout,
            dapr: options.dapr.clone(),
        }
        // Every timeout that follows the request timeout, as `serve` has them.
        .with_request_timeout(options.request_timeout);
        let metrics = Metrics::new();
        let server = Server::start(settings, metrics.clone())
            .await
            .expect("gateway starts");
        Gateway {
            api: server.api_addr(),
            admin: server.admin_addr(),
            server: Some(server),
            http: http_client(),
            metrics,
        }
    }

    /// The URL of a key, every byte but letters and digits percent-encoded.
    pub fn key(&self, key: &[u8]) -> String {
        format!("http://{}/keys/{}", self.api, encode(key))
    }

    /// A request on `/keys/{key}`, to give a query and headers before its
    /// method: `gw.at(b"k").query("nex=true").header("fencing-token", t).put("v")`.
    pub fn at(&self, key: &[u8]) -> KeyRequest<'_> {
        KeyRequest {
            gateway: self,
            url: self.key(key),
            headers: Vec::new(),
        }
    }

    /// `PUT /keys/{key}` with `value`.
    pub async fn put(&self, key: &[u8], value: impl Into<reqwest::Body>) -> reqwest::Response {
        self.at(key).put(value).await
    }

    /// `GET /keys/{key}`.
    pub async fn get(&self, key: &[u8]) -> reqwest::Response {
        self.at(key).get().await
    }

    /// `DELETE /keys/{key}`.
    pub async fn delete(&self, key: &[u8]) -> reqwest::Response {
        self.at(key).delete().await
    }

    /// `POST /batch` with `body` as JSON.
    pub async fn batch(&self, body: &serde_json::Value) -> reqwest::Response {
        self.http
            .post(self.url("/batch"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|error| panic!("POST /batch: {error}"))
    }

    /// A URL on the key API listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    /// The value of the metric sample `sample` (its name and any labels,
    /// exactly as exported), read from the gateway's registry; `None` if
    /// it has no such sample yet.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        self.metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// `/readyz`'s status.
    pub async fn readyz(&self) -> u16 {
        match self.http.get(self.admin_url("/readyz")).send().await {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        }
    }

    /// Waits until `/readyz` answers `status`.
    pub async fn wait_readyz(&self, status: u16, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let now = self.readyz().await;
            if now == status {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/readyz is {now}, not {status}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until a pool member is subscribed.
    pub async fn wait_ready(&self) {
        self.wait_readyz(200, Duration::from_secs(15)).await;
    }

    /// The running server (shared state, addresses).
    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("gateway is running")
    }

    /// Graceful shutdown, as on SIGTERM.
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(60), server.shutdown())
                .await
                .expect("shutdown finishes within the grace period")
                .expect("clean shutdown");
        }
    }
}

/// Broker, store and gateway, each on its own free port.
#[derive(Debug)]
pub struct Stack {
    /// The broker.
    pub broker: Mosquitto,
    /// The emulator, unless the store is scripted or was stopped.
    pub emulator: Option<Emulator>,
    /// How the emulator was started, to start it again.
    pub emulator_config: Option<EmulatorConfig>,
    /// A scripted store instead of the emulator.
    pub scripted: Option<ScriptedStore>,
    /// The gateway.
    pub gateway: Gateway,
}

impl Stack {
    /// Defaults everywhere: `Stack::builder().start()`.
    pub async fn start() -> Stack {
        Self::builder().start().await
    }

    /// The one way to start a stack with anything but the defaults:
    /// broker settings, the emulator's configuration (or a scripted store
    /// instead) and the gateway's options.
    pub fn builder() -> StackBuilder {
        StackBuilder::default()
    }

    /// Stops the emulator (the store goes silent; the broker stays up).
    pub async fn stop_emulator(&mut self) {
        if let Some(emulator) = self.emulator.take() {
            emulator.shutdown().await.expect("emulator stops");
        }
    }

    /// Stops the emulator and starts it again with the same settings.
    pub async fn restart_emulator(&mut self) {
        self.stop_emulator().await;
        let config = self.emulator_config.clone().expect("an emulator stack");
        self.emulator = Some(Emulator::start(config).await.expect("emulator restarts"));
    }
}

/// A change to the emulator's configuration before it starts.
type Configure = Box<dyn FnOnce(&mut EmulatorConfig)>;

/// What [`Stack::builder`] starts; every part defaults.
#[derive(Default)]
pub struct StackBuilder {
    broker: MosquittoConfig,
    configure: Option<Configure>,
    script: Option<Script>,
    gateway: GatewayOptions,
}

impl StackBuilder {
    /// Broker settings.
    pub fn broker(mut self, config: MosquittoConfig) -> Self {
        self.broker = config;
        self
    }

    /// Changes the emulator's configuration before it starts.
    pub fn emulator(mut self, configure: impl FnOnce(&mut EmulatorConfig) + 'static) -> Self {
        self.configure = Some(Box::new(configure));
        self
    }

    /// A store that answers as `script` says, instead of the emulator: for
    /// replies the emulator never sends (clock skew, syntax errors, garbage).
    pub fn scripted(mut self, script: Script) -> Self {
        self.script = Some(script);
        self
    }

    /// The gateway's options.
    pub fn gateway(mut self, options: GatewayOptions) -> Self {
        self.gateway = options;
        self
    }

    /// Starts broker, store and gateway; returns once the gateway is ready.
    pub async fn start(self) -> Stack {
        init_logging();
        let broker = Mosquitto::start_with(self.broker).await;
        let (emulator, emulator_config, scripted) = match self.script {
            Some(script) => (
                None,
                None,
                Some(ScriptedStore::start(broker.port(), script).await),
            ),
            None => {
                let mut config = EmulatorConfig::new("127.0.0.1", broker.port());
                config.client_id = format!("emulator-{:08x}", rand::random::<u32>());
                if let Some(configure) = self.configure {
                    configure(&mut config);
                }
                let emulator = Emulator::start(config.clone())
                    .await
                    .expect("emulator starts");
                (Some(emulator), Some(config), None)
            }
        };
        let gateway = Gateway::start(broker.port(), self.gateway).await;
        gateway.wait_ready().await;
        Stack {
            broker,
            emulator,
            emulator_config,
            scripted,
            gateway,
        }
    }
}

/// A request on one key; see [`Gateway::at`]. Sending panics on a
/// transport error: every test expects an HTTP answer.
#[derive(Debug)]
pub struct KeyRequest<'a> {
    gateway: &'a Gateway,
    url: String,
    headers: Vec<(String, String)>,
}

impl KeyRequest<'_> {
    /// Appends `?query` (already encoded).
    pub fn query(mut self, query: &str) -> Self {
        self.url.push('?');
        self.url.push_str(query);
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl ToString, value: impl ToString) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `GET`.
    pub async fn get(self) -> reqwest::Response {
        self.send(reqwest::Method::GET, None).await
    }

    /// `HEAD`.
    pub async fn head(self) -> reqwest::Response {
        self.send(reqwest::Method::HEAD, None).await
    }

    /// `PUT` with `value`.
    pub async fn put(self, value: impl Into<reqwest::Body>) -> reqwest::Response {
        self.send(reqwest::Method::PUT, Some(value.into())).await
    }

    /// `DELETE`.
    pub async fn delete(self) -> reqwest::Response {
        self.send(reqwest::Method::DELETE, None).await
    }

    async fn send(self, method: reqwest::Method, body: Option<reqwest::Body>) -> reqwest::Response {
        let mut request = self.gateway.http.request(method.clone(), &self.url);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{method} {}: {error}", self.url))
    }
}

/// The body as JSON (reqwest is built without its `json` feature).
pub async fn json(response: reqwest::Response) -> serde_json::Value {
    let bytes = response.bytes().await.unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|error| panic!("not JSON ({error}): {}", String::from_utf8_lossy(&bytes)))
}

/// Asserts a problem+json response of `status` and `kind`; its body.
pub async fn problem(response: reqwest::Response, status: u16, kind: &str) -> serde_json::Value {
    assert_eq!(response.status().as_u16(), status, "{response:?}");
    assert_eq!(
        response.headers()[reqwest::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = json(response).await;
    assert_eq!(body["type"], kind, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(body["title"].is_string(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
    body
}

/// The version in an `ETag`, without its quotes.
pub fn etag(headers: &reqwest::header::HeaderMap) -> String {
    let value = headers
        .get(reqwest::header::ETAG)
        .expect("an ETag")
        .to_str()
        .unwrap();
    value
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
        .expect("a quoted ETag")
        .to_owned()
}
