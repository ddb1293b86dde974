//! Hybrid logical clocks: the state store's versions (`__ts`) and fencing
//! tokens (`__ft`).
//!
//! Text form `{wall ms}:{counter}:{node id}`. The SDKs write the numbers
//! zero-padded (`001696374425000:00000:client`), the service unpadded; both
//! parse, and we always write the padded form, as the SDKs do.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

/// How far ahead of the local clock an HLC may be before it is refused.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// A hybrid logical clock value. Ordered by (wall clock, counter, node id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// Orders events within one millisecond.
    pub counter: u64,
    /// Who produced the value (`StateStore` for the service).
    pub node: NodeId,
}

/// The node id the state store service stamps its versions with.
pub const STATE_STORE_NODE: &str = "StateStore";

/// Who produced an HLC value: a string, compared, ordered and hashed as
/// one. The service's id ([`STATE_STORE_NODE`]), which nearly every
/// version carries, is held without an allocation, and any other is
/// shared, so that a clone of a version allocates nothing: the watch hub
/// keeps two per followed key.
#[derive(Clone)]
pub struct NodeId(Node);

#[derive(Clone)]
enum Node {
    StateStore,
    Other(Arc<str>),
}

impl NodeId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Node::StateStore => STATE_STORE_NODE,
            Node::Other(node) => node,
        }
    }
}

impl From<&str> for NodeId {
    fn from(node: &str) -> Self {
        if node == STATE_STORE_NODE {
            Self(Node::StateStore)
        } else {
            Self(Node::Other(Arc::from(node)))
        }
    }
}

impl From<String> for NodeId {
    fn from(node: String) -> Self {
        Self::from(node.as_str())
    }
}

impl Deref for NodeId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for NodeId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for NodeId {}

impl PartialEq<str> for NodeId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for NodeId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for NodeId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an HLC was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HlcError {
    /// Not `{digits}:{digits}:{node}`.
    #[error("malformed hybrid logical clock {0:?}")]
    Malformed(String),
    /// More than [`MAX_CLOCK_SKEW`] ahead of the local clock.
    #[error("hybrid logical clock is more than 60 s ahead of the local clock")]
    TooFarInFuture,
    /// The counter cannot be incremented any more.
    #[error("hybrid logical clock counter would overflow")]
    CounterOverflow,
}

impl Hlc {
    /// A clock at `wall_ms` with a zero counter.
    pub fn new(wall_ms: u64, node: impl Into<NodeId>) -> Self {
        Self {
            wall_ms,
            counter: 0,
            node: node.into(),
        }
    }

    /// Parses the padded or unpadded text form.
    pub fn parse(text: &str) -> Result<Self, HlcError> {
        let malformed = || HlcError::Malformed(text.chars().take(64).collect());
        let mut parts = text.split(':');
        let (Some(wall), Some(counter), Some(node), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        let number = |digits: &str| {
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse::<u64>().ok()
        };
        let wall_ms = number(wall).ok_or_else(malformed)?;
        let counter = number(counter).ok_or_else(malformed)?;
        // A version travels on into headers and SSE ids, where control
        // characters would break (or forge) the framing.
        if node.chars().any(char::is_control) {
            return Err(malformed());
        }
        Ok(Self {
            wall_ms,
            counter,
            node: NodeId::from(node),
        })
    }

    /// Whether this value is more than [`MAX_CLOCK_SKEW`] ahead of `now_ms`.
    pub fn is_too_far_ahead_of(&self, now_ms: u64) -> bool {
        self.wall_ms > now_ms.saturating_add(MAX_CLOCK_SKEW.as_millis() as u64)
    }

    fn check(&self, now_ms: u64) -> Result<(), HlcError> {
        if self.counter == u64::MAX {
            return Err(HlcError::CounterOverflow);
        }
        if self.is_too_far_ahead_of(now_ms) {
            return Err(HlcError::TooFarInFuture);
        }
        Ok(())
    }

    /// The smallest value after `self` from the same node: the counter
    /// bumped (or, at its limit, the next millisecond).
    pub fn successor(&self) -> Hlc {
        let (wall_ms, counter) = match self.counter.checked_add(1) {
            Some(counter) => (self.wall_ms, counter),
            None => (self.wall_ms.saturating_add(1), 0),
        };
        Hlc {
            wall_ms,
            counter,
            node: self.node.clone(),
        }
    }

    /// The send rule: move to `now_ms` if the wall clock advanced, else bump
    /// the counter.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), HlcError> {
        if now_ms > self.wall_ms {
            self.wall_ms = now_ms;
            self.counter = 0;
        } else {
            self.check(now_ms)?;
            self.counter += 1;
        }
        Ok(())
    }

