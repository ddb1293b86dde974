//! Dapr's state query (alpha) over the store's SCAN: no AIO component
//! offers it, so the gateway evaluates Dapr's query language itself over
//! the JSON values of the app's keys (its state key prefix honoured).
//!
//! - `filter`: `EQ`, `NEQ`, `GT`, `GTE`, `LT`, `LTE`, `IN`, `AND`, `OR`,
//!   as components-contrib's `state/query` parses them; a field is a
//!   dot-separated path into the value (`person.org`). Numbers compare as
//!   numbers, strings as strings; other values are equal when their JSON
//!   is, and never ordered.
//! - Values that are not JSON are skipped, as are keys Dapr could not
//!   name (with `||` in them: locks and other apps' prefixes), the
//!   gateway's own records and keys the caller may not read.
//! - Without `sort` a page is read from SCAN pages in the store's order:
//!   the `token` names the SCAN page the answer stopped in and the last
//!   key it used, so the next request resumes there, and a request holds
//!   one SCAN page, the reads in flight and its results (at most `limit`,
//!   and [`PAGE_VALUE_BYTES`] of values) whatever the store's size.
//! - With `sort` the order is over every match, so the gateway reads the
//!   whole key space for each page, holds the matches (at most
//!   [`MAX_SORTED_MATCHES`] and [`MAX_SORTED_BYTES`] of values: a query
//!   past them fails and says so), sorts them and answers the page at the
//!   token's offset, as Dapr's Redis store pages a sorted search.

use std::cmp::Ordering;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesOrdered;
use serde_json::Value;
use tokio::time::Instant;

use super::settings::{KeyPrefix, SEPARATOR};
use super::{DaprError, DaprStore};
use crate::protocol::glob;
use crate::store::reserved::is_reserved;

/// Results per page when the query gives no `limit`, and the most a page
/// holds whatever it asks.
pub const MAX_LIMIT: usize = 1_000;

/// The value bytes after which a page stops (having one result at least),
/// its token resuming after its last result.
pub const PAGE_VALUE_BYTES: usize = 4 * 1024 * 1024;

/// The most matches a sorted query holds to sort them.
pub const MAX_SORTED_MATCHES: usize = 10_000;

/// The most value bytes a sorted query holds to sort them.
pub const MAX_SORTED_BYTES: usize = 16 * 1024 * 1024;

/// Reads one page keeps in flight.
const CONCURRENT_READS: usize = 16;

/// A parsed query.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    filter: Option<Filter>,
    sort: Vec<Sorting>,
    limit: usize,
    token: Option<Token>,
}

/// One condition of a filter.
#[derive(Debug, Clone, PartialEq)]
enum Filter {
    Compare(Path, Comparison, Value),
    In(Path, Vec<Value>),
    And(Vec<Filter>),
    Or(Vec<Filter>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
}

/// A dot-separated path into a value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Path(Vec<String>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sorting {
    path: Path,
    descending: bool,
}

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// Unsorted: the SCAN token of the page the last answer stopped in
    /// (none: the first page) and the last store key it used.
    Scan { scan: Option<Bytes>, last: Bytes },
    /// Sorted: the offset into the sorted matches.
    Offset(usize),
}

/// One result: the key as the app names it, its JSON value and etag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryItem {
    /// The key, without the state key prefix.
    pub key: String,
    /// The value: JSON.
    pub data: Bytes,
    /// The key's version.
    pub etag: Option<String>,
}

/// One page of results and the token of the next (none: the last page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryPage {
    /// The results, in the store's order or the query's sort.
    pub results: Vec<QueryItem>,
    /// The next page's token.
    pub token: Option<String>,
}

fn failed(message: impl Into<String>) -> DaprError {
    DaprError::Query(message.into())
}

