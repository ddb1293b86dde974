//! Dapr's state API as a multi-key store, for the same search: single-key
//! reads, saves and deletes (each with or without an etag, saves also as
//! `first-write`) and transactions, which apply every item or, on a
//! conflict, none, as one atomic operation; items apply in order, each
//! condition against what the earlier items left (one key may repeat).
//!
//! Etags are the store's versions, which the model cannot predict; a key's
//! state is its value (unique per write) and the etag a read last saw for
//! it (`None` once written again). A read binds the etag it got. The store
//! also gives a key a new version without a new value (an etag write's
//! claim, a transaction's op applied again by whoever rolls it forward), so
//! a read may see a new etag for the same value, and a conditional write
//! may fail even though the last etag seen matches. What the model still
//! rejects: a conditional write that succeeds after its key was written or
//! re-read with another etag (two writers winning with one etag), a
//! `first-write` on a present key, a transaction applied in part, any read
//! of a value that is not the latest.

use std::collections::BTreeMap;

use super::{Outcome, Search, Timed, search_model};

/// One item of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxItem {
    /// The key.
    pub key: String,
    /// The new value; `None`: delete the key.
    pub value: Option<String>,
    /// The etag the item is conditional on.
    pub etag: Option<String>,
    /// `first-write` without an etag: only if the key is absent.
    pub first_write: bool,
}

/// What a client asked for (written values are unique).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `GET /v1.0/state/{store}/{key}`.
    Get(String),
    /// A save of one item.
    Save {
        /// The key.
        key: String,
        /// The new value.
        value: String,
        /// The etag it is conditional on.
        etag: Option<String>,
        /// `first-write` (without an etag: only if absent).
        first_write: bool,
    },
    /// `DELETE /v1.0/state/{store}/{key}`, with `If-Match` when `etag`.
    Delete {
        /// The key.
        key: String,
        /// The etag it is conditional on.
        etag: Option<String>,
    },
    /// A transaction: every item or none.
    Transaction(Vec<TxItem>),
}

impl Input {
    /// Whether it can change the store.
    pub fn writes(&self) -> bool {
        !matches!(self, Input::Get(_))
    }
}

/// What it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A write applied (204).
    Applied,
    /// An etag or `first-write` conflict: nothing applied (409, or a
    /// transaction's 500 naming the etag mismatch).
    NotApplied,
    /// A read: the value and its etag, or absence.
    Read(Option<(String, String)>),
    /// No answer that says what happened: may or may not have applied.
    Unknown,
}

impl Outcome for Output {
    fn is_unknown(&self) -> bool {
        *self == Output::Unknown
    }
}

/// One operation of a Dapr history.
pub type Operation = Timed<Input, Output>;

/// A present key: its value and the etag a read last saw for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Entry {
    value: String,
    etag: Option<String>,
}

/// Every present key.
type State = BTreeMap<String, Entry>;

/// Whether `etag` may be `key`'s current version: a read saw it and no
/// write came since.
fn etag_matches(state: &State, key: &str, etag: &str) -> bool {
    state
        .get(key)
        .is_some_and(|entry| entry.etag.as_deref() == Some(etag))
}

/// Whether a write's condition holds (no condition: it does).
fn condition_holds(state: &State, key: &str, etag: Option<&str>, first_write: bool) -> bool {
    match etag {
        Some(etag) => etag_matches(state, key, etag),
        None => !(first_write && state.contains_key(key)),
    }
}

/// `key` written with `value` (`None`: deleted).
fn write(state: &mut State, key: &str, value: Option<&String>) {
    match value {
        Some(value) => {
            state.insert(
                key.to_owned(),
                Entry {
                    value: value.clone(),
                    etag: None,
                },
            );
        }
        None => {
            state.remove(key);
        }
    }
}

/// The sequential specification: `Some(next state)` if `op` may take
/// effect in `state` with the output it had.
fn step(state: &State, op: &Operation) -> Option<State> {
    // Each write as (key, value, etag, first_write) items, all or none.
    let items: Vec<(&str, Option<&String>, Option<&str>, bool)> = match &op.input {
        Input::Get(key) => {
            return match &op.output {
                Output::Unknown => Some(state.clone()),
                Output::Read(None) => (!state.contains_key(key)).then(|| state.clone()),
                Output::Read(Some((value, etag))) => {
                    let entry = state.get(key).filter(|entry| entry.value == *value)?;
                    let mut next = state.clone();
                    next.insert(
                        key.clone(),
                        Entry {
                            value: entry.value.clone(),
                            etag: Some(etag.clone()),
                        },
                    );
                    Some(next)
                }
                Output::Applied | Output::NotApplied => None,
            };
        }
        Input::Save {
            key,
            value,
            etag,
            first_write,
        } => vec![(key, Some(value), etag.as_deref(), *first_write)],
        Input::Delete { key, etag } => vec![(key, None, etag.as_deref(), false)],
        Input::Transaction(items) => items
            .iter()
            .map(|item| {
                (
                    item.key.as_str(),
                    item.value.as_ref(),
                    item.etag.as_deref(),
                    item.first_write,
                )
            })
            .collect(),
    };
    // In order: each item's condition meets what the earlier ones left.
    let applied = {
        let mut next = state.clone();
        let mut holds = true;
        for &(key, value, etag, first_write) in &items {
            holds = holds && condition_holds(&next, key, etag, first_write);
            write(&mut next, key, value);
        }
        holds.then_some(next)
    };
    let holds = applied.is_some();
    let applied = || applied.clone().unwrap_or_else(|| state.clone());
    match op.output {
        Output::Applied => holds.then(applied),
        // A conflict changes nothing; an etag may have stopped matching
        // without the model seeing it (a new version of the same value).
        Output::NotApplied => {
            let etag_unseen = items.iter().any(|&(_, _, etag, _)| etag.is_some());
            (!holds || etag_unseen).then(|| state.clone())
        }
        Output::Unknown => Some(if holds { applied() } else { state.clone() }),
        Output::Read(_) => None,
    }
}

