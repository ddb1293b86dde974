//! YAML as kubectl reads it. kubectl (sigs.k8s.io/yaml, go-yaml v2) reads
//! manifests as YAML 1.1, where `0400` is octal, `yes`/`on`/`off` are
//! booleans, `1_000` and `12:30` are integers; a YAML 1.2 library reads
//! several of them differently. So `inject` keeps every scalar it does not
//! change exactly as the input wrote it: [`parse`] keeps each plain
//! scalar's text (its meaning for the injector is its YAML 1.1 value,
//! [`Node::to_json`]), [`rebuild`] puts the injector's result back onto
//! the input's nodes (reusing every node whose value did not change, in
//! the input's key order), and [`emit`] writes block YAML in which new
//! scalars are written so that YAML 1.1 and 1.2 read them alike.

use serde_json::{Number, Value};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, Tag};

/// A YAML node as the input wrote it.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A scalar: its content (after escapes), whether it was plain
    /// (unquoted, so its type comes from its text), and its tag.
    Scalar {
        /// The content.
        text: String,
        /// Unquoted, not a block scalar.
        plain: bool,
        /// An explicit tag (`!!str`), in the form it is written back.
        tag: Option<String>,
    },
    /// A sequence.
    Sequence(Vec<Node>),
    /// A mapping, in the input's order.
    Mapping(Vec<(Node, Node)>),
}

/// Reads a stream of YAML documents (aliases expanded, comments dropped).
pub fn parse(text: &str) -> Result<Vec<Node>, String> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, _) = event.map_err(|error| error.to_string())?;
        builder.event(event)?;
    }
    Ok(builder.documents)
}

#[derive(Default)]
struct Builder {
    documents: Vec<Node>,
    /// Open collections, innermost last, with their anchor ids.
    open: Vec<(Open, usize)>,
    anchors: std::collections::HashMap<usize, Node>,
}

/// A collection being read; a mapping with the key awaiting its value.
enum Open {
    Sequence(Vec<Node>),
    Mapping(Vec<(Node, Node)>, Option<Node>),
}

impl Builder {
    fn event(&mut self, event: Event<'_>) -> Result<(), String> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let node = Node::Scalar {
                    text: text.into_owned(),
                    plain: style == ScalarStyle::Plain,
                    tag: tag.as_deref().map(written_tag),
                };
                self.push(node, anchor);
            }
            Event::SequenceStart(_, anchor, _) => {
                self.open.push((Open::Sequence(Vec::new()), anchor));
            }
            Event::MappingStart(_, anchor, _) => {
                self.open.push((Open::Mapping(Vec::new(), None), anchor));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.open.pop() {
                    Some((Open::Sequence(items), anchor)) => (Node::Sequence(items), anchor),
                    Some((Open::Mapping(pairs, None), anchor)) => (Node::Mapping(pairs), anchor),
                    Some((Open::Mapping(_, Some(_)), _)) => {
                        return Err("a mapping key without a value".into());
                    }
                    None => return Err("an unbalanced collection".into()),
                };
                self.push(node.0, node.1);
            }
            Event::Alias(anchor) => {
                let node = self
                    .anchors
                    .get(&anchor)
                    .cloned()
                    .ok_or("an alias of an unknown anchor")?;
                self.push(node, 0);
            }
            _ => {}
        }
        Ok(())
    }

    /// Adds a finished node to the open collection, or as a document.
    fn push(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.open.last_mut() {
            None => self.documents.push(node),
            Some((Open::Sequence(items), _)) => items.push(node),
            Some((Open::Mapping(pairs, pending), _)) => match pending.take() {
                Some(key) => pairs.push((key, node)),
                None => *pending = Some(node),
            },
        }
    }
}

/// A tag as it is written: `!!str` for the YAML types, `!name` for local
/// tags, `!<uri>` for the rest.
fn written_tag(tag: &Tag) -> String {
    match tag.handle() {
        "tag:yaml.org,2002:" => format!("!!{}", tag.suffix()),
        "!" => format!("!{}", tag.suffix()),
        handle => format!("!<{handle}{}>", tag.suffix()),
    }
}

