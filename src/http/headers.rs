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
    set_representation_etag(headers, version, Representation::Raw);
}

/// What the JSON form's entity tag adds to the version.
const JSON_TAG_SUFFIX: &str = "+json";

/// An entity tag's bytes besides the version's node id: the padded
/// numbers, separators, quotes and `+json`.
const TAG_CAPACITY: usize = 32;

/// The two forms of a key's value that `Accept` chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The value's bytes.
    Raw,
    /// `{"key", "value", "value_base64", "version"}`.
    Json,
}

impl Representation {
    /// The opaque part of its entity tag: the version, with `+json` for the
    /// JSON form (RFC 9110 8.8.3: each representation has its own tag).
    pub fn entity_tag(self, version: &Hlc) -> String {
        let mut tag = String::with_capacity(TAG_CAPACITY + version.node.len());
        self.push_entity_tag(version, &mut tag);
        tag
    }

    fn push_entity_tag(self, version: &Hlc, out: &mut String) {
        version.push_to(out);
        if self == Self::Json {
            out.push_str(JSON_TAG_SUFFIX);
        }
    }
}

/// A read's `ETag` for the representation sent, and `Vary: Accept`, since
/// the same URL answers either form.
pub fn set_read_headers(
    headers: &mut HeaderMap,
    version: Option<&Hlc>,
    representation: Representation,
) {
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    set_representation_etag(headers, version, representation);
}

fn set_representation_etag(
    headers: &mut HeaderMap,
    version: Option<&Hlc>,
    representation: Representation,
) {
    let Some(version) = version else { return };
    let mut quoted = String::with_capacity(TAG_CAPACITY + version.node.len());
    quoted.push('"');
    representation.push_entity_tag(version, &mut quoted);
    quoted.push('"');
    // `from_str` takes visible ASCII only: a tag `If-None-Match` can send back.
    if let Ok(value) = HeaderValue::from_str(&quoted) {
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