impl Query {
    /// Reads Dapr's query JSON (`filter`, `sort`, `page`), as
    /// components-contrib's `state/query` reads it.
    pub fn parse(json: &[u8]) -> Result<Self, DaprError> {
        let root: Value = serde_json::from_slice(json)
            .map_err(|error| failed(format!("failed to parse JSON query body: {error}")))?;
        let Value::Object(root) = root else {
            return Err(failed("failed to parse JSON query body: not an object"));
        };
        let filter = match root.get("filter") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) if map.is_empty() => None,
            Some(filter) => Some(Filter::parse(filter)?),
        };
        let sort = match root.get("sort") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(sort)) => {
                sort.iter().map(Sorting::parse).collect::<Result<_, _>>()?
            }
            Some(_) => return Err(failed("sort must be an array")),
        };
        let (limit, token) = match root.get("page") {
            None | Some(Value::Null) => (0, None),
            Some(Value::Object(page)) => {
                let limit = match page.get("limit") {
                    None | Some(Value::Null) => 0,
                    Some(limit) => limit
                        .as_i64()
                        .ok_or_else(|| failed("page.limit must be a whole number"))?,
                };
                let token = match page.get("token") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(token)) if token.is_empty() => None,
                    Some(Value::String(token)) => Some(Token::decode(token)?),
                    Some(_) => return Err(failed("page.token must be a string")),
                };
                (limit, token)
            }
            Some(_) => return Err(failed("page must be an object")),
        };
        let limit = usize::try_from(limit)
            .ok()
            .filter(|&limit| limit > 0)
            .map_or(MAX_LIMIT, |limit| limit.min(MAX_LIMIT));
        match (&token, sort.is_empty()) {
            (Some(Token::Offset(_)), true) | (Some(Token::Scan { .. }), false) => {
                return Err(failed(
                    "the token is of a query with a different sort: pass the query unchanged with its token",
                ));
            }
            _ => {}
        }
        Ok(Self {
            filter,
            sort,
            limit,
            token,
        })
    }

    /// Whether the JSON `value` passes the filter.
    fn matches(&self, value: &Value) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|filter| filter.matches(value))
    }
}

impl Filter {
    fn parse(json: &Value) -> Result<Self, DaprError> {
        let Value::Object(unit) = json else {
            return Err(failed("filter unit must be a map"));
        };
        let mut entries = unit.iter();
        let (Some((name, operand)), None) = (entries.next(), entries.next()) else {
            return Err(failed("filter unit must have a single element"));
        };
        let comparison = match name.as_str() {
            "EQ" => Comparison::Eq,
            "NEQ" => Comparison::Neq,
            "GT" => Comparison::Gt,
            "GTE" => Comparison::Gte,
            "LT" => Comparison::Lt,
            "LTE" => Comparison::Lte,
            "IN" => {
                let (path, values) = single_pair(name, operand)?;
                let Value::Array(values) = values else {
                    return Err(failed("IN filter value must be an array"));
                };
                return Ok(Self::In(path, values.clone()));
            }
            "AND" | "OR" => {
                let Value::Array(units) = operand else {
                    return Err(failed(format!("{name} filter must be an array")));
                };
                if units.len() < 2 {
                    return Err(failed(format!(
                        "{name} filter must contain at least two entries"
                    )));
                }
                let filters = units.iter().map(Self::parse).collect::<Result<_, _>>()?;
                return Ok(if name == "AND" {
                    Self::And(filters)
                } else {
                    Self::Or(filters)
                });
            }
            other => return Err(failed(format!("unsupported filter {other:?}"))),
        };
        let (path, value) = single_pair(name, operand)?;
        Ok(Self::Compare(path, comparison, value.clone()))
    }

    fn matches(&self, value: &Value) -> bool {
        match self {
            Self::Compare(path, comparison, operand) => path.find(value).is_some_and(|field| {
                let order = compare(field, operand);
                match comparison {
                    Comparison::Eq => order == Some(Ordering::Equal),
                    Comparison::Neq => order != Some(Ordering::Equal),
                    Comparison::Gt => order == Some(Ordering::Greater),
                    Comparison::Gte => {
                        matches!(order, Some(Ordering::Greater | Ordering::Equal))
                    }
                    Comparison::Lt => order == Some(Ordering::Less),
                    Comparison::Lte => matches!(order, Some(Ordering::Less | Ordering::Equal)),
                }
            }),
            Self::In(path, operands) => path.find(value).is_some_and(|field| {
                operands
                    .iter()
                    .any(|operand| compare(field, operand) == Some(Ordering::Equal))
            }),
            Self::And(filters) => filters.iter().all(|filter| filter.matches(value)),
            Self::Or(filters) => filters.iter().any(|filter| filter.matches(value)),
        }
    }
}