impl Node {
    /// What the node means, as JSON: plain scalars by the YAML 1.1 rules
    /// kubectl reads them with (a value JSON cannot hold, such as `.inf`,
    /// as its text).
    pub fn to_json(&self) -> Value {
        match self {
            Node::Scalar {
                text,
                plain: true,
                tag: None,
            } => resolve_plain(text),
            Node::Scalar { text, tag, .. } => match tag.as_deref() {
                Some("!!int" | "!!float" | "!!bool" | "!!null") => resolve_plain(text),
                _ => Value::String(text.clone()),
            },
            Node::Sequence(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Node::Mapping(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(key, value)| (key.key_text(), value.to_json()))
                    .collect(),
            ),
        }
    }

    /// A mapping key as a JSON object key.
    fn key_text(&self) -> String {
        match self {
            Node::Scalar { text, .. } => text.clone(),
            other => other.to_json().to_string(),
        }
    }
}

/// A plain scalar's YAML 1.1 value.
fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Value::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Value::Bool(false);
        }
        _ => {}
    }
    if let Some(integer) = yaml11_int(text) {
        return integer;
    }
    if is_yaml11_float(text) {
        let digits: String = text.chars().filter(|c| *c != '_').collect();
        if let Some(number) = digits.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(number);
        }
    }
    Value::String(text.to_owned())
}

/// A YAML 1.1 integer: binary, octal (`0` then digits), decimal, hex or
/// base 60 (`1:30`), with `_` separators. Out of range: its text.
fn yaml11_int(text: &str) -> Option<Value> {
    let (negative, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = |radix: u32, s: &str| {
        !s.is_empty()
            && s.chars().any(|c| c != '_')
            && s.chars().all(|c| c == '_' || c.is_digit(radix))
    };
    let parse = |radix: u32, s: &str| {
        let clean: String = s.chars().filter(|c| *c != '_').collect();
        i128::from_str_radix(&clean, radix).ok()
    };
    let magnitude = if let Some(binary) = body.strip_prefix("0b") {
        digits(2, binary).then(|| parse(2, binary))?
    } else if let Some(hex) = body.strip_prefix("0x") {
        digits(16, hex).then(|| parse(16, hex))?
    } else if body.contains(':') {
        let mut parts = body.split(':');
        let first = parts.next()?;
        if !(digits(10, first) && first.starts_with(|c: char| ('1'..='9').contains(&c))) {
            return None;
        }
        let mut value = parse(10, first)?;
        for part in parts {
            let valid = (1..=2).contains(&part.len())
                && part.chars().all(|c| c.is_ascii_digit())
                && (part.len() == 1 || part.as_bytes()[0] <= b'5');
            if !valid {
                return None;
            }
            value = value.checked_mul(60)?.checked_add(parse(10, part)?)?;
        }
        Some(value)
    } else if body == "0" {
        Some(0)
    } else if let Some(octal) = body.strip_prefix('0') {
        digits(8, octal).then(|| parse(8, octal))?
    } else if body.starts_with(|c: char| ('1'..='9').contains(&c)) && digits(10, body) {
        parse(10, body)
    } else {
        return None;
    };
    let value = if negative { -magnitude? } else { magnitude? };
    Some(
        i64::try_from(value)
            .map(Value::from)
            .or_else(|_| u64::try_from(value).map(Value::from))
            .unwrap_or_else(|_| Value::String(text.to_owned())),
    )
}

/// A YAML 1.1 float as PyYAML and go-yaml v2 read one (`1.5`, `.5`,
/// `1e+3` only with a dot, `1:30.5`, `.inf`, `.nan`).
fn is_yaml11_float(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(body, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], Some(&body[at + 1..])),
        None => (body, None),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        e.len() > 1 && e.starts_with(['-', '+']) && e[1..].chars().all(|c| c.is_ascii_digit())
    });
    let Some((whole, fraction)) = mantissa.split_once('.') else {
        return false;
    };
    let whole_ok = whole.is_empty()
        || (whole.starts_with(|c: char| c.is_ascii_digit())
            && whole
                .chars()
                .all(|c| c.is_ascii_digit() || c == '_' || c == ':'));
    exponent_ok
        && whole_ok
        && (!whole.is_empty() || !fraction.is_empty())
        && fraction.chars().all(|c| c.is_ascii_digit() || c == '_')
}

