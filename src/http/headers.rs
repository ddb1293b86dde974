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
