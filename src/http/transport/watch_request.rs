//! Which requests are watch requests (`GET /watch`, `GET /watch/{key}`):
//! the ones [`event_stream`](super::event_stream) may write straight to
//! their sockets, and the only ones that may carry the API token in their
//! query (a browser's `EventSource` cannot send headers).

use axum::http::Method;

/// How the request line of every watch request starts, for telling a
/// connection's first bytes apart before they parse; a line that starts so
/// is a watch request only if [`is_watch_request`] says so (`GET /watchers`
/// is not).
pub const REQUEST_LINE_START: &[u8] = b"GET /watch";

/// The watch routes' path: a watch request's path is this, or this and
/// `/` and more.
const WATCH_PATH: &str = "/watch";

/// Whether a request of `method` on `path` (without its query) is a watch
/// request.
pub fn is_watch_request(method: &Method, path: &str) -> bool {
    method == Method::GET
        && path
            .strip_prefix(WATCH_PATH)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_request_is_a_get_of_the_watch_path_or_below_it() {
        for path in ["/watch", "/watch/", "/watch/a", "/watch/a/b", "/watch/%2Fx"] {
            assert!(is_watch_request(&Method::GET, path), "{path}");
            let line = format!("{} {path} HTTP/1.1", Method::GET);
            assert!(line.as_bytes().starts_with(REQUEST_LINE_START), "{line}");
        }
        for path in ["/watchers", "/watch-a", "/keys/a", "/", ""] {
            assert!(!is_watch_request(&Method::GET, path), "{path}");
        }
        for method in [Method::POST, Method::HEAD, Method::PUT, Method::OPTIONS] {
            assert!(!is_watch_request(&method, "/watch/a"), "{method}");
        }
    }
}
