//! Session takeovers: a client that connects with a member's client id
//! makes the broker end the member's connection and give it the session.
//! Two gateways with one client id take each other's sessions over and
//! over, each connection lasting until the other reconnects; this tells
//! that apart from other losses, so the gateway says so (an error naming
//! the id and the setting to change, a metric, `/readyz` 503) rather than
//! reconnecting silently.
//!
//! MQTT 5 brokers send DISCONNECT with reason 0x8E (session taken over)
//! first. Some only close the connection (mosquitto 2.0.11): then a run of
//! connections that the broker accepted and closed without a reason within
//! seconds is the sign, as a broker that restarts refuses connections for a
//! while and a flaky network does not close cleanly at once each time.

use std::io;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode;
use rumqttc::v5::{ConnectionError, StateError};

/// How long `/readyz` stays 503 after a member lost its session to
/// another client: longer than a reconnect (at most a second of backoff),
/// so it stays 503 while two clients keep taking the session from each
/// other, and it is 200 again this long after the other one left.
pub(crate) const UNREADY_FOR: Duration = Duration::from_secs(10);

/// A connection the broker closed sooner than this after accepting it
/// counts towards a run of quick closes.
const QUICK_CLOSE: Duration = Duration::from_secs(10);

/// Quick closes in a row, without a reason, taken for a takeover.
const QUICK_CLOSES_IN_A_ROW: u32 = 3;

/// How one connection ended, as far as takeovers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// DISCONNECT with reason 0x8E, session taken over.
    TakenOver,
    /// The broker closed the connection without a DISCONNECT.
    ClosedWithoutReason,
    /// Any other way.
    Other,
}

impl Ending {
    /// How a connection that failed with `error` ended.
    pub(crate) fn of(error: &ConnectionError) -> Self {
        let io_error = match error {
            ConnectionError::MqttState(StateError::ServerDisconnect { reason_code, .. }) => {
                return if *reason_code == DisconnectReasonCode::SessionTakenOver {
                    Ending::TakenOver
                } else {
                    Ending::Other
                };
            }
            ConnectionError::MqttState(StateError::ConnectionAborted) => {
                return Ending::ClosedWithoutReason;
            }
            ConnectionError::Io(error)
            | ConnectionError::MqttState(
                StateError::Io(error)
                | StateError::Deserialization(rumqttc::v5::mqttbytes::Error::Io(error)),
            ) => error,
            _ => return Ending::Other,
        };
        // A write that met the close, or a read that met its reset.
        match io_error.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Ending::ClosedWithoutReason,
            _ => Ending::Other,
        }
    }
}

/// Why a member's session counts as taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// The broker said so (reason 0x8E).
    ReasonCode,
    /// This many connections in a row were accepted and then closed
    /// within seconds, without a reason.
    QuickCloses(u32),
}

impl Evidence {
    /// The `detected_by` label of `pool_session_takeovers_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Evidence::ReasonCode => "reason_code",
            Evidence::QuickCloses(_) => "repeated_close",
        }
    }
}

/// What one member saw of its last connections.
#[derive(Debug, Default)]
pub(crate) struct TakeoverWatch {
    quick_closes: u32,
}

impl TakeoverWatch {
    /// A connection ended `ending`, `connected_for` after its CONNACK
    /// (`None`: it never got one): whether its session was taken over.
    pub(crate) fn connection_ended(
        &mut self,
        ending: Ending,
        connected_for: Option<Duration>,
    ) -> Option<Evidence> {
        match (ending, connected_for) {
            (Ending::TakenOver, _) => {
                self.quick_closes = 0;
                Some(Evidence::ReasonCode)
            }
            (Ending::ClosedWithoutReason, Some(lasted)) if lasted < QUICK_CLOSE => {
                self.quick_closes += 1;
                (self.quick_closes >= QUICK_CLOSES_IN_A_ROW)
                    .then_some(Evidence::QuickCloses(self.quick_closes))
            }
            _ => {
                self.quick_closes = 0;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disconnect(reason_code: DisconnectReasonCode) -> ConnectionError {
        ConnectionError::MqttState(StateError::ServerDisconnect {
            reason_code,
            reason_string: None,
        })
    }

    #[test]
    fn endings_are_read_from_rumqttcs_errors() {
        assert_eq!(
            Ending::of(&disconnect(DisconnectReasonCode::SessionTakenOver)),
            Ending::TakenOver
        );
        assert_eq!(
            Ending::of(&disconnect(DisconnectReasonCode::ServerShuttingDown)),
            Ending::Other
        );
        assert_eq!(
            Ending::of(&ConnectionError::MqttState(StateError::ConnectionAborted)),
            Ending::ClosedWithoutReason
        );
        let reset = || io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(
            Ending::of(&ConnectionError::Io(reset())),
            Ending::ClosedWithoutReason
        );
        assert_eq!(
            Ending::of(&ConnectionError::MqttState(StateError::Deserialization(
                rumqttc::v5::mqttbytes::Error::Io(reset())
            ))),
            Ending::ClosedWithoutReason
        );
        assert_eq!(
            Ending::of(&ConnectionError::Io(io::Error::from(
                io::ErrorKind::ConnectionRefused
            ))),
            Ending::Other
        );
    }

    #[test]
    fn the_brokers_reason_is_a_takeover_at_once() {
        let mut watch = TakeoverWatch::default();
        assert_eq!(
            watch.connection_ended(Ending::TakenOver, Some(Duration::from_secs(600))),
            Some(Evidence::ReasonCode)
        );
    }

    #[test]
    fn three_quick_closes_in_a_row_are_a_takeover() {
        let mut watch = TakeoverWatch::default();
        let quick = Some(Duration::from_millis(700));
        assert_eq!(
            watch.connection_ended(Ending::ClosedWithoutReason, quick),
            None
        );
        assert_eq!(
            watch.connection_ended(Ending::ClosedWithoutReason, quick),
            None
        );
        assert_eq!(
            watch.connection_ended(Ending::ClosedWithoutReason, quick),
            Some(Evidence::QuickCloses(3))
        );
        assert_eq!(
            watch.connection_ended(Ending::ClosedWithoutReason, quick),
            Some(Evidence::QuickCloses(4))
        );
    }

    #[test]
    fn a_long_connection_a_refused_connect_or_another_loss_breaks_the_run() {
        let mut watch = TakeoverWatch::default();
        let quick = Some(Duration::from_millis(700));
        for breaker in [
            (Ending::ClosedWithoutReason, Some(QUICK_CLOSE)),
            (Ending::ClosedWithoutReason, None),
            (Ending::Other, quick),
        ] {
            watch.connection_ended(Ending::ClosedWithoutReason, quick);
            watch.connection_ended(Ending::ClosedWithoutReason, quick);
            assert_eq!(watch.connection_ended(breaker.0, breaker.1), None);
            assert_eq!(
                watch.connection_ended(Ending::ClosedWithoutReason, quick),
                None
            );
            watch.connection_ended(Ending::Other, None);
        }
    }
}
