//! A linearizability checker for histories of one key (a register), with
//! the Wing & Gong / Lowe search and the memoisation of Porcupine: a cache
//! of (set of linearized operations, register state) already explored. The
//! search takes any model ([`search_model`]); [`dapr`] is Dapr's state API
//! as a multi-key store with transactions.
//!
//! No well-kept crate checks recorded histories (`lincheck` drives data
//! structures under loom), so this is small and local. Operations whose
//! outcome is unknown (504, connection error) get an infinite return time
//! and any output: they may take effect at any point after their call, or
//! never observably.
//!
//! Watch streams are checked separately ([`check_watch`]): versions never go
//! back, every value seen was written, and the last state is the final one.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;

pub mod dapr;

/// What a client asked for (values are unique per write).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// `PUT`.
    Put(String),
    /// `PUT` + `If-None-Match: *`.
    PutNx(String),
    /// `PUT ?nex=true`.
    PutNex(String),
    /// `GET`.
    Get,
    /// `DELETE`.
    Delete,
    /// `DELETE ?value=`.
    Vdel(String),
}

/// What it was told.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Output {
    /// A write applied (200/201/204).
    Applied,
    /// A condition failed or the key was absent (412, 404 on a write).
    NotApplied,
    /// A read: the value or absence.
    Read(Option<String>),
    /// No answer that says what happened (504, 503 after sending,
    /// connection error): may or may not have taken effect.
    Unknown,
}

/// What an answer says of whether its operation took effect.
pub trait Outcome: fmt::Debug {
    /// No answer that says what happened: it may or may not have.
    fn is_unknown(&self) -> bool;
}

impl Outcome for Output {
    fn is_unknown(&self) -> bool {
        *self == Output::Unknown
    }
}

/// One operation of a history, of any model. Times are any monotonic
/// clock (ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed<I, O> {
    /// Which client issued it (for reports).
    pub client: usize,
    /// What was asked.
    pub input: I,
    /// When it was called.
    pub call: u64,
    /// When it returned (ignored when the outcome is unknown).
    pub ret: u64,
    /// What came back.
    pub output: O,
}

impl<I, O: Outcome> Timed<I, O> {
    /// When it was called, and when it returned if that is known (an
    /// unknown outcome may take effect any time after its call).
    pub fn interval(&self) -> (u64, Option<u64>) {
        (self.call, (!self.output.is_unknown()).then_some(self.ret))
    }
}

impl<I: fmt::Debug, O: Outcome> fmt::Display for Timed<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ret = if self.output.is_unknown() {
            "inf".to_owned()
        } else {
            self.ret.to_string()
        };
        write!(
            f,
            "client {:>2} [{:>12}, {:>12}] {:?} -> {:?}",
            self.client, self.call, ret, self.input, self.output
        )
    }
}

/// One operation of a register history.
pub type Operation = Timed<Input, Output>;

/// The register: the value of the key, or absence.
type State = Option<String>;

/// The sequential specification: `Some(next state)` if `op` may take
/// effect in `state` with the output it had.
fn step(state: &State, op: &Operation) -> Option<State> {
    let unknown = op.output == Output::Unknown;
    let (applies, next) = match &op.input {
        Input::Put(value) => (true, Some(value.clone())),
        Input::PutNx(value) => (state.is_none(), Some(value.clone())),
        Input::PutNex(value) => (
            state.is_none() || state.as_ref() == Some(value),
            Some(value.clone()),
        ),
        Input::Delete => (state.is_some(), None),
        Input::Vdel(value) => (state.as_ref() == Some(value), None),
        Input::Get => {
            return (unknown || op.output == Output::Read(state.clone())).then(|| state.clone());
        }
    };
    let next = if applies { next } else { state.clone() };
    let consistent = unknown
        || match op.output {
            Output::Applied => applies,
            Output::NotApplied => !applies,
            Output::Read(_) | Output::Unknown => false,
        };
    consistent.then_some(next)
}

/// The verdict on one history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations explains every output.
    Linearizable,
    /// None does; a small window around the point where every order failed.
    Violation(Report),
    /// The search budget ran out.
    Inconclusive,
}

