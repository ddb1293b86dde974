//! A W3C Trace Context (`traceparent` and `tracestate`), parsed strictly.

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName};

/// The MQTT5 user property (and HTTP header) naming the parent span.
pub const TRACEPARENT: &str = "traceparent";

/// The MQTT5 user property (and HTTP header) with vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// `version-traceid-parentid-flags`: the length of a version `00` header.
const TRACEPARENT_LEN: usize = 55;

/// The most list members a `tracestate` may have.
const MAX_STATE_MEMBERS: usize = 32;

/// The `tracestate` length passed on: the W3C minimum a vendor must
/// propagate; longer ones lose members (large ones first), which keeps the
/// store request's envelope bounded.
const MAX_STATE_BYTES: usize = 512;

/// Members longer than this go first when a `tracestate` must shrink.
const LARGE_STATE_MEMBER: usize = 128;

/// The longest `tracestate` read, over all its lines: 32 members of the
/// longest key and value (256 bytes each) with their `=` and `,`. A longer
/// one has too many members or padding no sender needs, and is dropped
/// unread, so that reading it costs what reading any header costs.
const MAX_STATE_READ: usize = MAX_STATE_MEMBERS * (256 + 1 + 256 + 1);

/// A caller's trace context: the trace, its parent span, the trace flags
/// (bit 0: sampled) and the vendors' `tracestate`, if any.
#[derive(Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
    state: Option<Arc<str>>,
    /// The parent is a span this gateway exports (see [`super::Span`]):
    /// store requests under it get spans of their own.
    exported: bool,
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.state)
            .finish()
    }
}

