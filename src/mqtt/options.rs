//! What every MQTT5 connection of this crate starts from (the gateway's
//! pool and the emulator alike).
//!
//! Two rumqttc defaults cost 44-88 ms per round trip or drop connections
//! (Nagle's algorithm, a 10 KiB incoming packet limit); [`base_options`] is
//! the one place that sets them right.

use std::time::Duration;

use rumqttc::v5::MqttOptions;

/// The largest packet we accept (and advertise). Values up to this size
/// minus the envelope can be stored; the broker's own limit may be lower.
pub const MAX_PACKET_SIZE: u32 = 16 * 1024 * 1024;

/// How long a TCP/TLS connect plus CONNACK may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests queued from clients to a rumqttc event loop before `publish` waits.
pub const REQUEST_CHANNEL_CAPACITY: usize = 1024;

/// Outgoing QoS 1 publishes a connection may have unacknowledged. rumqttc
/// preallocates one slot per packet id up to this limit (or the broker's
/// receive maximum, if lower), and its default (65,535) costs about 14 MB
/// of resident memory per connection. The pool keeps at most half the
/// request channel in flight per member; the emulator answers at most its
/// receive maximum (1,024) requests at a time, and when a burst of
/// notifications reaches the limit rumqttc waits for acknowledgements
/// (flow control; nothing is dropped).
pub const OUTGOING_INFLIGHT_LIMIT: u16 = 1024;

/// MQTT5 options every connection of this crate starts from: TCP_NODELAY,
/// an explicit maximum packet size, keep-alive, a connect timeout and a
/// small outgoing in-flight table.
pub fn base_options(
    client_id: impl Into<String>,
    host: impl Into<String>,
    port: u16,
    keep_alive: Duration,
) -> MqttOptions {
    let mut options = MqttOptions::new(client_id, host, port);
    let mut network = options.network_options();
    network.set_tcp_nodelay(true);
    network.set_connection_timeout(CONNECT_TIMEOUT.as_secs());
    options
        .set_network_options(network)
        .set_max_packet_size(Some(MAX_PACKET_SIZE))
        .set_keep_alive(keep_alive)
        .set_request_channel_capacity(REQUEST_CHANNEL_CAPACITY)
        .set_outgoing_inflight_upper_limit(OUTGOING_INFLIGHT_LIMIT);
    options
}