/// The verdict on one history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations explains every output.
    Linearizable,
    /// None does: the history and the longest order the model accepted.
    Violation(String),
    /// The search budget ran out.
    Inconclusive,
}

/// Whether `history` (every key initially absent) is linearizable; gives
/// up after `budget` search steps.
pub fn check(history: &[Operation], budget: u64) -> Verdict {
    let intervals: Vec<(u64, Option<u64>)> = history.iter().map(Operation::interval).collect();
    let step_op = |state: &State, index: usize| step(state, &history[index]);
    match search_model(&intervals, State::new(), step_op, budget, &mut 0) {
        Search::Linearizable => Verdict::Linearizable,
        Search::Inconclusive => Verdict::Inconclusive,
        Search::Violation(longest) => {
            let mut report = format!(
                "non-linearizable history of {} operations:\n",
                history.len()
            );
            let mut sorted: Vec<&Operation> = history.iter().collect();
            sorted.sort_by_key(|op| op.call);
            for op in sorted {
                report.push_str(&format!("  {op}\n"));
            }
            report.push_str(&format!(
                "longest accepted order ({} operations):\n",
                longest.len()
            ));
            for index in longest {
                report.push_str(&format!("  {}\n", history[index]));
            }
            Verdict::Violation(report)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: u64 = 1_000_000;

    fn op(client: usize, input: Input, call: u64, ret: u64, output: Output) -> Operation {
        Operation {
            client,
            input,
            call,
            ret,
            output,
        }
    }

    fn get(key: &str) -> Input {
        Input::Get(key.into())
    }

    fn read(value: &str, etag: &str) -> Output {
        Output::Read(Some((value.into(), etag.into())))
    }

    fn save(key: &str, value: &str, etag: Option<&str>) -> Input {
        Input::Save {
            key: key.into(),
            value: value.into(),
            etag: etag.map(str::to_owned),
            first_write: false,
        }
    }

    fn first_write(key: &str, value: &str) -> Input {
        Input::Save {
            key: key.into(),
            value: value.into(),
            etag: None,
            first_write: true,
        }
    }

    fn upsert(key: &str, value: &str, etag: Option<&str>) -> TxItem {
        TxItem {
            key: key.into(),
            value: Some(value.into()),
            etag: etag.map(str::to_owned),
            first_write: false,
        }
    }

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
    fn transactions_apply_all_or_nothing_at_one_point() {
        // A transaction overlapping two reads: each may see before or after.
        assert!(linearizable(&[
            op(0, save("a", "a0", None), 0, 10, Output::Applied),
            op(0, save("b", "b0", None), 20, 30, Output::Applied),
            op(
                1,
                Input::Transaction(vec![upsert("a", "a1", None), upsert("b", "b1", None)]),
                40,
                100,
                Output::Applied
            ),
            op(2, get("a"), 50, 60, read("a1", "e1")),
            op(3, get("b"), 50, 60, read("b0", "e2")),
            op(2, get("b"), 110, 120, read("b1", "e3")),
        ]));
        // A conflict applies nothing: the other item's key keeps its value.
        assert!(linearizable(&[
            op(0, save("a", "a0", None), 0, 10, Output::Applied),
            op(1, get("a"), 20, 30, read("a0", "e1")),
            op(0, save("a", "a1", None), 40, 50, Output::Applied),
            op(
                1,
                Input::Transaction(vec![upsert("a", "a2", Some("e1")), upsert("b", "b2", None)]),
                60,
                70,
                Output::NotApplied
            ),
            op(2, get("b"), 80, 90, Output::Read(None)),
        ]));
    }

    #[test]
    fn a_transaction_applies_the_items_on_one_key_in_order() {
        let delete = |key: &str| TxItem {
            key: key.into(),
            value: None,
            etag: None,
            first_write: false,
        };
        let saved_then_deleted = || {
            op(
                0,
                Input::Transaction(vec![upsert("a", "a1", None), delete("a")]),
                0,
                10,
                Output::Applied,
            )
        };
        assert!(linearizable(&[
            saved_then_deleted(),
            op(1, get("a"), 20, 30, Output::Read(None)),
        ]));
        assert!(!linearizable(&[
            saved_then_deleted(),
            op(1, get("a"), 20, 30, read("a1", "e1")),
        ]));
        // A later item's etag meets the version the earlier item gave.
        let etag_after_a_write = |output| {
            op(
                1,
                Input::Transaction(vec![upsert("a", "a1", None), upsert("a", "a2", Some("e0"))]),
                20,
                30,
                output,
            )
        };
        let seen = [
            op(0, save("a", "a0", None), 0, 5, Output::Applied),
            op(0, get("a"), 6, 10, read("a0", "e0")),
        ];
        let mut applied = seen.to_vec();
        applied.push(etag_after_a_write(Output::Applied));
        assert!(!linearizable(&applied));
        let mut refused = seen.to_vec();
        refused.push(etag_after_a_write(Output::NotApplied));
        refused.push(op(0, get("a"), 40, 50, read("a0", "e0")));
        assert!(linearizable(&refused));
    }

    #[test]
    fn a_half_applied_transaction_seen_by_readers_is_a_violation() {
        // One reader sees the transaction's a, a later one the old b.
        assert!(!linearizable(&[
            op(0, save("a", "a0", None), 0, 10, Output::Applied),
            op(0, save("b", "b0", None), 20, 30, Output::Applied),
            op(
                1,
                Input::Transaction(vec![upsert("a", "a1", None), upsert("b", "b1", None)]),
                40,
                200,
                Output::Applied
            ),
            op(2, get("a"), 50, 60, read("a1", "e1")),
            op(3, get("b"), 70, 80, read("b0", "e2")),
        ]));
        // The same when the transaction's outcome is unknown.
        assert!(!linearizable(&[
            op(
                1,
                Input::Transaction(vec![upsert("a", "a1", None), upsert("b", "b1", None)]),
                0,
                10,
                Output::Unknown
            ),
            op(2, get("a"), 50, 60, read("a1", "e1")),
            op(3, get("b"), 70, 80, Output::Read(None)),
        ]));
        // A transaction answered as a conflict whose write is seen.
        assert!(!linearizable(&[
            op(
                1,
                Input::Transaction(vec![upsert("a", "a1", None), upsert("b", "b1", None)]),
                0,
                10,
                Output::NotApplied
            ),
            op(2, get("a"), 50, 60, read("a1", "e1")),
        ]));
    }

    #[test]
    fn two_writers_winning_with_one_etag_are_a_violation() {
        let history = |second: Output| {
            vec![
                op(0, save("a", "a0", None), 0, 10, Output::Applied),
                op(1, get("a"), 20, 30, read("a0", "e0")),
                op(1, save("a", "a1", Some("e0")), 40, 100, Output::Applied),
                op(2, save("a", "a2", Some("e0")), 40, 100, second),
            ]
        };
        assert!(linearizable(&history(Output::NotApplied)));
        assert!(linearizable(&history(Output::Unknown)));
        assert!(!linearizable(&history(Output::Applied)));
        // An etag write after the key was read with another etag.
        assert!(!linearizable(&[
            op(0, save("a", "a0", None), 0, 10, Output::Applied),
            op(1, get("a"), 20, 30, read("a0", "e0")),
            op(2, get("a"), 40, 50, read("a0", "e9")),
            op(
                1,
                Input::Delete {
                    key: "a".into(),
                    etag: Some("e0".into())
                },
                60,
                70,
                Output::Applied
            ),
        ]));
    }

    #[test]
    fn first_write_lands_only_on_an_absent_key() {
        assert!(linearizable(&[
            op(0, first_write("a", "a0"), 0, 10, Output::Applied),
            op(1, first_write("a", "a1"), 20, 30, Output::NotApplied),
            op(
                1,
                Input::Delete {
                    key: "a".into(),
                    etag: None
                },
                40,
                50,
                Output::Applied
            ),
            op(1, first_write("a", "a2"), 60, 70, Output::Applied),
        ]));
        // A first-write answered 204 beside a transaction that wrote the
        // key first, then the transaction's value read back.
        assert!(!linearizable(&[
            op(
                0,
                Input::Transaction(vec![upsert("a", "t", None)]),
                0,
                10,
                Output::Applied
            ),
            op(1, first_write("a", "f"), 20, 30, Output::Applied),
            op(2, get("a"), 40, 50, read("t", "e1")),
        ]));
        // Nothing conflicts with a write without conditions.
        assert!(!linearizable(&[op(
            0,
            Input::Transaction(vec![upsert("a", "t", None)]),
            0,
            10,
            Output::NotApplied
        )]));
    }
}