    /// The receive rule: afterwards `self` is greater than both its old value
    /// and `other` (ignoring node ids), and never behind `now_ms`.
    pub fn merge(&mut self, other: &Hlc, now_ms: u64) -> Result<(), HlcError> {
        if now_ms > self.wall_ms && now_ms > other.wall_ms {
            self.wall_ms = now_ms;
            self.counter = 0;
        } else if other.wall_ms == self.wall_ms {
            let highest = if self.counter >= other.counter {
                &*self
            } else {
                other
            };
            highest.check(now_ms)?;
            self.counter = highest.counter + 1;
        } else if self.wall_ms > other.wall_ms {
            self.check(now_ms)?;
            self.counter += 1;
        } else {
            other.check(now_ms)?;
            self.wall_ms = other.wall_ms;
            self.counter = other.counter + 1;
        }
        Ok(())
    }

    /// The padded text form, as [`fmt::Display`] writes it, sized at once:
    /// every request carries one (`__ts`) and every read an `ETag`.
    pub fn encode(&self) -> String {
        let mut text =
            String::with_capacity(WALL_DIGITS + 1 + COUNTER_DIGITS + 1 + self.node.len());
        self.push_to(&mut text);
        text
    }

    /// Appends the padded text form to `out`.
    pub fn push_to(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = self.write_padded(out);
    }

    /// Writes `{wall:0>15}:{counter:0>5}:{node}` with integer formatting
    /// (itoa) rather than `core::fmt`'s padding machinery.
    fn write_padded(&self, out: &mut impl fmt::Write) -> fmt::Result {
        write_zero_padded(out, self.wall_ms, WALL_DIGITS)?;
        out.write_char(':')?;
        write_zero_padded(out, self.counter, COUNTER_DIGITS)?;
        out.write_char(':')?;
        out.write_str(&self.node)
    }
}

/// The padded text form's digits for the wall clock and the counter (more
/// when a number is wider), as the SDKs write them.
const WALL_DIGITS: usize = 15;
const COUNTER_DIGITS: usize = 5;

/// `n` in decimal, zero-padded on the left to `width` digits.
fn write_zero_padded(out: &mut impl fmt::Write, n: u64, width: usize) -> fmt::Result {
    const ZEROS: &str = "000000000000000";
    debug_assert!(width <= ZEROS.len());
    let mut buffer = itoa::Buffer::new();
    let digits = buffer.format(n);
    out.write_str(&ZEROS[..width.min(ZEROS.len()).saturating_sub(digits.len())])?;
    out.write_str(digits)
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_padded(f)
    }
}

impl FromStr for Hlc {
    type Err = HlcError;

    fn from_str(text: &str) -> Result<Self, HlcError> {
        Self::parse(text)
    }
}

/// Milliseconds since the Unix epoch by the system clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// A timestamp from [`HybridClock::now`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The value to send.
    pub hlc: Hlc,
    /// The clock was more than [`MAX_CLOCK_SKEW`] ahead of the system clock
    /// and fell back to it.
    pub fell_back: bool,
}

/// One HLC shared by everything that sends on behalf of a node (the
/// gateway's pool, the emulator's store).
#[derive(Debug)]
pub struct HybridClock {
    state: Mutex<Hlc>,
}