/// A comparison's `{"<path>": <value>}`.
fn single_pair<'a>(name: &str, operand: &'a Value) -> Result<(Path, &'a Value), DaprError> {
    let Value::Object(pair) = operand else {
        return Err(failed(format!("{name} filter must be a map")));
    };
    let mut entries = pair.iter();
    let (Some((path, value)), None) = (entries.next(), entries.next()) else {
        return Err(failed(format!(
            "{name} filter must contain a single key/value pair"
        )));
    };
    Ok((Path::parse(path)?, value))
}

/// How two JSON values compare: numbers as numbers, strings as strings,
/// other values equal when alike and otherwise unordered.
fn compare(left: &Value, right: &Value) -> Option<Ordering> {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (a, b) if a == b => Some(Ordering::Equal),
        _ => None,
    }
}

/// The sort order of one field's values across results: absent first,
/// then null, booleans, numbers, strings, and arrays and objects by their
/// JSON text.
fn sort_order(left: Option<&Value>, right: Option<&Value>) -> Ordering {
    fn rank(value: Option<&Value>) -> u8 {
        match value {
            None => 0,
            Some(Value::Null) => 1,
            Some(Value::Bool(_)) => 2,
            Some(Value::Number(_)) => 3,
            Some(Value::String(_)) => 4,
            Some(Value::Array(_)) => 5,
            Some(Value::Object(_)) => 6,
        }
    }
    match (left, right) {
        (Some(Value::Bool(a)), Some(Value::Bool(b))) => a.cmp(b),
        (Some(Value::Number(a)), Some(Value::Number(b))) => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            a.total_cmp(&b)
        }
        (Some(Value::String(a)), Some(Value::String(b))) => a.cmp(b),
        (Some(a @ (Value::Array(_) | Value::Object(_))), Some(b))
            if rank(Some(a)) == rank(Some(b)) =>
        {
            a.to_string().cmp(&b.to_string())
        }
        _ => rank(left).cmp(&rank(right)),
    }
}

impl Path {
    fn parse(text: &str) -> Result<Self, DaprError> {
        if text.is_empty() || text.split('.').any(str::is_empty) {
            return Err(failed(format!("invalid field path {text:?}")));
        }
        Ok(Self(text.split('.').map(str::to_owned).collect()))
    }

    /// The field at this path: object members by name, array elements by
    /// index.
    fn find<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(value, |at, step| match at {
            Value::Object(members) => members.get(step),
            Value::Array(elements) => elements.get(step.parse::<usize>().ok()?),
            _ => None,
        })
    }
}

impl Sorting {
    fn parse(json: &Value) -> Result<Self, DaprError> {
        let key = json
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| failed("a sort entry needs a key"))?;
        let descending = match json.get("order").and_then(Value::as_str) {
            None | Some("" | "ASC") => false,
            Some("DESC") => true,
            Some(other) => {
                return Err(failed(format!(
                    "unknown sort order {other:?}: expected ASC or DESC"
                )));
            }
        };
        Ok(Self {
            path: Path::parse(key)?,
            descending,
        })
    }
}

impl Token {
    fn encode(&self) -> String {
        match self {
            Self::Offset(offset) => format!("o.{offset}"),
            Self::Scan { scan, last } => format!(
                "s.{}.{}",
                scan.as_ref()
                    .map_or(String::new(), |scan| BASE64URL.encode(scan)),
                BASE64URL.encode(last)
            ),
        }
    }

    fn decode(text: &str) -> Result<Self, DaprError> {
        let malformed = || failed(format!("invalid page token {text:?}"));
        let mut parts = text.split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("o"), Some(offset), None, None) => {
                Ok(Self::Offset(offset.parse().map_err(|_| malformed())?))
            }
            (Some("s"), Some(scan), Some(last), None) => {
                let scan = match scan {
                    "" => None,
                    scan => Some(Bytes::from(
                        BASE64URL.decode(scan).map_err(|_| malformed())?,
                    )),
                };
                let last = Bytes::from(BASE64URL.decode(last).map_err(|_| malformed())?);
                Ok(Self::Scan { scan, last })
            }
            _ => Err(malformed()),
        }
    }
}

