//! Headers on every key API answer, problems included.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::protocol::Hlc;

/// `Content-Type` (unless empty), `Cache-Control: no-store` and
/// `X-Content-Type-Options: nosniff`: on every key API answer, problems too.
pub fn set_common_headers(headers: &mut HeaderMap, content_type: &'static str) {
    if !content_type.is_empty() {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
}

/// `ETag: "<version>"`; left out when there is no version or it cannot be
/// a header (a store node id with control characters).
pub fn set_etag(headers: &mut HeaderMap, version: Option<&Hlc>) {
    if let Some(version) = version
        && let Ok(value) = HeaderValue::from_str(&format!("\"{version}\""))
    {
        headers.insert(header::ETAG, value);
    }
}

/// The highest weight (`q`, 1 when absent) the request's `Accept` headers
/// give `media` when they list it by name; `None` when they do not (a
/// wildcard such as `*/*` names nothing).
pub fn accept_weight(headers: &HeaderMap, media: &str) -> Option<f32> {
    let mut best: Option<f32> = None;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(text) = value.to_str() else { continue };
        for range in text.split(',') {
            let mut parts = range.split(';');
            if !parts
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case(media)
            {
                continue;
            }
            let weight = parts
                .filter_map(|param| {
                    let (name, value) = param.split_once('=')?;
                    (name.trim().eq_ignore_ascii_case("q"))
                        .then(|| value.trim().parse::<f32>().ok())
                        .flatten()
                })
                .next()
                .unwrap_or(1.0);
            best = Some(best.map_or(weight, |seen| seen.max(weight)));
        }
    }
    best
}
