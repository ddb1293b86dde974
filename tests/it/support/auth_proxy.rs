//! Stands in for the AIO broker's `K8S-SAT` authentication in tests.
//!
//! mosquitto without an auth plugin refuses a CONNECT that names an
//! authentication method, so this TCP listener reads each client's CONNECT,
//! records its client id and authentication method/data, and then either
//! closes the connection (`terminating`) or forwards the CONNECT without
//! the two auth properties to a real broker and pipes the bytes both ways
//! (`forwarding`). That lets tests see exactly what a client sends and run
//! the rest of the MQTT session against mosquitto.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One CONNECT as the proxy received it.
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    /// The client id.
    pub client_id: String,
    /// Property 0x15.
    pub auth_method: Option<String>,
    /// Property 0x16.
    pub auth_data: Option<Vec<u8>>,
    /// User name from the payload.
    pub username: Option<String>,
    /// When it arrived.
    pub at: Instant,
}

/// The proxy.
#[derive(Debug)]
pub struct AuthProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    connects: Arc<Mutex<Vec<ConnectInfo>>>,
    task: JoinHandle<()>,
}

impl AuthProxy {
    /// Records each CONNECT and closes the connection.
    pub async fn terminating() -> Self {
        Self::start(None).await
    }

    /// Records each CONNECT and forwards the session to `upstream`.
    pub async fn forwarding(upstream: SocketAddr) -> Self {
        Self::start(Some(upstream)).await
    }

    async fn start(upstream: Option<SocketAddr>) -> Self {
        let listener = super::fresh_tokio_listener();
        let addr = listener.local_addr().expect("local addr");
        let connects = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let connects = connects.clone();
            async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        continue;
                    };
                    let connects = connects.clone();
                    tokio::spawn(async move {
                        let _ = serve(socket, upstream, connects).await;
                    });
                }
            }
        });
        Self {
            addr,
            connects,
            task,
        }
    }

    /// Every CONNECT so far, in arrival order.
    pub fn connects(&self) -> Vec<ConnectInfo> {
        self.connects.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the CONNECTs seen so far.
    pub async fn wait_for(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&[ConnectInfo]) -> bool,
    ) -> Vec<ConnectInfo> {
        let deadline = Instant::now() + within;
        loop {
            let connects = self.connects();
            if done(&connects) {
                return connects;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {within:?}; CONNECTs seen: {connects:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut client: TcpStream,
    upstream: Option<SocketAddr>,
    connects: Arc<Mutex<Vec<ConnectInfo>>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let first = client.read_u8().await?;
    assert_eq!(first >> 4, 1, "the first packet is not CONNECT");
    let length = read_varint(&mut client).await?;
    let mut body = vec![0; length];
    client.read_exact(&mut body).await?;
    let (info, stripped) = parse_connect(&body);
    connects.lock().unwrap().push(info);
    let Some(upstream) = upstream else {
        return Ok(());
    };
    let mut broker = TcpStream::connect(upstream).await?;
    broker.set_nodelay(true)?;
    let mut packet = vec![first];
    write_varint(&mut packet, stripped.len());
    packet.extend_from_slice(&stripped);
    broker.write_all(&packet).await?;
    tokio::io::copy_bidirectional(&mut client, &mut broker).await?;
    Ok(())
}

async fn read_varint(stream: &mut TcpStream) -> std::io::Result<usize> {
    let mut value = 0usize;
    for shift in (0..28).step_by(7) {
        let byte = stream.read_u8().await?;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    panic!("remaining length longer than four bytes");
}

fn varint_at(bytes: &[u8], at: &mut usize) -> usize {
    let mut value = 0usize;
    for shift in (0..28).step_by(7) {
        let byte = bytes[*at];
        *at += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
    }
    panic!("varint longer than four bytes");
}

fn write_varint(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let mut byte = (value % 128) as u8;
        value /= 128;
        if value > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if value == 0 {
            return;
        }
    }
}

fn u16_at(bytes: &[u8], at: &mut usize) -> usize {
    let value = usize::from(u16::from_be_bytes([bytes[*at], bytes[*at + 1]]));
    *at += 2;
    value
}

fn binary_at<'a>(bytes: &'a [u8], at: &mut usize) -> &'a [u8] {
    let length = u16_at(bytes, at);
    let value = &bytes[*at..*at + length];
    *at += length;
    value
}

/// Parses an MQTT5 CONNECT body (after the fixed header) and returns what
/// it says plus the body without the authentication properties.
pub(super) fn parse_connect(body: &[u8]) -> (ConnectInfo, Vec<u8>) {
    let mut at = 0;
    assert_eq!(binary_at(body, &mut at), b"MQTT", "protocol name");
    assert_eq!(body[at], 5, "MQTT version 5");
    let flags = body[at + 1];
    at += 4; // version, flags, keep-alive
    let header_end = at;
    let properties_length = varint_at(body, &mut at);
    let properties_start = at;
    let properties_end = at + properties_length;
    let mut kept = Vec::new();
    let mut auth_method = None;
    let mut auth_data = None;
    while at < properties_end {
        let start = at;
        let id = body[at];
        at += 1;
        match id {
            0x11 | 0x27 => at += 4,
            0x21 | 0x22 => at += 2,
            0x17 | 0x19 => at += 1,
            0x26 => {
                binary_at(body, &mut at);
                binary_at(body, &mut at);
            }
            0x15 => {
                let method = binary_at(body, &mut at);
                auth_method = Some(String::from_utf8(method.to_vec()).expect("UTF-8 method"));
                continue;
            }
            0x16 => {
                auth_data = Some(binary_at(body, &mut at).to_vec());
                continue;
            }
            other => panic!("unexpected CONNECT property 0x{other:02x}"),
        }
        kept.extend_from_slice(&body[start..at]);
    }
    assert_eq!(at, properties_end, "properties end where their length says");
    let _ = properties_start;
    let payload = &body[properties_end..];
    let mut payload_at = 0;
    let client_id = String::from_utf8(binary_at(payload, &mut payload_at).to_vec()).expect("id");
    assert_eq!(flags & 0x04, 0, "no will expected");
    let username = (flags & 0x80 != 0).then(|| {
        String::from_utf8(binary_at(payload, &mut payload_at).to_vec()).expect("user name")
    });

    let mut stripped = body[..header_end].to_vec();
    write_varint(&mut stripped, kept.len());
    stripped.extend_from_slice(&kept);
    stripped.extend_from_slice(payload);
    (
        ConnectInfo {
            client_id,
            auth_method,
            auth_data,
            username,
            at: Instant::now(),
        },
        stripped,
    )
}