/// Where in a SCAN page a query that stopped after `last` resumes: after
/// `last` while the page holds it; in a page in byte order (the
/// emulator's), after every key up to it, so that keys inserted before it
/// or its deletion shift nothing; otherwise from the page's start (a key
/// may then come twice).
fn resume_after(keys: &[Bytes], last: &[u8]) -> usize {
    if let Some(index) = keys.iter().position(|key| key.as_ref() == last) {
        return index + 1;
    }
    if keys.windows(2).all(|pair| pair[0] < pair[1]) {
        return keys.partition_point(|key| key.as_ref() <= last);
    }
    0
}

/// A key the query read: its result and its JSON.
struct Read {
    item: QueryItem,
    json: Value,
}

impl DaprStore {
    /// Runs `query` over the app's keys that `readable` allows, within
    /// `budget` for an unsorted page (stopping early with a token) and
    /// failing past it for a sorted one.
    pub async fn query(
        &self,
        query: Query,
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
        budget: Duration,
    ) -> Result<QueryPage, DaprError> {
        if query.sort.is_empty() {
            self.query_in_store_order(query, readable, budget).await
        } else {
            self.query_sorted(query, readable, budget).await
        }
    }

    /// The store key prefix of the app's state keys.
    fn state_prefix(&self) -> Vec<u8> {
        match self.settings.key_prefix {
            KeyPrefix::None => Vec::new(),
            KeyPrefix::AppId => format!("{}{SEPARATOR}", self.settings.app_id).into_bytes(),
        }
    }

    /// The app's name of `store_key`, when the query may see it.
    fn app_key(
        &self,
        prefix: &[u8],
        store_key: &[u8],
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
    ) -> Option<String> {
        if is_reserved(store_key) || !readable(store_key) {
            return None;
        }
        let key = std::str::from_utf8(store_key.strip_prefix(prefix)?).ok()?;
        (!key.is_empty() && !key.contains(SEPARATOR)).then(|| key.to_owned())
    }

    /// Reads `keys` (a few at a time, in order) and passes each that holds
    /// JSON the filter accepts to `take` until it says stop; returns the
    /// store key of the last one read when it stopped.
    async fn read_matching(
        &self,
        query: &Query,
        keys: Vec<(Bytes, String)>,
        mut take: impl FnMut(Read) -> Result<bool, DaprError>,
    ) -> Result<Option<Bytes>, DaprError> {
        let mut keys = keys.into_iter();
        let mut reading = FuturesOrdered::new();
        loop {
            while reading.len() < CONCURRENT_READS {
                let Some((store_key, key)) = keys.next() else {
                    break;
                };
                reading.push_back(async move {
                    let read = self.get(&key).await;
                    (store_key, key, read)
                });
            }
            let Some((store_key, key, read)) = reading.next().await else {
                return Ok(None);
            };
            let Some(versioned) = read? else { continue };
            let Ok(json) = serde_json::from_slice::<Value>(&versioned.value) else {
                continue;
            };
            if !query.matches(&json) {
                continue;
            }
            let read = Read {
                item: QueryItem {
                    key,
                    data: versioned.value,
                    etag: versioned.version.map(|version| version.encode()),
                },
                json,
            };
            if !take(read)? {
                return Ok(Some(store_key));
            }
        }
    }

    async fn query_in_store_order(
        &self,
        query: Query,
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
        budget: Duration,
    ) -> Result<QueryPage, DaprError> {
        let deadline = Instant::now() + budget;
        let prefix = self.state_prefix();
        let pattern = Bytes::from(glob::prefix_pattern(&prefix));
        let (mut scan, mut last) = match &query.token {
            Some(Token::Scan { scan, last }) => (scan.clone(), Some(last.clone())),
            _ => (None, None),
        };
        let mut page = QueryPage::default();
        let mut bytes = 0;
        loop {
            let keys = self.store.scan(pattern.clone(), scan.clone()).await?;
            let skip = last
                .as_deref()
                .map_or(0, |last| resume_after(&keys.keys, last));
            let candidates: Vec<(Bytes, String)> = keys.keys[skip..]
                .iter()
                .filter_map(|store_key| {
                    let key = self.app_key(&prefix, store_key, readable)?;
                    Some((store_key.clone(), key))
                })
                .collect();
            let stopped = self
                .read_matching(&query, candidates, |read| {
                    bytes += read.item.data.len();
                    page.results.push(read.item);
                    Ok(page.results.len() < query.limit && bytes < PAGE_VALUE_BYTES)
                })
                .await?;
            if let Some(stopped) = stopped {
                page.token = Some(
                    Token::Scan {
                        scan,
                        last: stopped,
                    }
                    .encode(),
                );
                return Ok(page);
            }
            let Some(next) = keys.token else {
                return Ok(page);
            };
            // The next page starts where this one ends.
            scan = Some(next);
            last = None;
            if Instant::now() >= deadline {
                let last = keys.keys.last().cloned().unwrap_or_default();
                page.token = Some(Token::Scan { scan, last }.encode());
                return Ok(page);
            }
        }
    }

