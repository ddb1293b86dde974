//! The browser dashboard at `/ui/`: list keys, follow every key matching a
//! pattern live, watch single keys, set and delete them, and follow the
//! messages on MQTT topics (a filter with `+`/`#` wildcards).
//!
//! Four static files (plain HTML, CSS and JavaScript, no build step) are
//! compiled into the binary, so the gateway needs nothing on disk to serve
//! them. The page talks only to the gateway's own API with relative URLs
//! (`../keys/…`, `../watch?key=…`, `../watch?match=…`, `../subscribe?topic=…`),
//! so it also works behind a path prefix. Its tabs share their streams through a
//! SharedWorker (`stream-worker.js`): one connection per distinct stream,
//! however many tabs are open.
//!
//! Every answer carries a strict Content-Security-Policy (scripts, styles
//! and connections from the gateway's origin only, no inline script or
//! style, no framing) and `Cache-Control: no-cache` with an `ETag`, so a
//! browser revalidates after an upgrade instead of running a stale script
//! against a newer API.

use axum::Router;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The page's policy: everything from the gateway's own origin, nothing
/// inline, no plugins, no framing, no `<base>` rewriting. `img-src data:`
/// only lets the page's empty favicon stop the browser asking for one.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file with its content type and validator.
#[derive(Debug)]
struct Asset {
    body: &'static str,
    content_type: &'static str,
    etag: &'static str,
}

macro_rules! asset {
    ($file:literal, $content_type:literal) => {{
        const BODY: &str = include_str!(concat!("ui/", $file));
        const HASH: u64 = fnv1a(BODY.as_bytes());
        const ETAG: [u8; 18] = etag_bytes(HASH);
        Asset {
            body: BODY,
            content_type: $content_type,
            etag: match std::str::from_utf8(&ETAG) {
                Ok(etag) => etag,
                Err(_) => panic!("an etag is ascii"),
            },
        }
    }};
}

static INDEX: Asset = asset!("index.html", "text/html; charset=utf-8");
static SCRIPT: Asset = asset!("app.js", "text/javascript; charset=utf-8");
static STYLE: Asset = asset!("style.css", "text/css; charset=utf-8");
static STREAM_WORKER: Asset = asset!("stream-worker.js", "text/javascript; charset=utf-8");

/// The dashboard's routes: `/ui/`, its three assets, and `/ui` redirecting to
/// `/ui/` (the page's relative URLs need the trailing slash). Needs no state,
/// so it merges into a router of any state type.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(redirect_to_slash))
        .route(
            "/ui/",
            get(|headers: HeaderMap| async move { serve(&INDEX, &headers) }),
        )
        .route(
            "/ui/index.html",
            get(|headers: HeaderMap| async move { serve(&INDEX, &headers) }),
        )
        .route(
            "/ui/app.js",
            get(|headers: HeaderMap| async move { serve(&SCRIPT, &headers) }),
        )
        .route(
            "/ui/style.css",
            get(|headers: HeaderMap| async move { serve(&STYLE, &headers) }),
        )
        .route(
            "/ui/stream-worker.js",
            get(|headers: HeaderMap| async move { serve(&STREAM_WORKER, &headers) }),
        )
}