/// The node for `value`: `original` itself where its meaning is `value`,
/// else `value` built on `original`'s parts (keys in its order, new keys
/// after them; list items matched to the input's by equality, then by
/// `name`, then by position), with new scalars made by [`scalar`].
pub fn rebuild(value: &Value, original: Option<&Node>) -> Node {
    if let Some(original) = original
        && original.to_json() == *value
    {
        return original.clone();
    }
    match value {
        Value::Object(map) => {
            let mut pairs = Vec::new();
            let mut seen = std::collections::HashSet::new();
            if let Some(Node::Mapping(old)) = original {
                for (key, old_value) in old {
                    let text = key.key_text();
                    if let Some(new_value) = map.get(&text)
                        && seen.insert(text)
                    {
                        pairs.push((key.clone(), rebuild(new_value, Some(old_value))));
                    }
                }
            }
            for (key, new_value) in map {
                if !seen.contains(key) {
                    pairs.push((
                        scalar(&Value::String(key.clone())),
                        rebuild(new_value, None),
                    ));
                }
            }
            Node::Mapping(pairs)
        }
        Value::Array(items) => {
            let old: &[Node] = match original {
                Some(Node::Sequence(old)) => old,
                _ => &[],
            };
            let old_json: Vec<Value> = old.iter().map(Node::to_json).collect();
            let mut used = vec![false; old.len()];
            let mut take = |found: Option<usize>| {
                let index = found.filter(|&i| !used[i])?;
                used[index] = true;
                Some(&old[index])
            };
            let nodes = items
                .iter()
                .enumerate()
                .map(|(position, item)| {
                    let equal = old_json.iter().position(|o| o == item);
                    if let Some(node) = take(equal) {
                        return node.clone();
                    }
                    let name = item.get("name");
                    let same_name = name
                        .and_then(|name| old_json.iter().position(|o| o.get("name") == Some(name)));
                    let base =
                        take(same_name).or_else(|| take(Some(position).filter(|&p| p < old.len())));
                    rebuild(item, base)
                })
                .collect();
            Node::Sequence(nodes)
        }
        scalar_value => scalar(scalar_value),
    }
}

/// A new scalar for a JSON value, written so that YAML 1.1 and 1.2 read
/// the same value: a string plain only when no reader could take it for
/// anything else, quoted otherwise.
fn scalar(value: &Value) -> Node {
    let (text, plain) = match value {
        Value::Null => ("null".to_owned(), true),
        Value::Bool(b) => (b.to_string(), true),
        Value::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            // Always with a dot: YAML 1.1 has no float without one.
            Some(f) => {
                let mut text = f.to_string();
                if !text.contains('.') {
                    text.push_str(".0");
                }
                (text, true)
            }
            None => (n.to_string(), true),
        },
        Value::String(s) => (s.clone(), is_plain_safe(s)),
        Value::Array(_) | Value::Object(_) => (value.to_string(), false),
    };
    Node::Scalar {
        text,
        plain,
        tag: None,
    }
}

/// Whether a string can be written unquoted and still be read as that
/// string by YAML 1.1 and 1.2: it starts with a letter or `/`, holds no
/// space or indicator that could end or change it, and is no boolean or
/// null word (`yes`, `on`, `null`, ...).
fn is_plain_safe(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/')
        && !s.ends_with(':')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:@=+-".contains(c))
        && resolve_plain(s) == Value::String(s.to_owned())
}

