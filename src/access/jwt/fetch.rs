//! One GET of a JWKS URL: HTTP/1.1 over TCP, or over TLS with the
//! configured roots, with an optional bearer token read from its file at
//! each fetch (Kubernetes rotates projected tokens in place).
//!
//! hyper's client connection over tokio-rustls, both already in the
//! binary, rather than a whole HTTP client crate: a fetch every few
//! minutes needs no pool, redirects or proxies.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

use super::error::JwksError;
use super::settings::JwksUrl;
use crate::settings::{self as table, SettingError};

/// A JWKS URL ready to fetch: its TLS configuration made once.
#[derive(Clone)]
pub(super) struct Fetcher {
    uri: hyper::Uri,
    tls: Option<Arc<ClientConfig>>,
    token_file: Option<PathBuf>,
}

impl Fetcher {
    /// Reads the CA bundle (for `https`) and checks that the token file
    /// can be read, so that a bad setting stops the start.
    pub(super) fn new(url: &JwksUrl) -> Result<Self, SettingError> {
        let tls = match url.uri.scheme_str() {
            Some("https") => Some(crate::mqtt::tls_client_config(
                &table::JWT_JWKS_CA_FILE,
                url.ca_file.as_deref(),
            )?),
            _ => None,
        };
        if let Some(path) = &url.token_file {
            bearer(path)
                .map_err(|message| SettingError::new(&table::JWT_JWKS_TOKEN_FILE, message))?;
        }
        Ok(Self {
            uri: url.uri.clone(),
            tls,
            token_file: url.token_file.clone(),
        })
    }
}

/// The largest JWKS document read (a set of a few dozen RSA keys is
/// tens of KiB).
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// The document at `url`, within `timeout` (connect, handshake, request
/// and body together).
pub(super) async fn fetch(url: &Fetcher, timeout: Duration) -> Result<Bytes, JwksError> {
    tokio::time::timeout(timeout, get(url))
        .await
        .unwrap_or_else(|_| Err(fetch_error(url, format!("no answer within {timeout:?}"))))
}

async fn get(url: &Fetcher) -> Result<Bytes, JwksError> {
    let uri = &url.uri;
    let host = uri.host().unwrap_or_default();
    // `[::1]` in a URL, `::1` to connect to.
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let mut request = Request::get(uri.path_and_query().map_or("/", |path| path.as_str()))
        .header(ACCEPT, "application/json, application/jwk-set+json");
    if let Some(authority) = uri.authority() {
        request = request.header(HOST, authority.as_str());
    }
    if let Some(path) = &url.token_file {
        request = request.header(
            AUTHORIZATION,
            bearer(path).map_err(|e| fetch_error(url, e))?,
        );
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|error| fetch_error(url, error.to_string()))?;
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(|error| fetch_error(url, format!("cannot connect: {error}")))?;
    let _ = tcp.set_nodelay(true);
    match &url.tls {
        None => send(url, tcp, request).await,
        Some(config) => {
            let name = ServerName::try_from(bare_host.to_owned())
                .map_err(|_| fetch_error(url, format!("{host:?} is not a TLS server name")))?;
            let tls = TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await
                .map_err(|error| fetch_error(url, format!("TLS handshake failed: {error}")))?;
            send(url, tls, request).await
        }
    }
}

async fn send<S>(
    url: &Fetcher,
    stream: S,
    request: Request<Empty<Bytes>>,
) -> Result<Bytes, JwksError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| fetch_error(url, error.to_string()))?;
    // The connection runs beside the request; dropped with this fetch.
    let driver = tokio::spawn(connection);
    let outcome = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| fetch_error(url, error.to_string()))?;
        if response.status() != StatusCode::OK {
            return Err(fetch_error(url, format!("answered {}", response.status())));
        }
        Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
            .collect()
            .await
            .map(|body| body.to_bytes())
            .map_err(|error| fetch_error(url, format!("reading the body: {error}")))
    }
    .await;
    driver.abort();
    outcome
}

/// `Bearer <token>` from a token file, read by the secret files' rule.
fn bearer(path: &Path) -> Result<HeaderValue, String> {
    let token = crate::files::secret::read_token(path)
        .map_err(|error| format!("the token file: {error}"))?;
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(&token);
    let mut value = HeaderValue::from_bytes(&value)
        .map_err(|_| format!("the token file {} holds no usable token", path.display()))?;
    value.set_sensitive(true);
    Ok(value)
}

fn fetch_error(url: &Fetcher, message: impl Into<String>) -> JwksError {
    JwksError::Fetch {
        url: url.uri.to_string(),
        message: message.into(),
    }
}