/// `/ui` -> `ui/`, relative so that a prefix in front of the gateway
/// (`/gw/ui` -> `/gw/ui/`) is kept; the query string goes along.
async fn redirect_to_slash(uri: Uri) -> Response {
    let location = match uri.query() {
        Some(query) => format!("ui/?{query}"),
        None => "ui/".to_owned(),
    };
    match HeaderValue::try_from(location) {
        Ok(location) => (
            StatusCode::PERMANENT_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response(),
        // A query that is not a valid header value cannot come from a parsed URI; drop it.
        Err(_) => (
            StatusCode::PERMANENT_REDIRECT,
            [(header::LOCATION, HeaderValue::from_static("ui/"))],
        )
            .into_response(),
    }
}

fn serve(asset: &'static Asset, request: &HeaderMap) -> Response {
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, HeaderValue::from_static(asset.etag)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    if if_none_match(request, asset.etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (headers, asset.body).into_response()
}

/// Whether the browser's `If-None-Match` names this version (or `*`).
fn if_none_match(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}

/// FNV-1a, evaluated at compile time: a validator, not a security hash.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// `"` + 16 lowercase hex digits + `"`.
const fn etag_bytes(hash: u64) -> [u8; 18] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = HEX[((hash >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// Serves the dashboard alone on a loopback port, as a real server would.
    async fn serve_dashboard() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router::<()>()).await.unwrap() });
        addr
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn each_asset_is_served_with_its_type_no_cache_and_a_strict_policy() {
        let addr = serve_dashboard().await;
        for (path, content_type, needle) in [
            ("/ui/", "text/html; charset=utf-8", "<!doctype html>"),
            (
                "/ui/index.html",
                "text/html; charset=utf-8",
                "<!doctype html>",
            ),
            (
                "/ui/app.js",
                "text/javascript; charset=utf-8",
                "EventSource",
            ),
            ("/ui/style.css", "text/css; charset=utf-8", "font-family"),
            (
                "/ui/stream-worker.js",
                "text/javascript; charset=utf-8",
                "new EventSource",
            ),
        ] {
            let response = client()
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let headers = response.headers().clone();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(
                policy.starts_with("default-src 'self';"),
                "{path}: {policy}"
            );
            assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"));
            assert!(policy.contains("frame-ancestors 'none'"));
            let body = response.text().await.unwrap();
            assert!(
                body.to_lowercase().contains(&needle.to_lowercase()),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn ui_without_slash_redirects_relatively_to_ui_slash() {
        let addr = serve_dashboard().await;
        let response = client()
            .get(format!("http://{addr}/ui"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.headers()[header::LOCATION], "ui/");
        let response = client()
            .get(format!("http://{addr}/ui?x=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()[header::LOCATION], "ui/?x=1");
        // Followed by a browser, the relative location lands on the page.
        let response = reqwest::Client::new()
            .get(format!("http://{addr}/ui"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.url().path(), "/ui/");
    }

    #[tokio::test]
    async fn a_matching_if_none_match_gets_304_without_a_body() {
        let addr = serve_dashboard().await;
        let first = client()
            .get(format!("http://{addr}/ui/app.js"))
            .send()
            .await
            .unwrap();
        let etag = first.headers()[header::ETAG].clone();
        let again = client()
            .get(format!("http://{addr}/ui/app.js"))
            .header(header::IF_NONE_MATCH, etag.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::ETAG], etag);
        assert_eq!(again.headers()[header::CACHE_CONTROL], "no-cache");
        assert!(again.bytes().await.unwrap().is_empty());
        let other = client()
            .get(format!("http://{addr}/ui/app.js"))
            .header(header::IF_NONE_MATCH, "\"0000000000000000\"")
            .send()
            .await
            .unwrap();
        assert_eq!(other.status(), 200);
    }

    #[tokio::test]
    async fn head_answers_like_get_and_other_methods_are_refused() {
        let addr = serve_dashboard().await;
        let head = client()
            .head(format!("http://{addr}/ui/"))
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), 200);
        assert_eq!(
            head.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let post = client()
            .post(format!("http://{addr}/ui/"))
            .send()
            .await
            .unwrap();
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        let missing = client()
            .get(format!("http://{addr}/ui/nope.js"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_page_loads_only_its_own_files_and_has_no_inline_script_or_style() {
        let page = INDEX.body;
        assert!(page.contains(r#"<script src="app.js" defer></script>"#));
        assert!(page.contains(r#"<link rel="stylesheet" href="style.css">"#));
        // Under the policy, inline code would be blocked: there must be none.
        assert_eq!(page.matches("<script").count(), 1);
        assert!(!page.contains("<style"));
        assert!(!page.contains(" style="));
        let handler = page.match_indices(" on").any(|(at, _)| {
            let name: String = page[at + 3..]
                .chars()
                .take_while(char::is_ascii_alphabetic)
                .collect();
            !name.is_empty() && page[at + 3 + name.len()..].starts_with('=')
        });
        assert!(!handler, "no inline event handler attributes");
        assert!(!page.contains("javascript:"));
    }

    #[test]
    fn etags_differ_per_file_and_are_quoted_hex() {
        for asset in [&INDEX, &SCRIPT, &STYLE, &STREAM_WORKER] {
            assert_eq!(asset.etag.len(), 18);
            assert!(asset.etag.starts_with('"') && asset.etag.ends_with('"'));
            assert!(asset.etag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(INDEX.etag, SCRIPT.etag);
        assert_ne!(SCRIPT.etag, STYLE.etag);
        assert_ne!(SCRIPT.etag, STREAM_WORKER.etag);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
