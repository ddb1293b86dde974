//! `serve`: binds both listeners, starts the pool and the router, and
//! drains on shutdown.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use thiserror::Error;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::api::admin;
use super::dapr::delivery::{self, DeliverySettings};
use super::router::{cors, router};
use super::state::{AppState, Limits};
use super::transport::listener;
use super::transport::listener::ConnectionLimits;
use super::transport::tls::{ALPN_H2, ALPN_HTTP1, CertificateFiles};
use crate::access::jwt::{JwtSettings, Verifier};
use crate::access::rules::{Authz, AuthzSettings};
use crate::access::{ApiToken, CallerChecks};
use crate::dapr::DaprSettings;
use crate::dapr::pubsub::RetryPolicy;
use crate::locks::LockSettings;
use crate::metrics::Metrics;
use crate::mqtt::{Pool, PoolSettings, PoolStartError};
use crate::settings::{self, SettingError};
use crate::watch::WatchSettings;

/// Open connections the admin listener takes (probes, scrapes).
const ADMIN_MAX_CONNECTIONS: usize = 256;

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
    /// JWTs the key API accepts as bearer tokens (beside the API token).
    pub jwt: Option<JwtSettings>,
    /// The key API's serving certificate: TLS (HTTP/2 by ALPN) when given.
    pub api_tls: Option<CertificateFiles>,
    /// Per-key rules (`--authz-file`).
    pub authz: Option<AuthzSettings>,
    /// How long in-flight requests may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Watch limits and keep-alive.
    pub watch: WatchSettings,
    /// Lock request limits.
    pub locks: LockSettings,
    /// Dapr's state and lock API: store names, key prefix, etag leases.
    pub dapr: DaprSettings,
    /// Origins allowed to call the API from a browser (CORS); empty: none.
    pub cors_allow_origins: Vec<String>,
    /// How long a client may take to send a request's headers; also how
    /// long an idle keep-alive connection stays open (both listeners).
    pub header_read_timeout: Duration,
    /// Open connections on the API listener before it stops accepting.
    pub max_connections: usize,
}

/// The command line's defaults (no token, no CORS origin).
impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            listen: settings::DEFAULT_LISTEN,
            admin_listen: settings::DEFAULT_ADMIN_LISTEN,
            pool: PoolSettings::default(),
            limits: Limits::default(),
            api_token: None,
            jwt: None,
            api_tls: None,
            authz: None,
            shutdown_grace: settings::DEFAULT_SHUTDOWN_GRACE,
            watch: WatchSettings::default(),
            locks: LockSettings::default(),
            dapr: DaprSettings::default(),
            cors_allow_origins: Vec::new(),
            header_read_timeout: settings::DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: usize::try_from(settings::DEFAULT_MAX_CONNECTIONS)
                .unwrap_or(usize::MAX),
        }
        .with_request_timeout(settings::DEFAULT_REQUEST_TIMEOUT)
    }
}

