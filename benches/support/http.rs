//! A minimal HTTP/1.1 keep-alive client: enough for the control requests of
//! a run (readiness, PUTs that trigger watch events, a fixed-rate load and
//! `/metrics`), with almost no cost of its own on the client side.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

/// Every request of this client gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A response: status and body.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The whole body.
    pub body: Vec<u8>,
}

/// One keep-alive connection.
#[derive(Debug)]
pub struct HttpConn {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl HttpConn {
    /// Connects (bounded by the request timeout).
    pub async fn connect(addr: SocketAddr) -> Result<HttpConn> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .with_context(|| format!("connecting to {addr}: timed out"))?
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(HttpConn {
            stream: BufReader::with_capacity(64 * 1024, stream),
            addr,
        })
    }

    /// Sends one request and reads its whole response.
    pub async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> Result<Response> {
        self.request_within(method, path, body, REQUEST_TIMEOUT)
            .await
    }

    /// [`HttpConn::request`] with `Authorization: Bearer <token>`.
    #[allow(dead_code)] // the auth benchmark's
    pub async fn request_as(
        &mut self,
        token: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Response> {
        let authorization = format!("Bearer {token}");
        self.request_with_headers(method, path, &[("Authorization", &authorization)], body)
            .await
    }

    /// [`HttpConn::request`] with more header fields.
    pub async fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let addr = self.addr;
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, body, headers))
            .await
            .with_context(|| {
                format!("{method} {path} on {addr}: no response within {REQUEST_TIMEOUT:?}")
            })?
            .with_context(|| format!("{method} {path} on {addr}"))
    }

    /// [`HttpConn::request`] with its own timeout (a blocking acquire).
    pub async fn request_within(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response> {
        let addr = self.addr;
        tokio::time::timeout(timeout, self.exchange(method, path, body, &[]))
            .await
            .with_context(|| format!("{method} {path} on {addr}: no response within {timeout:?}"))?
            .with_context(|| format!("{method} {path} on {addr}"))
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "PUT" || method == "POST" {
            // POST bodies here are JSON (the gateway's batches, etcd's API).
            let content_type = if method == "POST" {
                "application/json"
            } else {
                "application/octet-stream"
            };
            head.push_str(&format!(
                "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await?;

        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("connection closed in the response headers");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = Some(value.trim().parse().context("bad content-length")?);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.trim().eq_ignore_ascii_case("chunked");
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.stream.read_line(&mut line).await?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .with_context(|| format!("bad chunk size {line:?}"))?;
                let start = body.len();
                body.resize(start + size + 2, 0);
                self.stream.read_exact(&mut body[start..]).await?;
                body.truncate(start + size);
                if size == 0 {
                    break;
                }
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.stream.read_exact(&mut body).await?;
        }
        Ok(Response { status, body })
    }
}

/// One request on a fresh connection.
pub async fn request_once(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<Response> {
    HttpConn::connect(addr)
        .await?
        .request(method, path, body)
        .await
}