/// Writes documents as a block-style YAML stream.
pub fn emit(documents: &[Node]) -> Result<String, String> {
    let mut out = String::new();
    for (index, document) in documents.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        write_block(&mut out, document, 0, false)?;
    }
    Ok(out)
}

/// A node on its own lines at `indent`; with `inline_first`, its first
/// line follows a `- ` already written.
fn write_block(
    out: &mut String,
    node: &Node,
    indent: usize,
    inline_first: bool,
) -> Result<(), String> {
    let start = |out: &mut String, index: usize| {
        if index > 0 || !inline_first {
            push_indent(out, indent);
        }
    };
    match node {
        Node::Mapping(pairs) if pairs.is_empty() => out.push_str("{}\n"),
        Node::Sequence(items) if items.is_empty() => out.push_str("[]\n"),
        Node::Mapping(pairs) => {
            for (index, (key, value)) in pairs.iter().enumerate() {
                if !matches!(key, Node::Scalar { .. }) {
                    return Err("a mapping key that is not a scalar".into());
                }
                start(out, index);
                write_key(out, key);
                out.push(':');
                match value {
                    Node::Scalar { .. } => {
                        out.push(' ');
                        write_scalar(out, value, indent + 2);
                        out.push('\n');
                    }
                    Node::Mapping(pairs) if pairs.is_empty() => out.push_str(" {}\n"),
                    Node::Sequence(items) if items.is_empty() => out.push_str(" []\n"),
                    Node::Mapping(_) => {
                        out.push('\n');
                        write_block(out, value, indent + 2, false)?;
                    }
                    // A list at its key's indent, as kubectl writes it.
                    Node::Sequence(_) => {
                        out.push('\n');
                        write_block(out, value, indent, false)?;
                    }
                }
            }
        }
        Node::Sequence(items) => {
            for (index, item) in items.iter().enumerate() {
                start(out, index);
                out.push_str("- ");
                write_block(out, item, indent + 2, true)?;
            }
        }
        Node::Scalar { .. } => {
            if !inline_first {
                push_indent(out, indent);
            }
            write_scalar(out, node, indent.max(2));
            out.push('\n');
        }
    }
    Ok(())
}

