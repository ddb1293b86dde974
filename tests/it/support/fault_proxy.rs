//! A fault-injecting TCP proxy for MQTT, put between a client (gateway or
//! emulator) and the broker, and steered by the test while it runs;
//! [`FaultProxy::start_bytes`] is the same proxy for any protocol (an
//! HTTP client before the gateway), with the faults that need no framing:
//! cutting every connection and refusing new ones.
//!
//! It frames the bytes into MQTT packets (fixed header: type and remaining
//! length), so a fault can hit an exact packet: "cut the connection right
//! after forwarding the 3rd PUBLISH from the client". Faults: a delay on
//! every packet, a black hole (packets are swallowed, the connection stays
//! up), cutting every connection now or after the Nth client PUBLISH, and
//! refusing new connections. [`FaultProxy::start_reporting_takeovers`]
//! tells a client whose session another connection with its client id
//! takes over, as MQTT 5 asks (DISCONNECT 0x8E), where mosquitto 2.0.11
//! only closes the connection. [`AuthProxy`](super::AuthProxy) is the
//! proxy for the CONNECT handshake; this one is for what follows.

#![allow(clippy::unwrap_used)] // test helper

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// MQTT control packet type of PUBLISH.
const PUBLISH: u8 = 3;

/// DISCONNECT, reason 0x8E (session taken over), no properties.
const DISCONNECT_SESSION_TAKEN_OVER: [u8; 4] = [0xe0, 0x02, 0x8e, 0x00];

/// What the proxy has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted and forwarded.
    pub connections: u64,
    /// Connections refused while refusing.
    pub refused: u64,
    /// Connections cut by the proxy.
    pub cuts: u64,
    /// PUBLISH packets forwarded from clients to the broker.
    pub publishes_to_broker: u64,
    /// Packets swallowed by the black hole.
    pub swallowed: u64,
}

#[derive(Debug, Default)]
struct Control {
    /// Bytes forwarded as they come, not framed as MQTT packets.
    bytes: bool,
    delay_us: AtomicU64,
    black_hole: AtomicBool,
    refuse: AtomicBool,
    /// Cut after this many more client PUBLISHes (0: no cut armed).
    cut_after_publishes: AtomicU64,
    stats: Mutex<ProxyStats>,
    /// With takeovers reported: the open connection of each client id, and
    /// how to tell it its session was taken (it answers once the
    /// DISCONNECT is written).
    sessions: Option<Mutex<HashMap<String, Session>>>,
}

/// An open connection of a client id.
#[derive(Debug)]
struct Session {
    /// Which connection, so that a closing one removes only itself.
    serial: u64,
    taken_over: oneshot::Sender<oneshot::Sender<()>>,
}

/// The proxy; its listener and connections end when it is dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// Where clients connect instead of the broker.
    pub addr: SocketAddr,
    control: Arc<Control>,
    /// Bumped to cut every open connection.
    cut: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding MQTT to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_with(upstream, Control::default())
    }

    /// A proxy forwarding MQTT to `upstream` that tells a client its
    /// session was taken over (DISCONNECT 0x8E, then the close) before it
    /// forwards the CONNECT of another connection with the same client id:
    /// a broker that reports takeovers as MQTT 5 asks.
    pub async fn start_reporting_takeovers(upstream: SocketAddr) -> Self {
        Self::start_with(
            upstream,
            Control {
                sessions: Some(Mutex::new(HashMap::new())),
                ..Control::default()
            },
        )
    }

    /// A proxy forwarding any protocol's bytes to `upstream`: only
    /// [`Self::cut_all`] and [`Self::set_refuse`] apply.
    pub async fn start_bytes(upstream: SocketAddr) -> Self {
        Self::start_with(
            upstream,
            Control {
                bytes: true,
                ..Control::default()
            },
        )
    }

    fn start_with(upstream: SocketAddr, control: Control) -> Self {
        let listener = super::fresh_tokio_listener();
        let addr = listener.local_addr().expect("local addr");
        let control = Arc::new(control);
        let (cut, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let control = control.clone();
            let cut = cut.clone();
            async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        continue;
                    };
                    if control.refuse.load(Ordering::SeqCst) {
                        control.stats.lock().unwrap().refused += 1;
                        drop(socket);
                        continue;
                    }
                    control.stats.lock().unwrap().connections += 1;
                    let control = control.clone();
                    tokio::spawn(serve(socket, upstream, control, cut.subscribe()));
                }
            }
        });
        Self {
            addr,
            control,
            cut,
            task,
        }
    }

    /// The port, for clients configured by host and port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Delays every packet, both ways, by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.control
            .delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// Swallows every packet, both ways, while on; connections stay open.
    pub fn set_black_hole(&self, on: bool) {
        self.control.black_hole.store(on, Ordering::SeqCst);
    }

    /// Closes new connections at once while on (open ones stay).
    pub fn set_refuse(&self, on: bool) {
        self.control.refuse.store(on, Ordering::SeqCst);
    }

    /// Cuts every open connection now.
    pub fn cut_all(&self) {
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// Cuts every open connection right after forwarding the `n`th PUBLISH
    /// (counted from now) from a client to the broker; 0 disarms.
    pub fn cut_after_publishes(&self, n: u64) {
        self.control.cut_after_publishes.store(n, Ordering::SeqCst);
    }

    /// What happened so far.
    pub fn stats(&self) -> ProxyStats {
        *self.control.stats.lock().unwrap()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToBroker,
    ToClient,
}

async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    control: Arc<Control>,
    mut cut: watch::Receiver<u64>,
) {
    let Ok(Ok(mut broker)) =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await
    else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = broker.set_nodelay(true);
    let mut taken_over = None;
    if let Some(sessions) = &control.sessions {
        match take_session(&mut client, &mut broker, sessions).await {
            Some(session) => taken_over = Some(session),
            None => return,
        }
    }
    // Borrowed halves, so the sockets outlive the count below: a test that
    // sees the gateway's answer to a cut also sees the cut.
    let cut_by_proxy = if control.bytes {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut broker) => false,
            _ = cut.changed() => true,
        }
    } else {
        let (mut client_read, mut client_write) = client.split();
        let (mut broker_read, mut broker_write) = broker.split();
        let (serial, told) = match taken_over.take() {
            Some((serial, told)) => (Some(serial), Some(told)),
            None => (None, None),
        };
        let reported = async {
            match told {
                Some(told) => told.await.ok(),
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            cut_here = pump(&mut client_read, &mut broker_write, Direction::ToBroker, &control) => Ok(cut_here),
            cut_here = pump(&mut broker_read, &mut client_write, Direction::ToClient, &control) => Ok(cut_here),
            _ = cut.changed() => Ok(true),
            Some(done) = reported => Err(done),
        };
        if let (Some(sessions), Some(serial)) = (&control.sessions, serial) {
            let mut sessions = sessions.lock().unwrap();
            sessions.retain(|_, session| session.serial != serial);
        }
        match ended {
            Ok(cut_here) => cut_here,
            Err(done) => {
                let _ = client_write.write_all(&DISCONNECT_SESSION_TAKEN_OVER).await;
                let _ = client_write.flush().await;
                let _ = done.send(());
                true
            }
        }
    };
    if cut_by_proxy {
        control.stats.lock().unwrap().cuts += 1;
    }
    // Both sockets drop here: the connections close.
}