/// Why a history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The longest prefix of some order that the model accepted.
    pub longest_prefix: Vec<Operation>,
    /// The history less the reads and unapplied writes it needs not to
    /// fail (writes all stay: dropping one could invent a violation).
    pub minimal: Vec<Operation>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The observations that still fail, and the writes around them.
        let observations: Vec<&Operation> =
            self.minimal.iter().filter(|op| observes_only(op)).collect();
        let from = observations.iter().map(|op| op.call).min().unwrap_or(0);
        let to = observations
            .iter()
            .map(|op| op.ret)
            .max()
            .unwrap_or(u64::MAX);
        let earlier = self
            .minimal
            .iter()
            .filter(|op| !observes_only(op) && op.output != Output::Unknown && op.ret < from)
            .count();
        writeln!(
            f,
            "shrunk non-linearizable history: {} operations; {earlier} applied writes \
             returned before the window below are left out of it:",
            self.minimal.len()
        )?;
        for op in &self.minimal {
            let before = op.output != Output::Unknown && op.ret < from;
            if op.call <= to && (observes_only(op) || !before) {
                writeln!(f, "  {op}")?;
            }
        }
        let tail = self.longest_prefix.len().saturating_sub(5);
        writeln!(
            f,
            "longest accepted order: {} operations, ending with:",
            self.longest_prefix.len()
        )?;
        for op in &self.longest_prefix[tail..] {
            writeln!(f, "  {op}")?;
        }
        Ok(())
    }
}

/// A node of the doubly linked list of call and return events.
#[derive(Debug, Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The matching call or return.
    partner: usize,
    prev: usize,
    next: usize,
}

/// Index of the list's head sentinel.
const HEAD: usize = 0;
const NONE: usize = usize::MAX;

/// Whether `history` (one key, initially absent) is linearizable; gives up
/// after `budget` search steps.
pub fn check(history: &[Operation], budget: u64) -> Verdict {
    match search(history, budget) {
        Search::Linearizable => Verdict::Linearizable,
        Search::Inconclusive => Verdict::Inconclusive,
        Search::Violation(longest) => Verdict::Violation(Report {
            longest_prefix: longest.iter().map(|&i| history[i].clone()).collect(),
            minimal: shrink(history, budget),
        }),
    }
}

/// What a search over any model found.
#[derive(Debug)]
pub enum Search {
    /// Some order explains every output.
    Linearizable,
    /// The budget ran out.
    Inconclusive,
    /// No order does: the longest accepted order (indices into the history).
    Violation(Vec<usize>),
}

fn search(history: &[Operation], budget: u64) -> Search {
    search_counting(history, budget, &mut 0)
}

/// [`search`], adding the steps it took to `spent`.
fn search_counting(history: &[Operation], budget: u64, spent: &mut u64) -> Search {
    let intervals: Vec<(u64, Option<u64>)> = history.iter().map(Operation::interval).collect();
    search_model(
        &intervals,
        None,
        |state: &State, op| step(state, &history[op]),
        budget,
        spent,
    )
}