    async fn query_sorted(
        &self,
        query: Query,
        readable: &(dyn Fn(&[u8]) -> bool + Sync),
        budget: Duration,
    ) -> Result<QueryPage, DaprError> {
        let deadline = Instant::now() + budget;
        let prefix = self.state_prefix();
        let pattern = Bytes::from(glob::prefix_pattern(&prefix));
        let mut matches: Vec<(Vec<Option<Value>>, QueryItem)> = Vec::new();
        let mut bytes = 0;
        let mut scan = None;
        loop {
            let keys = self.store.scan(pattern.clone(), scan).await?;
            let candidates: Vec<(Bytes, String)> = keys
                .keys
                .iter()
                .filter_map(|store_key| {
                    let key = self.app_key(&prefix, store_key, readable)?;
                    Some((store_key.clone(), key))
                })
                .collect();
            self.read_matching(&query, candidates, |read| {
                bytes += read.item.data.len();
                if matches.len() >= MAX_SORTED_MATCHES || bytes > MAX_SORTED_BYTES {
                    return Err(failed(format!(
                        "a sorted query holds every match to sort it, at most {MAX_SORTED_MATCHES} matches and {MAX_SORTED_BYTES} bytes of values: narrow the filter, or leave out sort to page through the store"
                    )));
                }
                let fields = query
                    .sort
                    .iter()
                    .map(|sorting| sorting.path.find(&read.json).cloned())
                    .collect();
                matches.push((fields, read.item));
                Ok(true)
            })
            .await?;
            let Some(next) = keys.token else { break };
            scan = Some(next);
            if Instant::now() >= deadline {
                return Err(failed(format!(
                    "a sorted query reads every key for each page and took longer than {budget:?}: narrow the key space, or leave out sort to page through the store"
                )));
            }
        }
        matches.sort_by(|(a, a_item), (b, b_item)| {
            query
                .sort
                .iter()
                .zip(a.iter().zip(b))
                .map(|(sorting, (a, b))| {
                    let order = sort_order(a.as_ref(), b.as_ref());
                    if sorting.descending {
                        order.reverse()
                    } else {
                        order
                    }
                })
                .find(|order| order.is_ne())
                .unwrap_or_else(|| a_item.key.cmp(&b_item.key))
        });
        let offset = match query.token {
            Some(Token::Offset(offset)) => offset,
            _ => 0,
        };
        let end = offset.saturating_add(query.limit).min(matches.len());
        let token = (end < matches.len()).then(|| Token::Offset(end).encode());
        let results = matches
            .into_iter()
            .skip(offset)
            .take(end.saturating_sub(offset))
            .map(|(_, item)| item)
            .collect();
        Ok(QueryPage { results, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Query, DaprError> {
        Query::parse(json.as_bytes())
    }

    fn matches(query: &str, value: &str) -> bool {
        parse(query)
            .unwrap()
            .matches(&serde_json::from_str(value).unwrap())
    }

    #[test]
    fn filters_are_read_and_applied_as_daprs_query_language() {
        let person = r#"{"person": {"org": "Dev Ops", "id": 1036}, "city": "Seattle", "state": "WA", "tags": ["a", "b"]}"#;
        assert!(matches(r#"{"filter": {"EQ": {"state": "WA"}}}"#, person));
        assert!(!matches(r#"{"filter": {"EQ": {"state": "CA"}}}"#, person));
        assert!(matches(
            r#"{"filter": {"EQ": {"person.id": 1036.0}}}"#,
            person
        ));
        assert!(matches(r#"{"filter": {"EQ": {"tags.1": "b"}}}"#, person));
        assert!(matches(
            r#"{"filter": {"IN": {"state": ["CA", "WA"]}}}"#,
            person
        ));
        assert!(matches(
            r#"{"filter": {"AND": [{"EQ": {"person.org": "Dev Ops"}}, {"OR": [{"EQ": {"city": "Seattle"}}, {"EQ": {"city": "Portland"}}]}]}}"#,
            person
        ));
        assert!(!matches(
            r#"{"filter": {"AND": [{"EQ": {"person.org": "Dev Ops"}}, {"EQ": {"city": "Portland"}}]}}"#,
            person
        ));
        assert!(matches(
            r#"{"filter": {"GT": {"person.id": 1000}}}"#,
            person
        ));
        assert!(!matches(
            r#"{"filter": {"LT": {"person.id": 1000}}}"#,
            person
        ));
        assert!(matches(r#"{"filter": {"NEQ": {"state": "CA"}}}"#, person));
        // An absent field matches nothing, NEQ included.
        assert!(!matches(r#"{"filter": {"NEQ": {"zip": "1"}}}"#, person));
        // No filter: everything.
        assert!(matches(r#"{}"#, "42"));
        assert!(matches(r#"{"filter": {}}"#, "42"));
    }

    #[test]
    fn malformed_queries_say_what_is_wrong() {
        for (query, says) in [
            ("{", "failed to parse JSON query body"),
            (r#"{"filter": {"LIKE": {"a": 1}}}"#, "unsupported filter"),
            (
                r#"{"filter": {"EQ": {"a": 1, "b": 2}}}"#,
                "single key/value pair",
            ),
            (
                r#"{"filter": {"AND": [{"EQ": {"a": 1}}]}}"#,
                "at least two entries",
            ),
            (r#"{"filter": {"IN": {"a": 1}}}"#, "must be an array"),
            (
                r#"{"sort": [{"key": "a", "order": "UP"}]}"#,
                "unknown sort order",
            ),
            (r#"{"page": {"token": "nope"}}"#, "invalid page token"),
            (r#"{"page": {"token": "o.5"}}"#, "different sort"),
        ] {
            let Err(DaprError::Query(message)) = parse(query) else {
                panic!("{query} parsed");
            };
            assert!(message.contains(says), "{query}: {message}");
        }
    }

    #[test]
    fn a_limit_is_held_to_the_most_a_page_holds() {
        assert_eq!(parse("{}").unwrap().limit, MAX_LIMIT);
        assert_eq!(parse(r#"{"page": {"limit": 3}}"#).unwrap().limit, 3);
        assert_eq!(
            parse(r#"{"page": {"limit": 1000000}}"#).unwrap().limit,
            MAX_LIMIT
        );
    }

    #[test]
    fn tokens_round_trip() {
        for token in [
            Token::Offset(7),
            Token::Scan {
                scan: None,
                last: Bytes::from_static(b"a.b"),
            },
            Token::Scan {
                scan: Some(Bytes::from_static(b"node;k\xff")),
                last: Bytes::from_static(b"k"),
            },
        ] {
            assert_eq!(Token::decode(&token.encode()).unwrap(), token);
        }
    }

    #[test]
    fn a_page_in_byte_order_resumes_after_the_last_key_even_when_it_is_gone() {
        let keys: Vec<Bytes> = [&b"a"[..], b"c", b"d"].map(Bytes::from_static).to_vec();
        assert_eq!(resume_after(&keys, b"c"), 2);
        assert_eq!(resume_after(&keys, b"b"), 1);
        assert_eq!(resume_after(&keys, b"z"), 3);
    }

    #[test]
    fn sorting_orders_by_kind_then_value() {
        let values = [
            json(r#""b""#),
            json("2"),
            json("10"),
            json("null"),
            json(r#""a""#),
        ];
        let mut sorted: Vec<Option<&Value>> = values.iter().map(Some).collect();
        sorted.push(None);
        sorted.sort_by(|a, b| sort_order(*a, *b));
        let texts: Vec<String> = sorted
            .iter()
            .map(|value| value.map_or("-".to_owned(), Value::to_string))
            .collect();
        assert_eq!(texts, ["-", "null", "2", "10", r#""a""#, r#""b""#]);
    }

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }
}
