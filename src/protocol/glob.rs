//! The glob of `SCAN` patterns (the emulator lists with it, the watch hub
//! follows patterns with it): Redis's `SCAN MATCH` (its `stringmatchlen`,
//! case-sensitive) on raw bytes. The service only calls its syntax
//! "glob-style"; Redis's rules are the assumption, stated in docs/emulator.md.
//!
//! - `*` any run of bytes, `?` any one byte;
//! - `[abc]` one of the bytes, `[a-z]` a range (ends in either order),
//!   `[^...]` none of them; `\x` inside brackets is the byte `x`; a `[`
//!   without `]` runs to the end of the pattern;
//! - `\x` is the byte `x` itself; a trailing `\` is a literal backslash;
//! - every other byte is itself, including `/`, `.` and bytes over 0x7f
//!   (ranges compare bytes unsigned, where Redis on x86 compares C's signed
//!   `char`: `[a-\xff]` differs, ranges within ASCII or within 0x80-0xff do not).
//!
//! Like Redis, an empty key matches nothing (the store has none), a pattern
//! that nests `*` more than 1,000 deep matches nothing, and after a `*` whose
//! rest matched nowhere, earlier `*`s stop retrying: matching takes at most
//! about pattern length times key length steps. [`matches_counting`] says
//! how many it took, so that a SCAN page can stop once it spent its share;
//! [`matches_within`] gives up past a number of steps, so that a caller can
//! hold matching to time linear in the lengths.

/// Redis gives up on patterns with more `*` levels than this.
const MAX_NESTING: usize = 1000;

/// Whether `key` matches the glob `pattern`.
pub fn matches(pattern: &[u8], key: &[u8]) -> bool {
    matches_counting(pattern, key, &mut 0)
}

/// Whether `key` matches the glob `pattern`, adding the steps the match
/// took (bytes compared, `*` positions tried) to `steps`.
pub fn matches_counting(pattern: &[u8], key: &[u8], steps: &mut u64) -> bool {
    let mut state = Matching {
        steps: *steps,
        budget: u64::MAX,
        skip_longer_matches: false,
    };
    let matched = match_from(pattern, key, &mut state, 0);
    *steps = state.steps;
    matched
}

/// Whether `key` matches the glob `pattern`, or `None` when that takes
/// more than `budget` steps (as [`matches_counting`] counts them).
pub fn matches_within(pattern: &[u8], key: &[u8], budget: u64) -> Option<bool> {
    let mut state = Matching {
        steps: 0,
        budget,
        skip_longer_matches: false,
    };
    let matched = match_from(pattern, key, &mut state, 0);
    (state.steps <= budget).then_some(matched)
}

/// One match's progress.
struct Matching {
    steps: u64,
    /// Past this many steps the match gives up (answers no match).
    budget: u64,
    /// After a `*` whose rest matched nowhere, earlier `*`s stop retrying.
    skip_longer_matches: bool,
}