/// Reads the client's CONNECT, tells the connection that holds its client
/// id (if any) that its session is taken over and waits until it has been
/// told, then forwards the CONNECT and registers this connection as the
/// client id's. `None` when the client or the broker went away.
async fn take_session(
    client: &mut TcpStream,
    broker: &mut TcpStream,
    sessions: &Mutex<HashMap<String, Session>>,
) -> Option<(u64, oneshot::Receiver<oneshot::Sender<()>>)> {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let mut buffer = BytesMut::with_capacity(1024);
    let length = loop {
        if let Some(length) = packet_length(&buffer) {
            break length?;
        }
        if client.read_buf(&mut buffer).await.ok()? == 0 {
            return None;
        }
    };
    // The body follows the type byte and the remaining length.
    let header = 1 + buffer[1..].iter().position(|byte| byte & 0x80 == 0)? + 1;
    let (connect, _) = super::auth_proxy::parse_connect(&buffer[header..length]);
    let serial = SERIAL.fetch_add(1, Ordering::SeqCst);
    let (taken_over, told) = oneshot::channel();
    let previous = sessions
        .lock()
        .unwrap()
        .insert(connect.client_id, Session { serial, taken_over });
    if let Some(previous) = previous {
        let (done, reported) = oneshot::channel();
        if previous.taken_over.send(done).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reported).await;
        }
    }
    broker.write_all(&buffer).await.ok()?;
    Some((serial, told))
}

/// Forwards whole packets from `from` to `to` with the faults applied;
/// returns `true` if it cut the connection, `false` when a side closed.
async fn pump(
    from: &mut ReadHalf<'_>,
    to: &mut WriteHalf<'_>,
    direction: Direction,
    control: &Control,
) -> bool {
    let mut buffer = BytesMut::with_capacity(64 * 1024);
    loop {
        match from.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        while let Some(length) = packet_length(&buffer) {
            let Some(length) = length else {
                return true; // not MQTT: end it
            };
            let packet = buffer.split_to(length);
            if control.black_hole.load(Ordering::SeqCst) {
                control.stats.lock().unwrap().swallowed += 1;
                continue;
            }
            let delay = control.delay_us.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_micros(delay)).await;
            }
            if to.write_all(&packet).await.is_err() {
                return false;
            }
            if direction == Direction::ToBroker && packet[0] >> 4 == PUBLISH {
                control.stats.lock().unwrap().publishes_to_broker += 1;
                let armed = control.cut_after_publishes.fetch_update(
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                    |left| (left > 0).then(|| left - 1),
                );
                if armed == Ok(1) {
                    let _ = to.flush().await;
                    return true;
                }
            }
        }
    }
}

/// The length of the first whole packet in `buffer`: `None` if it is not
/// all there yet, `Some(None)` if the header is not MQTT.
fn packet_length(buffer: &[u8]) -> Option<Option<usize>> {
    let mut remaining = 0usize;
    for (index, shift) in (0..4).map(|i| (i + 1, i * 7)) {
        let byte = *buffer.get(index)?;
        remaining |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            let total = 1 + index + remaining;
            return (buffer.len() >= total).then_some(Some(total));
        }
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::packet_length;

    #[test]
    fn packets_are_framed_by_their_remaining_length() {
        assert_eq!(packet_length(&[]), None);
        assert_eq!(packet_length(&[0x30]), None);
        assert_eq!(packet_length(&[0xc0, 0x00]), Some(Some(2)));
        assert_eq!(packet_length(&[0x30, 0x02, 1]), None);
        assert_eq!(packet_length(&[0x30, 0x02, 1, 2, 9]), Some(Some(4)));
        // 321 = 0xC1 0x02.
        let mut long = vec![0x30, 0xc1, 0x02];
        long.resize(3 + 321, 0);
        assert_eq!(packet_length(&long), Some(Some(324)));
        assert_eq!(packet_length(&long[..100]), None);
        assert_eq!(packet_length(&[0x30, 0xff, 0xff, 0xff, 0xff]), Some(None));
    }
}