impl HybridClock {
    /// A clock for `node`, starting at the system time.
    pub fn new(node: impl Into<NodeId>) -> Self {
        Self {
            state: Mutex::new(Hlc::new(now_ms(), node)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hlc> {
        // The guarded value is always consistent, so a poisoned lock is usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The timestamp for an outgoing message (send rule). Never fails.
    ///
    /// A clock more than [`MAX_CLOCK_SKEW`] ahead of the system clock (the
    /// system clock stepped back: NTP, a resumed VM) falls back to the
    /// system clock, with a warning and `fell_back` set for the caller to
    /// count. Our clock only stamps `__ts`, and a store refuses a `__ts` a
    /// minute ahead of its own clock, so staying ahead would fail every
    /// request; the store orders versions by its own clock, so stepping
    /// back loses nothing. A counter at its maximum moves on one millisecond.
    pub fn now(&self) -> Stamp {
        let now = now_ms();
        let mut clock = self.lock();
        match clock.tick(now) {
            Ok(()) => Stamp {
                hlc: clock.clone(),
                fell_back: false,
            },
            Err(HlcError::CounterOverflow) => {
                clock.wall_ms = clock.wall_ms.saturating_add(1);
                clock.counter = 0;
                Stamp {
                    hlc: clock.clone(),
                    fell_back: false,
                }
            }
            Err(error) => {
                tracing::warn!(
                    clock = %clock,
                    system_ms = now,
                    %error,
                    "the clock is more than 60 s ahead of the system clock; \
                     falling back to the system clock"
                );
                clock.wall_ms = now;
                clock.counter = 0;
                Stamp {
                    hlc: clock.clone(),
                    fell_back: true,
                }
            }
        }
    }

    /// Merges a received value in and returns the resulting clock value.
    pub fn observe(&self, received: &Hlc) -> Result<Hlc, HlcError> {
        let mut clock = self.lock();
        clock.merge(received, now_ms())?;
        Ok(clock.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_padded_and_unpadded_forms() {
        let padded = Hlc::parse("001696374425000:00000:client-7").unwrap();
        assert_eq!(padded, Hlc::new(1_696_374_425_000, "client-7"));
        let unpadded = Hlc::parse("1696374425000:1:StateStore").unwrap();
        assert_eq!(unpadded.wall_ms, 1_696_374_425_000);
        assert_eq!(unpadded.counter, 1);
        assert_eq!(unpadded.node, "StateStore");
    }

    #[test]
    fn the_services_node_id_is_held_without_an_allocation() {
        let version = Hlc::parse("1696374425000:1:StateStore").unwrap();
        assert!(matches!(version.node.0, Node::StateStore));
        assert!(matches!(
            NodeId::from(String::from(STATE_STORE_NODE)).0,
            Node::StateStore
        ));
        // Byte-exact round trip, and equal to the same text held otherwise.
        assert_eq!(version.to_string(), "001696374425000:00001:StateStore");
        assert_eq!(version.node, "StateStore");
        assert_eq!(version.node, NodeId::from("StateStore"));
    }

    #[test]
    fn other_node_ids_are_shared_by_clones_and_compare_as_text() {
        let version = Hlc::parse("5:0:statestore").unwrap();
        let Node::Other(node) = &version.node.0 else {
            panic!("a node id other than the service's is held as text");
        };
        let copy = version.clone();
        let Node::Other(copied) = &copy.node.0 else {
            panic!("a clone holds the same node id");
        };
        assert!(Arc::ptr_eq(node, copied), "a clone shares the node id");
        assert_eq!(version.to_string(), "000000000000005:00000:statestore");
        assert_ne!(version.node, NodeId::from(STATE_STORE_NODE));
        // Ordered as the text is, whichever way each is held.
        for (a, b) in [
            ("StateStore", "Z"),
            ("A", "StateStore"),
            ("StateStore", "StateStorf"),
        ] {
            let order = NodeId::from(a).cmp(&NodeId::from(b));
            assert_eq!(order, std::cmp::Ordering::Less, "{a} < {b}");
        }
        // Held either way, the same text is the same id, with the same hash.
        let held_as_text = NodeId(Node::Other(Arc::from(STATE_STORE_NODE)));
        assert_eq!(held_as_text, NodeId::from(STATE_STORE_NODE));
        let state = std::hash::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &held_as_text),
            std::hash::BuildHasher::hash_one(&state, NodeId::from(STATE_STORE_NODE))
        );
    }

    #[test]
    fn formats_padded_like_the_sdks() {
        let hlc = Hlc::new(1_696_374_425_000, "client-7");
        assert_eq!(hlc.to_string(), "001696374425000:00000:client-7");
        assert_eq!(Hlc::parse(&hlc.to_string()).unwrap(), hlc);
        let small = Hlc {
            wall_ms: 5,
            counter: 123_456,
            node: "n".into(),
        };
        assert_eq!(small.to_string(), "000000000000005:123456:n");
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "1:2",
            "1:2:3:4",
            "a:0:n",
            "1:b:n",
            "+1:0:n",
            "1:-1:n",
            ":0:n",
            "1::n",
            "99999999999999999999999:0:n",
            " 1:0:n",
        ] {
            assert!(
                matches!(Hlc::parse(bad), Err(HlcError::Malformed(_))),
                "{bad:?} parsed"
            );
        }
        // An empty node id is what the SDKs accept too.
        assert!(Hlc::parse("1:0:").is_ok());
        for forged in ["1:0:a\nid: x", "1:0:a\r", "1:0:\0", "1:0:a\u{85}"] {
            assert!(Hlc::parse(forged).is_err(), "{forged:?} parsed");
        }
    }

    #[test]
    fn orders_by_wall_then_counter_then_node() {
        let a = Hlc::parse("100:5:z").unwrap();
        let b = Hlc::parse("101:0:a").unwrap();
        let c = Hlc::parse("101:1:a").unwrap();
        let d = Hlc::parse("101:1:b").unwrap();
        assert!(a < b && b < c && c < d);
        // Padding does not change the value.
        assert_eq!(
            Hlc::parse("000000000000101:00001:a").unwrap(),
            Hlc::parse("101:1:a").unwrap()
        );
    }

    #[test]
    fn tick_moves_to_now_or_bumps_the_counter() {
        let mut hlc = Hlc::new(1_000, "me");
        hlc.tick(2_000).unwrap();
        assert_eq!((hlc.wall_ms, hlc.counter), (2_000, 0));
        hlc.tick(2_000).unwrap();
        hlc.tick(1_500).unwrap();
        assert_eq!((hlc.wall_ms, hlc.counter), (2_000, 2));
    }

    #[test]
    fn merge_is_greater_than_both_inputs() {
        let now = 10_000;
        let cases = [
            (Hlc::new(5_000, "me"), Hlc::new(6_000, "you")), // now wins
            (Hlc::new(20_000, "me"), Hlc::new(20_000, "you")), // equal walls
            (Hlc::new(30_000, "me"), Hlc::new(20_000, "you")), // self ahead
            (Hlc::new(20_000, "me"), Hlc::new(30_000, "you")), // other ahead
        ];
        for (mut mine, theirs) in cases {
            let before = mine.clone();
            mine.merge(&theirs, now).unwrap();
            let key = |h: &Hlc| (h.wall_ms, h.counter);
            assert!(key(&mine) > key(&before), "{mine} !> {before}");
            assert!(key(&mine) > key(&theirs), "{mine} !> {theirs}");
            assert!(mine.wall_ms >= now);
        }
    }

    #[test]
    fn merge_takes_the_larger_counter_on_equal_walls() {
        let mut mine = Hlc {
            wall_ms: 50,
            counter: 2,
            node: "me".into(),
        };
        let theirs = Hlc {
            wall_ms: 50,
            counter: 9,
            node: "you".into(),
        };
        mine.merge(&theirs, 10).unwrap();
        assert_eq!((mine.wall_ms, mine.counter), (50, 10));
    }

    #[test]
    fn skew_beyond_a_minute_is_refused() {
        let now = 1_000_000;
        let ahead = Hlc::new(now + 60_001, "you");
        let mut mine = Hlc::new(now, "me");
        assert_eq!(mine.merge(&ahead, now), Err(HlcError::TooFarInFuture));
        assert!(ahead.is_too_far_ahead_of(now));
        let just_inside = Hlc::new(now + 60_000, "you");
        assert!(!just_inside.is_too_far_ahead_of(now));
        mine.merge(&just_inside, now).unwrap();
        assert_eq!(mine.wall_ms, now + 60_000);
    }

    #[test]
    fn counter_overflow_is_refused() {
        let mut mine = Hlc {
            wall_ms: 50,
            counter: u64::MAX,
            node: "me".into(),
        };
        assert_eq!(mine.tick(10), Err(HlcError::CounterOverflow));
    }

    #[test]
    fn a_clock_a_minute_ahead_of_the_system_clock_still_stamps() {
        // The system clock stepped back two minutes (NTP, a VM resumed).
        let clock = HybridClock {
            state: Mutex::new(Hlc::new(now_ms() + 120_000, "gw")),
        };
        let stamp = clock.now();
        assert!(stamp.fell_back);
        assert!(!stamp.hlc.is_too_far_ahead_of(now_ms()));
        let next = clock.now();
        assert!(!next.fell_back, "once back in step it stays there");
        assert!(next.hlc > stamp.hlc);
    }

    #[test]
    fn a_shared_clock_with_its_counter_at_the_maximum_moves_on() {
        let wall_ms = now_ms() + 1_000;
        let clock = HybridClock {
            state: Mutex::new(Hlc {
                wall_ms,
                counter: u64::MAX,
                node: "gw".into(),
            }),
        };
        let stamp = clock.now();
        assert!(!stamp.fell_back);
        assert_eq!((stamp.hlc.wall_ms, stamp.hlc.counter), (wall_ms + 1, 0));
    }

    #[test]
    fn shared_clock_is_strictly_increasing() {
        let clock = HybridClock::new("gw");
        let mut last = clock.now().hlc;
        for _ in 0..1_000 {
            let next = clock.now().hlc;
            assert!(next > last);
            last = next;
        }
        let remote = Hlc::new(now_ms() + 30_000, "StateStore");
        let merged = clock.observe(&remote).unwrap();
        assert!((merged.wall_ms, merged.counter) > (remote.wall_ms, remote.counter));
        assert!(clock.now().hlc > merged);
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// Node ids as they can appear: anything without the `:` separator or
    /// control characters.
    fn node() -> impl Strategy<Value = String> {
        "[^:\\p{Cc}]{0,24}"
    }

    fn hlc() -> impl Strategy<Value = Hlc> {
        (any::<u64>(), any::<u64>(), node()).prop_map(|(wall_ms, counter, node)| Hlc {
            wall_ms,
            counter,
            node: node.into(),
        })
    }

    /// Clocks near the present, where tick and merge do their work.
    fn recent_hlc(now: u64) -> impl Strategy<Value = Hlc> {
        (now - 120_000..now + 120_000, 0u64..1_000, node()).prop_map(|(wall_ms, counter, node)| {
            Hlc {
                wall_ms,
                counter,
                node: node.into(),
            }
        })
    }

    const NOW: u64 = 1_700_000_000_000;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn display_parses_back_to_the_same_clock(hlc in hlc()) {
            prop_assert_eq!(Hlc::parse(&hlc.to_string()), Ok(hlc));
        }

        #[test]
        fn encode_writes_what_padded_formatting_writes(
            hlc in prop_oneof![
                hlc(),
                // Numbers of every width, so that padding is exercised.
                (0u32..17, 0u32..7)
                    .prop_flat_map(|(wall, counter)| {
                        (0..10u64.pow(wall), 0..10u64.pow(counter), node())
                    })
                    .prop_map(|(wall_ms, counter, node)| Hlc { wall_ms, counter, node: node.into() }),
            ]
        ) {
            let padded = format!("{:0>15}:{:0>5}:{}", hlc.wall_ms, hlc.counter, hlc.node);
            prop_assert_eq!(hlc.to_string(), padded.clone());
            prop_assert_eq!(hlc.encode(), padded);
        }

        #[test]
        fn unpadded_text_parses_to_the_same_clock(hlc in hlc()) {
            let text = format!("{}:{}:{}", hlc.wall_ms, hlc.counter, hlc.node);
            prop_assert_eq!(Hlc::parse(&text), Ok(hlc));
        }

        #[test]
        fn any_text_parses_or_is_malformed(text in any::<String>()) {
            match Hlc::parse(&text) {
                Ok(hlc) => prop_assert_eq!(Hlc::parse(&hlc.to_string()), Ok(hlc)),
                Err(error) => prop_assert!(matches!(error, HlcError::Malformed(_))),
            }
        }

        #[test]
        fn clock_like_text_parses_or_is_malformed(
            text in "[0-9]{0,22}:[0-9+-]{0,22}:[a-zA-Z:]{0,4}"
        ) {
            if let Ok(hlc) = Hlc::parse(&text) {
                prop_assert_eq!(Hlc::parse(&hlc.to_string()), Ok(hlc));
            }
        }

        #[test]
        fn order_is_the_order_of_the_parts(a in hlc(), b in hlc()) {
            let parts = |h: &Hlc| (h.wall_ms, h.counter, h.node.as_str().to_owned());
            prop_assert_eq!(a.cmp(&b), parts(&a).cmp(&parts(&b)));
        }

        #[test]
        fn tick_moves_strictly_forward(mut hlc in recent_hlc(NOW), now in NOW - 1_000..NOW + 1_000) {
            let before = (hlc.wall_ms, hlc.counter);
            if hlc.tick(now).is_ok() {
                prop_assert!((hlc.wall_ms, hlc.counter) > before);
                prop_assert!(hlc.wall_ms >= now);
            }
        }

        #[test]
        fn merge_passes_both_clocks_or_refuses(
            mut mine in recent_hlc(NOW),
            theirs in recent_hlc(NOW),
            now in NOW - 1_000..NOW + 1_000,
        ) {
            let before = (mine.wall_ms, mine.counter);
            match mine.merge(&theirs, now) {
                Ok(()) => {
                    prop_assert!((mine.wall_ms, mine.counter) > before);
                    prop_assert!((mine.wall_ms, mine.counter) > (theirs.wall_ms, theirs.counter));
                    prop_assert!(mine.wall_ms >= now);
                }
                Err(error) => prop_assert_eq!(error, HlcError::TooFarInFuture),
            }
        }

        #[test]
        fn merge_never_panics_at_the_extremes(
            mut mine in hlc(),
            theirs in hlc(),
            now in any::<u64>(),
        ) {
            let _ = mine.merge(&theirs, now);
            let _ = mine.tick(now);
        }
    }
}
