//! MQTT topic filters: which are valid, which topics they match, and
//! whether one filter covers another (for the callers' rules).

/// Whether `filter` is a valid MQTT topic filter: not empty, no NUL, `+`
/// and `#` each a whole level, `#` only last.
pub fn is_topic_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.contains('\0') {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    levels.iter().enumerate().all(|(at, level)| match *level {
        "#" => at == levels.len() - 1,
        "+" => true,
        other => !other.contains(['+', '#']),
    })
}

/// Whether the filter `wide` matches every topic `narrow` (a topic name,
/// or itself a filter) matches: level by level, `+` in `wide` takes any
/// one level (`+` too), `#` the rest (`#` too, and the parent level:
/// `a/#` matches `a`); `narrow`'s wildcards need the same or wider in
/// `wide`. Topics starting with `$` only match filters that name their
/// first level, as brokers match them. With a topic name as `narrow`, this
/// is MQTT's matching of a topic by a filter.
pub fn filter_covers(wide: &str, narrow: &str) -> bool {
    let mut wide_levels = wide.split('/');
    let mut narrow_levels = narrow.split('/');
    let mut first = true;
    loop {
        match (wide_levels.next(), narrow_levels.next()) {
            (Some("#"), Some(level)) => return !(first && level.starts_with('$')),
            (Some("#"), None) => return true,
            (Some("+"), Some(level)) => {
                if level == "#" || (first && level.starts_with('$')) {
                    return false;
                }
            }
            (Some(want), Some(level)) => {
                if want != level {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_topics_as_mqtt_does() {
        assert!(filter_covers("orders/+", "orders/eu"));
        assert!(!filter_covers("orders/+", "orders/eu/1"));
        assert!(filter_covers("orders/#", "orders"));
        assert!(filter_covers("orders/#", "orders/eu/1"));
        assert!(filter_covers("#", "anything/at/all"));
        assert!(!filter_covers("#", "$SYS/x"));
        assert!(!filter_covers("+/x", "$SYS/x"));
        assert!(filter_covers("$SYS/#", "$SYS/x"));
        assert!(filter_covers("orders/#", "orders/+"));
        assert!(!filter_covers("orders/+", "orders/#"));
        assert!(!filter_covers("orders/eu", "orders/+"));
    }

    #[test]
    fn wildcards_are_whole_levels() {
        assert!(is_topic_filter("a/+/b/#"));
        assert!(is_topic_filter("#"));
        assert!(!is_topic_filter(""));
        assert!(!is_topic_filter("a/#/b"));
        assert!(!is_topic_filter("a+"));
        assert!(!is_topic_filter("a#"));
        assert!(!is_topic_filter("a\0"));
    }
}
