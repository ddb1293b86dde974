//! Which requests are event streams (`GET /watch`, `GET /watch/{key}`,
//! `GET /subscribe`): the ones [`event_stream`](super::event_stream) may
//! write straight to their sockets, and the only ones that may carry the
//! API token in their query (a browser's `EventSource` cannot send
//! headers).

use axum::http::Method;

/// How the request line of every stream request starts, for telling a
/// connection's first bytes apart before they parse; a line that starts so
/// is a stream request only if [`is_stream_request`] says so
/// (`GET /watchers` is not).
pub const REQUEST_LINE_STARTS: [&[u8]; 2] = [b"GET /watch", b"GET /subscribe"];

/// The watch routes' path: a watch request's path is this, or this and
/// `/` and more.
const WATCH_PATH: &str = "/watch";

/// The topic stream's path (`GET /subscribe?topic=...`).
pub const SUBSCRIBE_PATH: &str = "/subscribe";

/// Whether a request of `method` on `path` (without its query) is a stream
/// request.
pub fn is_stream_request(method: &Method, path: &str) -> bool {
    method == Method::GET
        && (path == SUBSCRIBE_PATH
            || path
                .strip_prefix(WATCH_PATH)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_request_is_a_get_of_a_watch_path_or_of_subscribe() {
        for path in [
            "/watch",
            "/watch/",
            "/watch/a",
            "/watch/a/b",
            "/watch/%2Fx",
            "/subscribe",
        ] {
            assert!(is_stream_request(&Method::GET, path), "{path}");
            let line = format!("{} {path} HTTP/1.1", Method::GET);
            assert!(
                REQUEST_LINE_STARTS
                    .iter()
                    .any(|start| line.as_bytes().starts_with(start)),
                "{line}"
            );
        }
        for path in [
            "/watchers",
            "/watch-a",
            "/subscribe/a",
            "/subscribers",
            "/keys/a",
            "/",
            "",
        ] {
            assert!(!is_stream_request(&Method::GET, path), "{path}");
        }
        for method in [Method::POST, Method::HEAD, Method::PUT, Method::OPTIONS] {
            assert!(!is_stream_request(&method, "/watch/a"), "{method}");
            assert!(!is_stream_request(&method, "/subscribe"), "{method}");
        }
    }
}