/// A mapping key: on one line, so never a literal block.
fn write_key(out: &mut String, key: &Node) {
    match key {
        Node::Scalar {
            text, plain: true, ..
        } if !text.is_empty() && !text.contains('\n') => write_scalar(out, key, 0),
        Node::Scalar { text, tag, .. } => {
            if let Some(tag) = tag {
                out.push_str(tag);
                out.push(' ');
            }
            out.push_str(&Value::String(text.clone()).to_string());
        }
        _ => {}
    }
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// A scalar: plain text as it was (a plain scalar keeps its meaning when
/// written as it was read), a multi-line string as a literal block whose
/// lines sit at `indent`, anything else double-quoted (JSON's escapes are
/// YAML's).
fn write_scalar(out: &mut String, node: &Node, indent: usize) {
    let Node::Scalar { text, plain, tag } = node else {
        return;
    };
    if let Some(tag) = tag {
        out.push_str(tag);
        out.push(' ');
    }
    if *plain && !text.is_empty() && !text.contains('\n') {
        out.push_str(text);
    } else if *plain && tag.is_none() {
        // An empty plain scalar is null; a plain one with a blank line in
        // it is a string (no type has a line break).
        if text.is_empty() {
            out.push_str("null");
        } else {
            out.push_str(&Value::String(text.clone()).to_string());
        }
    } else if is_literal_safe(text) {
        let trailing = text.len() - text.trim_end_matches('\n').len();
        out.push_str(match trailing {
            0 => "|-",
            1 => "|",
            _ => "|+",
        });
        for line in text.trim_end_matches('\n').split('\n') {
            out.push('\n');
            if !line.is_empty() {
                push_indent(out, indent);
                out.push_str(line);
            }
        }
        for _ in 1..trailing {
            out.push('\n');
        }
    } else {
        out.push_str(&Value::String(text.clone()).to_string());
    }
}

/// Whether a string reads back exactly from a literal block: several
/// lines, printable, the first line not indented (the block's indent is
/// taken from it) and no line of spaces alone.
fn is_literal_safe(text: &str) -> bool {
    text.trim_end_matches('\n').contains('\n')
        && !text.starts_with([' ', '\n'])
        && text
            .chars()
            .all(|c| c == '\n' || c == '\t' || !c.is_control())
        && !text.contains(['\u{feff}', '\u{2028}', '\u{2029}', '\u{85}'])
        && text
            .trim_end_matches('\n')
            .split('\n')
            .all(|line| line.is_empty() || !line.trim_start_matches(' ').is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(text: &str) -> String {
        let nodes = parse(text).unwrap();
        let rebuilt: Vec<Node> = nodes
            .iter()
            .map(|node| rebuild(&node.to_json(), Some(node)))
            .collect();
        emit(&rebuilt).unwrap()
    }

    #[test]
    fn plain_scalars_mean_their_yaml_1_1_values() {
        for (text, value) in [
            ("0400", json!(256)),
            ("-0644", json!(-420)),
            ("0", json!(0)),
            ("0o400", json!("0o400")),
            ("0x1F", json!(31)),
            ("0b101", json!(5)),
            ("1_000", json!(1000)),
            ("12:30", json!(750)),
            ("1:00:00", json!(3600)),
            ("12:60", json!("12:60")),
            ("yes", json!(true)),
            ("Off", json!(false)),
            ("~", json!(null)),
            ("", json!(null)),
            ("1.5", json!(1.5)),
            ("1e3", json!("1e3")),
            ("1.5e+3", json!(1500.0)),
            (".inf", json!(".inf")),
            ("99999999999999999999999", json!("99999999999999999999999")),
            ("08", json!("08")),
            ("web", json!("web")),
        ] {
            assert_eq!(resolve_plain(text), value, "{text:?}");
        }
    }

    #[test]
    fn untouched_scalars_are_written_as_the_input_wrote_them() {
        let text = "a: 0400\nb: [yes, '0400', \"x\\ty\", 1_000]\nc: {d: ~, e: .inf}\n";
        assert_eq!(
            round_trip(text),
            "a: 0400\nb:\n- yes\n- \"0400\"\n- \"x\\ty\"\n- 1_000\nc:\n  d: ~\n  e: .inf\n"
        );
    }

    #[test]
    fn new_strings_are_quoted_unless_every_reader_takes_them_as_strings() {
        for (text, plain) in [
            ("serve", true),
            ("registry.example.com/gateway:0.1.0", true),
            ("yes", false),
            ("on", false),
            ("10s", false),
            ("0400", false),
            ("a b", false),
            ("a:", false),
            ("", false),
        ] {
            assert_eq!(is_plain_safe(text), plain, "{text:?}");
        }
        let node = rebuild(&json!({"k": ["on", 3, 1.0, null, true, "x\ny\n"]}), None);
        assert_eq!(
            emit(&[node]).unwrap(),
            "k:\n- \"on\"\n- 3\n- 1.0\n- null\n- true\n- |\n  x\n  y\n"
        );
    }

    #[test]
    fn multi_line_strings_read_back_the_same() {
        for text in [
            "one\ntwo\n",
            "one\n  two",
            "one\n\ntwo\n\n\n",
            " leading\nspace\n",
            "tab\there\n",
            "   \n",
        ] {
            let node = rebuild(&json!({ "k": [text] }), None);
            let written = emit(&[node]).unwrap();
            let nodes = parse(&written).unwrap();
            assert_eq!(nodes[0].to_json(), json!({ "k": [text] }), "{written}");
        }
    }

    #[test]
    fn anchors_are_expanded_and_key_order_kept() {
        let written = round_trip("z: &a {x: 1}\ny: *a\n");
        assert_eq!(written, "z:\n  x: 1\ny:\n  x: 1\n");
        assert!(parse("a: [1, 2").is_err());
    }
}