impl TraceContext {
    /// The context of an HTTP request: `None` without exactly one valid
    /// `traceparent`. A malformed `tracestate` is dropped (the
    /// `traceparent` still counts); several are joined in order.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        // Constant names: no parsing of the name on every request.
        const PARENT: HeaderName = HeaderName::from_static(TRACEPARENT);
        const STATE: HeaderName = HeaderName::from_static(TRACESTATE);
        let mut parents = headers.get_all(&PARENT).iter();
        let parent = parents.next()?;
        if parents.next().is_some() {
            return None;
        }
        let states = headers.get_all(&STATE).iter().map(|value| value.as_bytes());
        Self::parse(parent.as_bytes(), states)
    }

    /// Parses a `traceparent` and the `tracestate` header lines; see
    /// [`TraceContext::from_headers`].
    ///
    /// A version above `00` is read as `00` (its first 55 characters,
    /// followed by `-` or nothing), as the W3C specification asks; version
    /// `ff`, upper-case hex and all-zero ids are invalid.
    pub fn parse<'a>(
        traceparent: &[u8],
        tracestate: impl Iterator<Item = &'a [u8]>,
    ) -> Option<Self> {
        let text = traceparent;
        if text.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(&text[0..2])?;
        match version {
            0xff => return None,
            0 if text.len() != TRACEPARENT_LEN => return None,
            _ if text.len() > TRACEPARENT_LEN && text[TRACEPARENT_LEN] != b'-' => return None,
            _ => {}
        }
        if text[2] != b'-' || text[35] != b'-' || text[52] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        hex_into(&text[3..35], &mut trace_id)?;
        let mut parent_id = [0; 8];
        hex_into(&text[36..52], &mut parent_id)?;
        let flags = hex_byte(&text[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags,
            state: parse_state(tracestate),
            exported: false,
        })
    }

    /// The context under a span this gateway exports, with the caller's
    /// `tracestate`.
    pub(super) fn of_span(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        flags: u8,
        state: Option<Arc<str>>,
    ) -> Self {
        Self {
            trace_id,
            parent_id: span_id,
            flags,
            state,
            exported: true,
        }
    }

    /// Whether the parent is a span this gateway exports.
    pub fn exported(&self) -> bool {
        self.exported
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The `tracestate`, shared.
    pub(super) fn state(&self) -> Option<Arc<str>> {
        self.state.clone()
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The parent span's id.
    pub fn parent_id(&self) -> [u8; 8] {
        self.parent_id
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` value to pass on (version `00`).
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(TRACEPARENT_LEN);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.parent_id);
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }

    /// A span for the request's log lines, with `trace_id` and `span_id`
    /// (the parent span: the gateway's server span when spans are
    /// exported, else the caller's).
    pub fn log_span(&self) -> tracing::Span {
        let mut trace_id = String::with_capacity(32);
        push_hex(&mut trace_id, &self.trace_id);
        let mut span_id = String::with_capacity(16);
        push_hex(&mut span_id, &self.parent_id);
        tracing::info_span!("request", trace_id, span_id)
    }

    /// The `tracestate` value to pass on, if the caller sent a valid one.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }
}

fn hex_digit(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    }
}

/// Two lower-case hex digits.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    Some(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?)
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = hex_byte(pair)?;
    }
    Some(())
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

/// The members of `tracestate` lines, joined by `,` without blanks; `None`
/// when there are none or any is malformed, duplicated or one too many.
/// Reading stops at the limits: past [`MAX_STATE_READ`] bytes or at the
/// 33rd member, the rest is not looked at.
fn parse_state<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Option<Arc<str>> {
    // With their keys, so that the duplicate check compares at most 32
    // keys, each parsed once.
    let mut members: Vec<(&[u8], &[u8])> = Vec::new();
    let mut read = 0;
    for line in lines {
        read += line.len() + 1;
        if read > MAX_STATE_READ {
            return None;
        }
        for member in line.split(|&byte| byte == b',') {
            let member = member.trim_ascii();
            if member.is_empty() {
                continue;
            }
            if members.len() == MAX_STATE_MEMBERS {
                return None;
            }
            let key = state_member_key(member)?;
            if members.iter().any(|&(_, seen)| seen == key) {
                return None;
            }
            members.push((member, key));
        }
    }
    let mut members: Vec<&[u8]> = members.into_iter().map(|(member, _)| member).collect();
    if members.is_empty() {
        return None;
    }
    let joined_len = |members: &[&[u8]]| {
        members.iter().map(|member| member.len()).sum::<usize>() + members.len() - 1
    };
    if joined_len(&members) > MAX_STATE_BYTES {
        members.retain(|member| member.len() <= LARGE_STATE_MEMBER);
        while !members.is_empty() && joined_len(&members) > MAX_STATE_BYTES {
            members.pop();
        }
        if members.is_empty() {
            return None;
        }
    }
    // Every byte was checked to be printable ASCII.
    let text = members
        .iter()
        .map(|member| String::from_utf8_lossy(member))
        .collect::<Vec<_>>()
        .join(",");
    Some(Arc::from(text))
}

/// The key of a valid `key=value` list member.
fn state_member_key(member: &[u8]) -> Option<&[u8]> {
    let at = member.iter().position(|&byte| byte == b'=')?;
    let (key, value) = (&member[..at], &member[at + 1..]);
    (valid_state_key(key) && valid_state_value(value)).then_some(key)
}

/// `simple-key` or `tenant-id@system-id`.
fn valid_state_key(key: &[u8]) -> bool {
    let rest =
        |byte: &u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"_-*/".contains(byte);
    match key.iter().position(|&byte| byte == b'@') {
        None => {
            key.len() <= 256
                && key.first().is_some_and(u8::is_ascii_lowercase)
                && key[1..].iter().all(rest)
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            (1..=241).contains(&tenant.len())
                && (tenant[0].is_ascii_lowercase() || tenant[0].is_ascii_digit())
                && tenant[1..].iter().all(rest)
                && (1..=14).contains(&system.len())
                && system[0].is_ascii_lowercase()
                && system[1..].iter().all(rest)
        }
    }
}

/// 1 to 256 printable characters but `,` and `=`, not ending in a space.
fn valid_state_value(value: &[u8]) -> bool {
    (1..=256).contains(&value.len())
        && value
            .iter()
            .all(|&byte| (0x20..=0x7e).contains(&byte) && byte != b',' && byte != b'=')
        && value.last() != Some(&b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn parse(parent: &str, states: &[&str]) -> Option<TraceContext> {
        TraceContext::parse(parent.as_bytes(), states.iter().map(|s| s.as_bytes()))
    }

    #[test]
    fn a_valid_traceparent_is_passed_on_unchanged() {
        let context = parse(PARENT, &[]).unwrap();
        assert_eq!(context.traceparent(), PARENT);
        assert!(context.sampled());
        assert_eq!(context.tracestate(), None);
        let unsampled = parse(&PARENT.replace("-01", "-00"), &[]).unwrap();
        assert!(!unsampled.sampled());
        assert!(unsampled.traceparent().ends_with("-00"));
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            // upper case
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            // all-zero ids
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            // version ff, version 00 with a tail, a bad separator
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",
            "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
            " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            // a later version must still put `-` after the flags
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",
        ] {
            assert_eq!(parse(bad, &["a=b"]), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_version_zero() {
        let context = parse(
            "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds",
            &[],
        )
        .unwrap();
        assert_eq!(context.traceparent(), PARENT);
    }

    #[test]
    fn tracestate_lines_are_joined_and_a_malformed_one_dropped() {
        let context = parse(PARENT, &["rojo=00f067aa0ba902b7 ,", " congo=t61rcWkgMzE"]).unwrap();
        assert_eq!(
            context.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let tenant = parse(PARENT, &["fw529a3039@dt=x"]).unwrap();
        assert_eq!(tenant.tracestate(), Some("fw529a3039@dt=x"));
        for bad in [
            "Rojo=1",
            "rojo",
            "rojo=1,rojo=2",
            "rojo=a\tb",
            "rojo=a=b",
            "@x=1",
        ] {
            let context = parse(PARENT, &[bad]).unwrap();
            assert_eq!(context.tracestate(), None, "{bad:?}");
        }
        let too_many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
        assert_eq!(parse(PARENT, &too_many).unwrap().tracestate(), None);
    }

    #[test]
    fn thirty_two_members_of_the_longest_size_are_read_and_anything_longer_dropped() {
        // Keys and values of 256 bytes: the largest valid tracestate.
        let longest: Vec<String> = (0..32)
            .map(|i| format!("k{i:02}{}={}", "k".repeat(253), "v".repeat(256)))
            .collect();
        let line = longest.join(",");
        assert_eq!(line.len(), MAX_STATE_READ - 1);
        // Valid (too large to pass on whole, so it shrinks to nothing).
        assert_eq!(parse(PARENT, &[&line]).unwrap().tracestate(), None);
        let with_small = format!("{line},a=1");
        assert_eq!(parse(PARENT, &[&with_small]).unwrap().tracestate(), None);
        let small_first = format!("a=1,{}", longest[1..].join(","));
        assert_eq!(
            parse(PARENT, &[&small_first]).unwrap().tracestate(),
            Some("a=1")
        );
        // One byte of padding more than the longest is dropped unread.
        let padded = format!("a=1{}", " ".repeat(MAX_STATE_READ));
        assert_eq!(parse(PARENT, &[&padded]).unwrap().tracestate(), None);
    }

    #[test]
    fn a_long_tracestate_loses_large_members_first_then_the_last() {
        let large = format!("big={}", "x".repeat(200));
        let small: Vec<String> = (0..31)
            .map(|i| format!("k{i:02}={}", "y".repeat(12)))
            .collect();
        let mut lines = vec![large.as_str()];
        lines.extend(small.iter().map(String::as_str));
        let state = parse(PARENT, &lines).unwrap();
        let state = state.tracestate().unwrap();
        assert!(state.len() <= MAX_STATE_BYTES);
        assert!(state.starts_with("k00="));
        assert!(!state.contains("big="));
        // 31 members of 16 bytes and their commas are 526 bytes: the last goes.
        assert_eq!(state.split(',').count(), 30);
    }
}
