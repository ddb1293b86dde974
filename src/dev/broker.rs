//! An MQTT5 broker inside the process (rmqtt), so `dev` needs nothing but cargo.
//!
//! rmqtt's defaults suit a general-purpose broker, not a request/response
//! service on loopback: without TCP_NODELAY every round trip costs 44 ms
//! (Nagle + delayed ACK), a 16-message window stalls a pipelining gateway,
//! a 1 MiB packet limit refuses large values, and its CPU-load check refuses
//! connections on a busy laptop. [`EmbeddedBroker::start`] sets all four.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::pin::Pin;
use std::time::Duration;

use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::types::Reason;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::error::DevError;
use crate::mqtt::MAX_PACKET_SIZE;

/// Unacknowledged QoS 1 messages the broker keeps in flight per client (and
/// advertises as its receive maximum). The gateway pipelines hundreds of
/// requests per connection; rmqtt's default of 16 would serialise them.
pub const MAX_INFLIGHT: u16 = 1024;

/// Messages queued per client behind a full in-flight window before rmqtt
/// starts dropping them.
pub const MAX_QUEUED_PER_CLIENT: usize = 100_000;

/// Disconnect events kept for a slow reader before the oldest are skipped.
const DISCONNECT_CHANNEL_CAPACITY: usize = 4096;

/// Shared subscriptions (`$share/<group>/<filter>`, which the Dapr outbox's
/// relay and pub/sub delivery make): each message goes to one member of
/// the group, taken in turn, an online one when there is one (an offline
/// member's session keeps it). rmqtt answers "not supported" without a
/// strategy of the embedder's.
#[derive(Debug, Default)]
struct SharedGroups {
    next: std::sync::atomic::AtomicUsize,
}

type SharedMember = (
    rmqtt::types::NodeId,
    rmqtt::types::ClientId,
    rmqtt::types::SubscriptionOptions,
    Option<Vec<rmqtt::types::SubscriptionIdentifier>>,
    Option<rmqtt::types::IsOnline>,
);

#[async_trait::async_trait]
impl rmqtt::subscribe::SharedSubscription for SharedGroups {
    fn is_supported(&self) -> bool {
        true
    }

    async fn choice(
        &self,
        _context: &ServerContext,
        _group: &rmqtt::types::SharedGroup,
        _publisher: &rmqtt::types::Id,
        _topic: &rmqtt::types::TopicName,
        members: &[SharedMember],
    ) -> Option<(usize, rmqtt::types::IsOnline)> {
        let count = members.len();
        if count == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (0..count)
            .map(|step| (start + step) % count)
            .find(|&at| members[at].4 == Some(true))
            .map(|at| (at, true))
            .or(Some((start % count, false)))
    }
}

/// How long [`EmbeddedBroker::shutdown`] waits for each session to close.
const KICK_TIMEOUT: Duration = Duration::from_secs(2);

/// A running in-process MQTT 3.1.1/5 broker listening on one TCP address.
///
/// Any MQTT client may connect (anonymous, no TLS): it is a development
/// broker on loopback. Dropping it stops accepting connections; call
/// [`EmbeddedBroker::shutdown`] to also close the connected clients.
pub struct EmbeddedBroker {
    addr: SocketAddr,
    context: ServerContext,
    server: JoinHandle<()>,
    disconnects: broadcast::Sender<String>,
}