impl ServeSettings {
    /// These settings with `timeout` as the request timeout (the pool owns
    /// it: body reads, the backstop and a new watcher's registration wait
    /// read it from there), and the waits derived from it: the pool's slot
    /// wait and Dapr's lease wait. The one place they are set, for the
    /// command line and the tests alike.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.pool.request_timeout = timeout;
        self.pool.slot_wait = settings::slot_wait(timeout);
        self.dapr.lease_wait = timeout;
        self
    }
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
    Pool(#[from] PoolStartError),
    /// A file a setting names cannot be used (the key API's certificate
    /// or key, the JWT key set, the rules file); the message names the
    /// setting.
    #[error("{0}")]
    Setting(#[from] SettingError),
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
    stop_api: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    api_task: JoinHandle<io::Result<()>>,
    admin_task: JoinHandle<io::Result<()>>,
    /// What the gateway does with the app, when there is one.
    app_task: Option<JoinHandle<()>>,
    /// The outbox's relay, when the state store has one.
    outbox_task: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds both listeners, starts the pool and serves; returns at once
    /// (the pool connects in the background; `/readyz` says when it is up).
    pub async fn start(settings: ServeSettings, metrics: Metrics) -> Result<Server, ServeError> {
        let authz = settings
            .authz
            .map(|authz| Authz::load(authz.file, Some(authz.check_interval), metrics.clone()))
            .transpose()?;
        let api_listener = bind("--listen", settings.listen).await?;
        let admin_listener = bind("--admin-listen", settings.admin_listen).await?;
        let api_addr = local_addr("--listen", settings.listen, &api_listener)?;
        let admin_addr = local_addr("--admin-listen", settings.admin_listen, &admin_listener)?;
        let jwt = match settings.jwt {
            None => None,
            Some(jwt) => Some(Verifier::start(jwt, metrics.clone())?),
        };
        // Before the pool starts: a certificate that cannot be used stops here.
        let acceptor = match &settings.api_tls {
            Some(files) => Some(files.acceptor(&[ALPN_H2, ALPN_HTTP1])?),
            None => None,
        };
        let delivery = DeliverySettings {
            broker: settings.pool.broker.clone(),
            client_id: format!("{}-sub", settings.pool.client_id),
            app_id: settings.dapr.app_id.clone(),
            pubsubs: settings.dapr.pubsubs.clone(),
            declarative: settings.dapr.subscriptions.clone(),
            max_message_bytes: settings.limits.dapr_max_body_size,
            retry: RetryPolicy::default(),
        };
        let outbox_client_id = format!("{}-outbox", settings.pool.client_id);
        let broker = settings.pool.broker.clone();
        let pool = Pool::start(settings.pool, metrics.clone())?;
        let state = AppState::new(
            pool,
            metrics,
            settings.limits,
            CallerChecks {
                api_token: settings.api_token,
                jwt,
                authz,
            },
            settings.watch,
            settings.locks,
            settings.dapr,
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
        let (stop_api, api_stopped) = watch::channel(false);
        let (stop_admin, admin_stopped) = watch::channel(false);
        let api_task = tokio::spawn(listener::serve(
            api_listener,
            api,
            limits,
            acceptor,
            stopped(api_stopped),
        ));
        let admin_task = tokio::spawn(listener::serve(
            admin_listener,
            admin::router(state.clone()),
            admin_limits,
            None,
            stopped(admin_stopped),
        ));
        let app_task = state.app.clone().map(|app| {
            tokio::spawn(delivery::run(
                app,
                delivery,
                state.subscriptions.clone(),
                state.metrics.clone(),
            ))
        });
        let outbox_task = state
            .dapr
            .outbox_relay(broker, outbox_client_id)
            .map(tokio::spawn);
        let tls = settings.api_tls.is_some();
        tracing::info!(%api_addr, %admin_addr, tls, "gateway listening");
        Ok(Server {
            api_addr,
            admin_addr,
            state,
            grace: settings.shutdown_grace,
            stop_api,
            stop_admin,
            api_task,
            admin_task,
            app_task,
            outbox_task,
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
            app_task,
            outbox_task,
            ..
        } = self;
        state.draining.store(true, Ordering::Release);
        for task in [app_task, outbox_task].into_iter().flatten() {
            task.abort();
        }
        // SSE streams never end by themselves: end them so the drain can finish.
        state.hub.shutdown();
        state.topics.shutdown();
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

/// Connections the kernel completes before the gateway accepts them (it
/// caps this at `net.core.somaxconn`). std's and tokio's 128 dropped the
/// SYNs of a burst, such as dashboards reconnecting after a restart, and
/// their clients retried only a second later.
const LISTEN_BACKLOG: u32 = 4096;

async fn bind(setting: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let listen = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }?;
        // As std's bind: a restarted gateway rebinds while old connections linger.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| ServeError::Bind {
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

async fn stopped(mut receiver: watch::Receiver<bool>) {
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

    #[tokio::test]
    async fn a_burst_of_connections_waits_in_the_backlog_until_accepted() {
        // Dashboards reconnecting at once after a restart: the kernel
        // completes their handshakes while the gateway is busy, rather than
        // dropping SYNs past a short backlog (the clients then retry a
        // second later).
        let listener = bind("listen", SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut waiting = Vec::new();
        for n in 0..600 {
            let connected = tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            .unwrap_or_else(|_| panic!("connection {n} was not queued"));
            waiting.push(connected.unwrap());
        }
        drop(listener);
    }
}