/// The Wing & Gong / Lowe search with Porcupine's memo, for any model: the
/// operations' `(call, return)` times (`None`: unknown outcome, it may take
/// effect any time after its call), the initial state, and `step`, which
/// gives the state after operation `op` if it may take effect in `state`
/// with the output it had. Adds the steps it took to `spent`.
pub fn search_model<S: Clone + Eq + Hash>(
    intervals: &[(u64, Option<u64>)],
    initial: S,
    step: impl Fn(&S, usize) -> Option<S>,
    budget: u64,
    spent: &mut u64,
) -> Search {
    let n = intervals.len();
    if n == 0 {
        return Search::Linearizable;
    }
    // Events sorted by time; a return at the same instant as a call goes
    // after it (a zero-length overlap still counts as concurrent).
    let mut times: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, &(call, ret)) in intervals.iter().enumerate() {
        let ret = ret.map_or(u64::MAX, |ret| ret.max(call));
        times.push((call, false, i));
        times.push((ret, true, i));
    }
    times.sort_unstable();
    // Node 0 is the head sentinel; events are 1..=2n.
    let mut events = vec![
        Event {
            op: NONE,
            is_call: false,
            partner: NONE,
            prev: NONE,
            next: 1,
        };
        2 * n + 1
    ];
    let mut call_of = vec![0; n];
    for (index, &(_, is_return, op)) in times.iter().enumerate() {
        let node = index + 1;
        events[node] = Event {
            op,
            is_call: !is_return,
            partner: NONE,
            prev: node - 1,
            next: if node == 2 * n { NONE } else { node + 1 },
        };
        if is_return {
            let call = call_of[op];
            events[node].partner = call;
            events[call].partner = node;
        } else {
            call_of[op] = node;
        }
    }

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, S)> = HashSet::new();
    let mut stack: Vec<(usize, S)> = Vec::new();
    let mut state: S = initial;
    let mut longest: Vec<usize> = Vec::new();
    let mut entry = events[HEAD].next;
    let mut steps = 0u64;

    let lift = |events: &mut Vec<Event>, call: usize| {
        let ret = events[call].partner;
        for node in [call, ret] {
            let (prev, next) = (events[node].prev, events[node].next);
            events[prev].next = next;
            if next != NONE {
                events[next].prev = prev;
            }
        }
    };
    let unlift = |events: &mut Vec<Event>, call: usize| {
        let ret = events[call].partner;
        for node in [ret, call] {
            let (prev, next) = (events[node].prev, events[node].next);
            events[prev].next = node;
            if next != NONE {
                events[next].prev = node;
            }
        }
    };

    while events[HEAD].next != NONE {
        steps += 1;
        *spent += 1;
        if steps > budget {
            return Search::Inconclusive;
        }
        let event = events[entry];
        if event.is_call {
            let op = event.op;
            if let Some(next) = step(&state, op) {
                linearized[op / 64] |= 1 << (op % 64);
                if cache.insert((linearized.clone(), next.clone())) {
                    stack.push((entry, state));
                    state = next;
                    lift(&mut events, entry);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|&(node, _)| events[node].op).collect();
                    }
                    entry = events[HEAD].next;
                    continue;
                }
                linearized[op / 64] &= !(1 << (op % 64));
            }
            entry = event.next;
        } else {
            // A return whose call is not linearized yet: back up.
            let Some((call, previous)) = stack.pop() else {
                return Search::Violation(longest);
            };
            state = previous;
            let op = events[call].op;
            linearized[op / 64] &= !(1 << (op % 64));
            unlift(&mut events, call);
            entry = events[call].next;
        }
    }
    Search::Linearizable
}

/// Whether dropping `op` can only make a history more linearizable: it
/// changes no state (a read, a write that was not applied).
fn observes_only(op: &Operation) -> bool {
    matches!(op.output, Output::Read(_) | Output::NotApplied)
}

/// The history less every observation (read, unapplied write) that is not
/// needed for the violation, within the search budget. Writes that
/// may have changed the state all stay: dropping one would invent
/// violations. Sorted by call time.
fn shrink(history: &[Operation], budget: u64) -> Vec<Operation> {
    let mut kept: Vec<Operation> = history.to_vec();
    // All the checks together get the budget of one search.
    let mut spent = 0;
    let mut index = kept.len();
    while index > 0 && spent < budget {
        index -= 1;
        if !observes_only(&kept[index]) {
            continue;
        }
        let mut candidate = kept.clone();
        candidate.remove(index);
        if matches!(
            search_counting(&candidate, budget - spent, &mut spent),
            Search::Violation(_)
        ) {
            kept = candidate;
        }
    }
    kept.sort_by_key(|op| op.call);
    kept
}

/// One event of a watch stream, as the checker needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// `sync`, `set`, `delete` (others are not states).
    pub kind: String,
    /// The value, `None` when absent.
    pub value: Option<String>,
    /// The SSE id (the version), if any.
    pub version: Option<String>,
}

/// What is wrong with one watcher's stream, if anything: versions go
/// back, a value nobody wrote, or a last state other than `final_state`.
pub fn check_watch(
    events: &[WatchEvent],
    written: &HashSet<String>,
    final_state: &State,
) -> Result<(), String> {
    let mut last: Option<(u64, u64, String)> = None;
    for (index, event) in events.iter().enumerate() {
        if let Some(value) = &event.value
            && !written.contains(value)
        {
            return Err(format!("event {index} {event:?}: a value nobody wrote"));
        }
        if let Some(version) = &event.version {
            let parsed = parse_version(version)
                .ok_or_else(|| format!("event {index}: unparsable version {version:?}"))?;
            if let Some(previous) = &last
                && parsed < *previous
            {
                return Err(format!(
                    "event {index} {event:?} goes back from version {previous:?}"
                ));
            }
            last = Some(parsed);
        }
    }
    match events.last() {
        Some(event) if event.value != *final_state => Err(format!(
            "last event {event:?} but the key finally is {final_state:?}"
        )),
        _ => Ok(()),
    }
}