/// Redis's `stringmatchlen_impl`. `pattern` always ends where the whole
/// pattern ends, so reading one byte past it reads C's terminating NUL.
fn match_from(pattern: &[u8], key: &[u8], state: &mut Matching, nesting: usize) -> bool {
    if nesting > MAX_NESTING {
        return false;
    }
    let (mut p, mut k) = (0, 0);
    while p < pattern.len() && k < key.len() {
        state.steps += 1;
        if state.steps > state.budget {
            // Past the budget: every caller up the stack stops too.
            state.skip_longer_matches = true;
            return false;
        }
        match pattern[p] {
            b'*' => {
                while p + 1 < pattern.len() && pattern[p + 1] == b'*' {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                while k < key.len() {
                    if match_from(&pattern[p + 1..], &key[k..], state, nesting + 1) {
                        return true;
                    }
                    if state.skip_longer_matches {
                        return false;
                    }
                    k += 1;
                }
                // The rest matched nowhere in this key: a longer match of
                // an earlier `*` cannot help either.
                state.skip_longer_matches = true;
                return false;
            }
            b'?' => k += 1,
            b'[' => {
                p += 1;
                let negated = pattern.get(p) == Some(&b'^');
                if negated {
                    p += 1;
                }
                let byte = key[k];
                let mut found = false;
                loop {
                    let rest = pattern.len() - p;
                    if rest >= 2 && pattern[p] == b'\\' {
                        p += 1;
                        found |= pattern[p] == byte;
                    } else if rest >= 1 && pattern[p] == b']' {
                        break;
                    } else if rest == 0 {
                        // Unterminated: step back so that the common step
                        // below lands at the end.
                        p -= 1;
                        break;
                    } else if rest >= 3 && pattern[p + 1] == b'-' {
                        let (a, b) = (pattern[p], pattern[p + 2]);
                        found |= (a.min(b)..=a.max(b)).contains(&byte);
                        p += 2;
                    } else {
                        found |= pattern[p] == byte;
                    }
                    p += 1;
                }
                if found == negated {
                    return false;
                }
                k += 1;
            }
            b'\\' => {
                if pattern.len() - p >= 2 {
                    p += 1;
                }
                if pattern[p] != key[k] {
                    return false;
                }
                k += 1;
            }
            literal => {
                if literal != key[k] {
                    return false;
                }
                k += 1;
            }
        }
        p += 1;
        if k == key.len() {
            while pattern.get(p) == Some(&b'*') {
                p += 1;
            }
            break;
        }
    }
    p == pattern.len() && k == key.len()
}

/// The pattern of every key that starts with the bytes `prefix`: each
/// byte the glob reads as syntax escaped, then `*`.
pub fn prefix_pattern(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 1);
    for &byte in prefix {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.push(b'*');
    pattern
}

/// The literal bytes every key matching `pattern` starts with, so that a
/// scan can skip straight to them in an ordered store.
pub fn literal_prefix(pattern: &[u8]) -> Vec<u8> {
    let mut prefix = Vec::new();
    let mut p = 0;
    while let Some(&byte) = pattern.get(p) {
        match byte {
            b'*' | b'?' | b'[' => break,
            b'\\' if p + 1 < pattern.len() => {
                prefix.push(pattern[p + 1]);
                p += 2;
            }
            _ => {
                prefix.push(byte);
                p += 1;
            }
        }
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, key: &str) -> bool {
        matches(pattern.as_bytes(), key.as_bytes())
    }

    #[test]
    fn a_prefix_pattern_matches_the_keys_that_start_with_the_prefix() {
        let pattern = prefix_pattern(b"app*[x]?\\||");
        assert!(matches(&pattern, b"app*[x]?\\||order-1"));
        assert!(matches(&pattern, b"app*[x]?\\||"));
        assert!(!matches(&pattern, b"appzz[x]?\\||order-1"));
        assert!(!matches(&pattern, b"app*x?\\||order-1"));
        assert_eq!(literal_prefix(&pattern), b"app*[x]?\\||");
        assert_eq!(prefix_pattern(b""), b"*");
    }

    #[test]
    fn steps_grow_with_pattern_times_key_and_no_further() {
        let key = "a".repeat(1_000);
        let pattern = format!("*{}b", "a".repeat(1_000));
        let mut steps = 0;
        assert!(!matches_counting(
            pattern.as_bytes(),
            key.as_bytes(),
            &mut steps
        ));
        assert!(steps > 100_000, "{steps}");
        assert!(steps <= 1_100_000, "{steps}");
        let mut few = 0;
        assert!(matches_counting(b"a*", key.as_bytes(), &mut few));
        assert!(few <= 2, "{few}");
    }

    #[test]
    fn a_match_gives_up_past_its_budget_and_answers_within_it() {
        let key = "a".repeat(1_000);
        let costly = format!("*{}b", "a".repeat(500));
        assert_eq!(
            matches_within(costly.as_bytes(), key.as_bytes(), 10_000),
            None
        );
        let mut steps = 0;
        assert!(!matches_counting(
            costly.as_bytes(),
            key.as_bytes(),
            &mut steps
        ));
        assert_eq!(
            matches_within(costly.as_bytes(), key.as_bytes(), steps),
            Some(false)
        );
        assert_eq!(matches_within(b"a*", key.as_bytes(), 2), Some(true));
        assert_eq!(matches_within(b"b*", key.as_bytes(), 1), Some(false));
        let cheap = format!("{}*", "a".repeat(500));
        assert_eq!(matches_within(cheap.as_bytes(), key.as_bytes(), 500), None);
        assert_eq!(
            matches_within(cheap.as_bytes(), key.as_bytes(), 501),
            Some(true)
        );
    }

    #[test]
    fn star_and_question_mark() {
        assert!(m("*", "anything/at:all"));
        assert!(m("key*", "key"));
        assert!(m("key*", "key1"));
        assert!(!m("key*", "ke"));
        assert!(!m("key*", "akey"));
        assert!(m("*key", "my-key"));
        assert!(m("a*b*c", "a-b-c"));
        assert!(m("a*b*c", "abc"));
        assert!(!m("a*b*c", "acb"));
        assert!(m("a**b", "ab"));
        assert!(m("s?nsor", "sensor"));
        assert!(!m("s?nsor", "snsor"));
        assert!(m("???", "abc"));
        assert!(!m("???", "ab"));
        assert!(!m("???", "abcd"));
        assert!(m("a*", "a"));
        assert!(m("a***", "a"));
        assert!(!m("a*?", "a"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        assert!(m("h[ae]llo", "hello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(!m("h[a-b]llo", "hcllo"));
        assert!(m("h[b-a]llo", "hallo"), "reversed range ends");
        assert!(m("[0-9][0-9]", "42"));
        assert!(m("[a-]", "]"), "`-` before `]` makes a range ending in `]`");
        assert!(!m("[]", "]"), "`[]` is an empty class: it matches no byte");
        assert!(!m("[]]", "]"));
        assert!(m("[^]", "]"));
        assert!(m("x[\\]]", "x]"), "escaped `]` inside a class");
        assert!(m("[\\-]", "-"));
        assert!(m("[a\\-z]", "-"));
        assert!(!m("[a\\-z]", "b"));
        // Unterminated: the class runs to the end of the pattern.
        assert!(m("[abc", "b"));
        assert!(!m("[abc", "d"));
        assert!(m("[^", "x"));
        assert!(!m("[", "["));
    }

    #[test]
    fn escapes() {
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("\\?", "?"));
        assert!(!m("\\?", "x"));
        assert!(m("\\[x]", "[x]"));
        assert!(m("\\\\", "\\"));
        assert!(m("a\\", "a\\"), "a trailing backslash is itself");
        assert!(m("\\a", "a"));
    }

    #[test]
    fn raw_bytes() {
        assert!(matches(b"\x00*\xff", b"\x00abc\xff"));
        assert!(matches(b"[\x80-\xff]", b"\xc3"));
        assert!(!matches(b"[\x80-\xff]", b"a"));
        assert!(matches(b"?", b"\xff"));
        assert!(matches(b"a[\x00]b", b"a\x00b"));
        // Multi-byte UTF-8 is several bytes: `?` takes one.
        assert!(!m("?", "é"));
        assert!(m("??", "é"));
    }

    #[test]
    fn empty_keys_and_patterns() {
        assert!(!m("*", ""));
        assert!(!m("", "a"));
        assert!(m("", ""));
    }

    #[test]
    fn abusive_patterns_end_fast() {
        let key = vec![b'a'; 10_000];
        let mut pattern = b"*a".repeat(30);
        pattern.push(b'b');
        // Without Redis's shortcut this would take longer than the universe.
        assert!(!matches(&pattern, &key));
        // Nested deeper than Redis allows: no match, no stack overflow.
        let deep = b"a*".repeat(2_000);
        assert!(!matches(&deep, &vec![b'a'; 3_000]));
    }

    #[test]
    fn literal_prefixes() {
        assert_eq!(literal_prefix(b"sensor/*"), b"sensor/");
        assert_eq!(literal_prefix(b"a\\*b*"), b"a*b");
        assert_eq!(literal_prefix(b"ab?"), b"ab");
        assert_eq!(literal_prefix(b"ab[c]"), b"ab");
        assert_eq!(literal_prefix(b"*"), b"");
        assert_eq!(literal_prefix(b"abc"), b"abc");
        assert_eq!(literal_prefix(b"ab\\"), b"ab\\");
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// A plain backtracking reading of the same rules, without Redis's
    /// shortcut: the reference the fast matcher must agree with.
    fn reference(pattern: &[u8], key: &[u8]) -> bool {
        enum Token {
            Any,
            One,
            Class { negated: bool, items: Vec<(u8, u8)> },
            Byte(u8),
        }
        let mut tokens = Vec::new();
        let mut p = 0;
        while p < pattern.len() {
            match pattern[p] {
                b'*' => tokens.push(Token::Any),
                b'?' => tokens.push(Token::One),
                b'[' => {
                    p += 1;
                    let negated = pattern.get(p) == Some(&b'^');
                    if negated {
                        p += 1;
                    }
                    let mut items = Vec::new();
                    while p < pattern.len() && pattern[p] != b']' {
                        if pattern[p] == b'\\' && p + 1 < pattern.len() {
                            items.push((pattern[p + 1], pattern[p + 1]));
                            p += 2;
                        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' {
                            let (a, b) = (pattern[p], pattern[p + 2]);
                            items.push((a.min(b), a.max(b)));
                            p += 3;
                        } else {
                            items.push((pattern[p], pattern[p]));
                            p += 1;
                        }
                    }
                    tokens.push(Token::Class { negated, items });
                }
                b'\\' if p + 1 < pattern.len() => {
                    p += 1;
                    tokens.push(Token::Byte(pattern[p]));
                }
                byte => tokens.push(Token::Byte(byte)),
            }
            p += 1;
        }
        fn go(tokens: &[Token], key: &[u8]) -> bool {
            match tokens.split_first() {
                None => key.is_empty(),
                Some((Token::Any, rest)) => (0..=key.len()).any(|i| go(rest, &key[i..])),
                Some((token, rest)) => {
                    let Some((&byte, key_rest)) = key.split_first() else {
                        return false;
                    };
                    let ok = match token {
                        Token::One => true,
                        Token::Byte(b) => *b == byte,
                        Token::Class { negated, items } => {
                            items.iter().any(|(lo, hi)| (*lo..=*hi).contains(&byte)) != *negated
                        }
                        Token::Any => unreachable!(),
                    };
                    ok && go(rest, key_rest)
                }
            }
        }
        // Redis never matches an empty key except with an empty pattern.
        if key.is_empty() {
            return pattern.is_empty();
        }
        go(&tokens, key)
    }

    fn pattern_bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"ab".to_vec()),
            2 => prop::sample::select(b"*?[]^-\\".to_vec()),
            1 => any::<u8>(),
        ];
        prop::collection::vec(byte, 0..10)
    }

    fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"ab".to_vec()),
            1 => prop::sample::select(b"*?[]^-\\".to_vec()),
            1 => any::<u8>(),
        ];
        prop::collection::vec(byte, 0..10)
    }

    /// Escapes every byte: the pattern that matches exactly `key`.
    fn escaped(key: &[u8]) -> Vec<u8> {
        key.iter().flat_map(|&byte| [b'\\', byte]).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn agrees_with_the_backtracking_reference(pattern in pattern_bytes(), key in key_bytes()) {
            prop_assert_eq!(matches(&pattern, &key), reference(&pattern, &key));
        }

        #[test]
        fn an_escaped_key_matches_itself_only(
            key in prop::collection::vec(any::<u8>(), 1..16),
            other in prop::collection::vec(any::<u8>(), 1..16),
        ) {
            let pattern = escaped(&key);
            prop_assert!(matches(&pattern, &key));
            prop_assert_eq!(matches(&pattern, &other), key == other);
        }

        #[test]
        fn escaped_prefix_star_is_starts_with(
            prefix in prop::collection::vec(any::<u8>(), 0..8),
            key in prop::collection::vec(any::<u8>(), 1..16),
        ) {
            let mut pattern = escaped(&prefix);
            pattern.push(b'*');
            prop_assert_eq!(matches(&pattern, &key), key.starts_with(&prefix));
            prop_assert_eq!(literal_prefix(&pattern), prefix);
        }

        #[test]
        fn every_match_starts_with_the_literal_prefix(pattern in pattern_bytes(), key in key_bytes()) {
            if matches(&pattern, &key) {
                prop_assert!(key.starts_with(&literal_prefix(&pattern)));
            }
        }

        #[test]
        fn a_match_within_its_budget_agrees(pattern in pattern_bytes(), key in key_bytes(), budget in 0u64..64) {
            let mut steps = 0;
            let matched = matches_counting(&pattern, &key, &mut steps);
            let within = matches_within(&pattern, &key, budget);
            prop_assert_eq!(within, (steps <= budget).then_some(matched));
        }

        #[test]
        fn star_matches_every_key(key in prop::collection::vec(any::<u8>(), 1..64)) {
            prop_assert!(matches(b"*", &key));
        }
    }
}