impl std::fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBroker")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBroker {
    /// Binds `addr` (port 0 picks a free port, see [`Self::local_addr`]) and
    /// serves MQTT on it. Returns once the socket listens: connections made
    /// from then on are accepted.
    pub async fn start(addr: SocketAddr) -> Result<Self, DevError> {
        let listen_error = |source: rmqtt::Error| DevError::BrokerListen {
            addr,
            source: source.into(),
        };
        let listener = Builder::new()
            .name("dev/tcp")
            .laddr(addr)
            .reuseaddr(Some(true))
            .nodelay(true)
            .max_packet_size(MAX_PACKET_SIZE)
            .max_inflight(NonZeroU16::new(MAX_INFLIGHT).unwrap_or(NonZeroU16::MIN))
            .max_mqueue_len(MAX_QUEUED_PER_CLIENT)
            .bind()
            .and_then(|listener| listener.tcp())
            .map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;

        // A context per broker: rmqtt keeps no global session state, so two
        // brokers in one process (tests) stay independent.
        let context = ServerContext::new().busy_check_enable(false).build().await;

        let (disconnects, _) = broadcast::channel(DISCONNECT_CHANNEL_CAPACITY);
        let register = context.extends.hook_mgr().register();
        register
            .add(
                Type::ClientDisconnected,
                Box::new(DisconnectHook {
                    disconnects: disconnects.clone(),
                }),
            )
            .await;
        register.start().await;
        *context.extends.shared_subscription_mut().await = Box::new(SharedGroups::default());

        // rmqtt keys listeners by a caller-chosen id; the bound port is unique.
        let server = MqttServer::new(context.clone())
            .listener_by_id(listener, bound.port())
            .build();
        let server = tokio::spawn(async move {
            if let Err(error) = server.run().await {
                tracing::error!(%error, "embedded mqtt broker stopped");
            }
        });
        tracing::info!(addr = %bound, "embedded mqtt broker listening");
        Ok(Self {
            addr: bound,
            context,
            server,
            disconnects,
        })
    }

    /// The address the broker listens on (the real port when started on 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A stream of the client ids whose connection ended (DISCONNECT, lost
    /// socket, keep-alive timeout). A client taken over by a newer connection
    /// with the same id is not reported: that id is still connected, and
    /// reporting it would race with what the new connection registers.
    ///
    /// Only events after this call are received; a reader more than a few
    /// thousand events behind gets `RecvError::Lagged` and skips ahead.
    pub fn disconnects(&self) -> broadcast::Receiver<String> {
        self.disconnects.subscribe()
    }

    /// Stops accepting connections and closes every connected client.
    pub async fn shutdown(self) {
        self.server.abort();
        // Collect first: kicking while iterating would hold the shared-state lock.
        let entries: Vec<_> = self.context.extends.shared().await.iter().collect();
        for entry in entries {
            let Ok(mut entry) = entry.try_lock().await else {
                continue;
            };
            // clean start, clear subscriptions, as an administrator.
            if tokio::time::timeout(KICK_TIMEOUT, entry.kick(true, true, true))
                .await
                .is_err()
            {
                tracing::warn!(client = %entry.id().client_id, "session did not close in time");
            }
        }
        tracing::info!(addr = %self.addr, "embedded mqtt broker stopped");
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// rmqtt hook that publishes the client id of every ended connection.
struct DisconnectHook {
    disconnects: broadcast::Sender<String>,
}

// `Handler` is an `async_trait` trait; this is its expansion, written out to
// avoid a dependency for one synchronous method.
impl Handler for DisconnectHook {
    fn hook<'life0, 'life1, 'async_trait>(
        &'life0 self,
        param: &'life1 Parameter<'_>,
        acc: Option<HookResult>,
    ) -> Pin<Box<dyn Future<Output = ReturnType> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        if let Parameter::ClientDisconnected(session, reason) = param
            && !taken_over(reason)
        {
            let client_id = session.id.client_id.to_string();
            tracing::debug!(client = %client_id, %reason, "mqtt client disconnected");
            // No receiver (nobody interested yet) is not an error.
            let _ = self.disconnects.send(client_id);
        }
        Box::pin(std::future::ready((true, acc)))
    }
}

/// Whether a connection ended because a newer one took its client id over
/// (rmqtt's non-administrative kick), possibly among several reasons.
fn taken_over(reason: &Reason) -> bool {
    match reason {
        Reason::ConnectKicked(by_admin) => !by_admin,
        Reason::Reasons(reasons) => reasons.iter().any(taken_over),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeover_is_recognised_inside_a_list_of_reasons() {
        let takeover = Reason::Reasons(vec![
            Reason::ConnectRemoteClose,
            Reason::ConnectKicked(false),
        ]);
        assert!(taken_over(&takeover));
        assert!(taken_over(&Reason::ConnectKicked(false)));
    }

    #[test]
    fn admin_kicks_and_lost_connections_are_not_takeovers() {
        assert!(!taken_over(&Reason::ConnectKicked(true)));
        assert!(!taken_over(&Reason::ConnectRemoteClose));
        assert!(!taken_over(&Reason::Reasons(vec![
            Reason::ConnectKeepaliveTimeout
        ])));
    }
}