fn parse_version(text: &str) -> Option<(u64, u64, String)> {
    let mut parts = text.splitn(3, ':');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.to_owned(),
    ))
}

/// Histories per key.
pub type Histories = HashMap<String, Vec<Operation>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, input: Input, call: u64, ret: u64, output: Output) -> Operation {
        Operation {
            client,
            input,
            call,
            ret,
            output,
        }
    }

    fn put(v: &str) -> Input {
        Input::Put(v.into())
    }

    fn read(v: Option<&str>) -> Output {
        Output::Read(v.map(str::to_owned))
    }

    const BUDGET: u64 = 1_000_000;

    fn linearizable(history: &[Operation]) -> bool {
        match check(history, BUDGET) {
            Verdict::Linearizable => true,
            Verdict::Violation(report) => {
                eprintln!("{report}");
                false
            }
            Verdict::Inconclusive => panic!("inconclusive"),
        }
    }

    #[test]
    fn sequential_and_overlapping_histories_are_linearizable() {
        assert!(linearizable(&[]));
        assert!(linearizable(&[
            op(0, put("a"), 0, 10, Output::Applied),
            op(1, Input::Get, 20, 30, read(Some("a"))),
            op(0, Input::Delete, 40, 50, Output::Applied),
            op(1, Input::Get, 60, 70, read(None)),
            op(1, Input::Delete, 80, 90, Output::NotApplied),
        ]));
        // A read overlapping a write may see either.
        assert!(linearizable(&[
            op(0, put("a"), 0, 100, Output::Applied),
            op(1, Input::Get, 10, 20, read(None)),
            op(2, Input::Get, 30, 40, read(Some("a"))),
        ]));
        // Two overlapping NX: one wins, either one.
        assert!(linearizable(&[
            op(0, Input::PutNx("a".into()), 0, 100, Output::NotApplied),
            op(1, Input::PutNx("b".into()), 10, 90, Output::Applied),
            op(2, Input::Get, 95, 99, read(Some("b"))),
        ]));
        // NEX renews its own value; VDEL only with the right value.
        assert!(linearizable(&[
            op(0, Input::PutNex("a".into()), 0, 10, Output::Applied),
            op(0, Input::PutNex("a".into()), 20, 30, Output::Applied),
            op(1, Input::PutNex("b".into()), 40, 50, Output::NotApplied),
            op(1, Input::Vdel("b".into()), 60, 70, Output::NotApplied),
            op(0, Input::Vdel("a".into()), 80, 90, Output::Applied),
            op(1, Input::Get, 100, 110, read(None)),
        ]));
    }

    #[test]
    fn unknown_outcomes_may_or_may_not_take_effect() {
        // A timed-out write seen later...
        assert!(linearizable(&[
            op(0, put("a"), 0, 10, Output::Unknown),
            op(1, Input::Get, 20, 30, read(None)),
            op(1, Input::Get, 40, 50, read(Some("a"))),
            op(1, Input::Get, 60, 70, read(Some("a"))),
        ]));
        // ... or never.
        assert!(linearizable(&[
            op(0, put("a"), 0, 10, Output::Unknown),
            op(1, Input::Get, 1_000, 1_010, read(None)),
        ]));
        // But not before it was sent.
        assert!(!linearizable(&[
            op(1, Input::Get, 0, 10, read(Some("a"))),
            op(0, put("a"), 20, 30, Output::Unknown),
        ]));
    }

    #[test]
    fn a_stale_read_is_a_violation() {
        assert!(!linearizable(&[
            op(0, put("a"), 0, 10, Output::Applied),
            op(0, put("b"), 20, 30, Output::Applied),
            op(1, Input::Get, 40, 50, read(Some("a"))),
        ]));
    }

    #[test]
    fn a_lost_write_is_a_violation() {
        assert!(!linearizable(&[
            op(0, put("a"), 0, 10, Output::Applied),
            op(1, Input::Get, 20, 30, read(None)),
        ]));
    }

    #[test]
    fn two_successful_nx_are_a_violation() {
        assert!(!linearizable(&[
            op(0, Input::PutNx("a".into()), 0, 100, Output::Applied),
            op(1, Input::PutNx("b".into()), 10, 90, Output::Applied),
        ]));
    }

    #[test]
    fn a_read_that_flips_back_is_a_violation() {
        // Reads see a, then absent, then a again with one write of a.
        assert!(!linearizable(&[
            op(0, put("a"), 0, 100, Output::Applied),
            op(1, Input::Get, 10, 20, read(Some("a"))),
            op(2, Input::Get, 30, 40, read(None)),
        ]));
    }

    #[test]
    fn the_report_shrinks_to_the_operations_that_conflict() {
        let mut history = Vec::new();
        for i in 0..30u64 {
            history.push(op(3, Input::Get, i * 100, i * 100 + 5, read(None)));
        }
        history.push(op(0, put("a"), 5_000, 5_010, Output::Applied));
        history.push(op(1, Input::Get, 5_020, 5_030, read(None)));
        let Verdict::Violation(report) = check(&history, BUDGET) else {
            panic!("not found");
        };
        assert_eq!(report.minimal.len(), 2, "{report}");
        assert_eq!(report.minimal[1].output, read(None));
    }

    #[test]
    fn shrinking_never_drops_a_write_that_explains_a_read() {
        // put a; delete; nex b -> applied; get -> c (c written, not by
        // nex): only the last read is wrong, and the delete must stay.
        let history = [
            op(0, put("a"), 0, 10, Output::Applied),
            op(0, Input::Delete, 20, 30, Output::Applied),
            op(1, Input::PutNex("b".into()), 40, 50, Output::Applied),
            op(1, Input::Get, 60, 70, read(Some("a"))),
        ];
        let Verdict::Violation(report) = check(&history, BUDGET) else {
            panic!("not found");
        };
        assert_eq!(report.minimal.len(), 4, "{report}");
    }

    #[test]
    fn a_wide_history_with_many_unknowns_is_decided() {
        // 200 sequential writes, each followed by a read, with every third
        // write's outcome unknown: the memo keeps this fast.
        let mut history = Vec::new();
        let mut current = None;
        for i in 0..200u64 {
            let value = format!("v{i}");
            let unknown = i % 3 == 0;
            history.push(op(
                0,
                put(&value),
                i * 100,
                i * 100 + 10,
                if unknown {
                    Output::Unknown
                } else {
                    Output::Applied
                },
            ));
            if !unknown {
                current = Some(value);
            }
            history.push(op(
                1,
                Input::Get,
                i * 100 + 50,
                i * 100 + 60,
                Output::Read(current.clone()),
            ));
        }
        assert!(linearizable(&history));
    }

    #[test]
    fn watch_streams_never_go_back_and_end_in_the_final_state() {
        let written: HashSet<String> = ["a", "b"].into_iter().map(String::from).collect();
        let event = |kind: &str, value: Option<&str>, version: &str| WatchEvent {
            kind: kind.into(),
            value: value.map(str::to_owned),
            version: Some(version.into()),
        };
        let good = [
            event("sync", None, "000000000000001:00000:S"),
            event("set", Some("a"), "000000000000002:00000:S"),
            event("sync", Some("a"), "000000000000002:00000:S"),
            event("set", Some("b"), "000000000000002:00001:S"),
        ];
        assert!(check_watch(&good, &written, &Some("b".into())).is_ok());
        assert!(check_watch(&good, &written, &None).is_err(), "final state");
        let back = [
            event("set", Some("b"), "000000000000003:00000:S"),
            event("sync", Some("a"), "000000000000002:00000:S"),
        ];
        assert!(check_watch(&back, &written, &Some("a".into())).is_err());
        let forged = [event("set", Some("zz"), "000000000000003:00000:S")];
        assert!(check_watch(&forged, &written, &Some("zz".into())).is_err());
    }
}
