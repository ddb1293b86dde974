//! The reconnect delays of every MQTT connection of this crate (the
//! gateway's pool members and the emulator).

use std::time::Duration;

use tokio::time::Instant;

/// First reconnect delay; doubles per failed attempt up to [`BACKOFF_MAX`].
const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Longest reconnect delay. It bounds how long a returning broker waits
/// for us: a member is back (and `/readyz` 200) within this plus one
/// connect, which keeps the promise of being ready within 2 s.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a connection must have served before its loss restarts the
/// backoff from the shortest delay.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Exponential backoff with "equal jitter": half the delay fixed, half
/// random, so clients of many processes do not reconnect in lockstep.
#[derive(Debug, Default)]
pub struct Backoff {
    attempts: u32,
}

impl Backoff {
    /// How long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = BACKOFF_INITIAL
            .saturating_mul(1u32 << self.attempts.min(16))
            .min(BACKOFF_MAX);
        self.attempts = self.attempts.saturating_add(1);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// A connection ended that served (was subscribed) since `served_since`.
    /// Only one that stayed up a while restarts from the shortest delay, so
    /// a broker that accepts and then drops us (two clients sharing a
    /// client id take each other's session) is not hammered.
    pub fn connection_ended(&mut self, served_since: Option<Instant>) {
        if served_since.is_some_and(|at| at.elapsed() >= STABLE_AFTER) {
            self.attempts = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_maximum() {
        let mut backoff = Backoff::default();
        let mut ceiling = BACKOFF_INITIAL;
        for _ in 0..20 {
            let delay = backoff.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} vs {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(BACKOFF_MAX);
        }
        // A connection that never served, or not for long, keeps the delay up.
        backoff.connection_ended(None);
        backoff.connection_ended(Some(Instant::now()));
        assert!(backoff.next_delay() >= BACKOFF_MAX / 2);
    }

    #[test]
    fn a_connection_that_served_a_while_restarts_from_the_shortest_delay() {
        let mut backoff = Backoff::default();
        for _ in 0..10 {
            backoff.next_delay();
        }
        let served_since = Instant::now()
            .checked_sub(STABLE_AFTER)
            .expect("the clock is past STABLE_AFTER");
        backoff.connection_ended(Some(served_since));
        assert!(backoff.next_delay() <= BACKOFF_INITIAL);
    }
}
