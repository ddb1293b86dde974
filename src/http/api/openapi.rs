//! `GET /openapi.json`: the API's OpenAPI 3.1 document, written by hand
//! (openapi.json next to this file) and embedded at build time, so clients,
//! code generators and schemathesis see exactly what the gateway serves.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The OpenAPI document, as served.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Serves [`OPENAPI_JSON`].
pub async fn document() -> Response {
    let mut response = OPENAPI_JSON.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::http::problem::{ApiError, Precondition};
    use crate::mqtt::PoolError;
    use crate::protocol::StoreError;
    use crate::store::RequestError;
    use crate::watch::WatchError;

    fn document() -> Value {
        serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
    }

    /// Every way a request can fail, one value per problem type.
    fn every_error() -> Vec<ApiError> {
        let mut errors = vec![
            ApiError::KeyNotFound,
            ApiError::RouteNotFound,
            ApiError::MethodNotAllowed,
            ApiError::PreconditionFailed(Precondition::KeyAbsent),
            ApiError::Request(RequestError::UnexpectedReply {
                verb: "GET",
                reply: "+OK".into(),
            }),
            ApiError::EmptyKey,
            ApiError::BadPercentEncoding("key"),
            ApiError::KeyTooLong { len: 2, max: 1 },
            ApiError::ValueTooLarge { max: 1 },
            ApiError::BadFencingToken("x".into()),
            ApiError::FencingTokenTooFarAhead,
            ApiError::BadTtl("x".into()),
            ApiError::BadQuery("x".into()),
            ApiError::BadHeader("x".into()),
            ApiError::BadCursor("x".into()),
            ApiError::ConflictingConditions,
            ApiError::BodyRead("x".into()),
            ApiError::BodyTimeout(Duration::from_secs(1)),
            ApiError::Unauthorized(crate::access::AuthFailure::Missing),
            ApiError::Forbidden(crate::access::rules::Denied::Rules {
                caller: "x".into(),
                need: "Read",
            }),
            ApiError::Forbidden(crate::access::rules::Denied::Reserved {
                prefix: "dapr-txn||",
                need: "Read",
            }),
            ApiError::Watch(WatchError::TooManyWatchers(1)),
            ApiError::Watch(WatchError::TooManyWatchedKeys(1)),
            ApiError::Watch(WatchError::TooManyPatterns(1)),
            ApiError::Watch(WatchError::TooManyKeysPerStream(1)),
            ApiError::Watch(WatchError::TooManyKeysPerPattern(1)),
            ApiError::Watch(WatchError::NoKeys),
            ApiError::Watch(WatchError::EmptyKey),
            ApiError::Watch(WatchError::Timeout(Duration::from_secs(1))),
            ApiError::Watch(WatchError::ShuttingDown),
            ApiError::HandlerTimeout(Duration::from_secs(1)),
            ApiError::LockHeld(None),
            ApiError::LockHeldUnnamed,
            ApiError::LockNotHeld,
            ApiError::NotALock,
            ApiError::BadHolder("x".into()),
            ApiError::BadWait("x".into()),
            ApiError::BadBatch("x".into()),
            ApiError::BatchOp {
                index: 0,
                error: Box::new(ApiError::EmptyKey),
            },
            ApiError::TooManyOps { max: 1 },
            ApiError::BatchTooLarge { max: 1 },
            ApiError::BatchOutOfTime(Duration::from_secs(1)),
            ApiError::UnsupportedMediaType("x".into()),
        ];
        for error in StoreError::KNOWN
            .into_iter()
            .chain([StoreError::Unknown("new".into())])
        {
            errors.push(
                RequestError::Refused {
                    error: error.clone(),
                    fenced: false,
                }
                .into(),
            );
            errors.push(
                RequestError::Refused {
                    error,
                    fenced: true,
                }
                .into(),
            );
        }
        errors.extend(PoolError::one_of_each().map(|error| RequestError::Transport(error).into()));
        errors
    }

    #[test]
    fn every_problem_the_gateway_sends_is_documented_with_its_status() {
        let document = document();
        for error in every_error() {
            let problem = error.problem();
            let response =
                &document["components"]["responses"][format!("Problem{}", problem.status)];
            let schema = &response["content"]["application/problem+json"]["schema"]["allOf"][1];
            assert_eq!(
                schema["properties"]["status"]["const"], problem.status,
                "{error:?}"
            );
            let types = schema["properties"]["type"]["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("no Problem{} response", problem.status));
            assert!(
                types.iter().any(|kind| kind == problem.kind),
                "{} is not documented under {}",
                problem.kind,
                problem.status
            );
        }
    }

    #[test]
    fn every_route_and_method_is_documented() {
        let document = document();
        let paths = document["paths"].as_object().expect("paths");
        let expected: [(&str, &[&str]); 30] = [
            ("/keys", &["get"]),
            ("/keys/{key}", &["get", "head", "put", "delete"]),
            ("/batch", &["post"]),
            ("/watch/{key}", &["get"]),
            ("/watch", &["get"]),
            ("/locks/{name}", &["get", "put", "delete"]),
            ("/openapi.json", &["get"]),
            ("/ui", &["get"]),
            ("/ui/", &["get"]),
            ("/ui/index.html", &["get"]),
            ("/ui/app.js", &["get"]),
            ("/ui/style.css", &["get"]),
            ("/ui/stream-worker.js", &["get"]),
            ("/livez", &["get"]),
            ("/readyz", &["get"]),
            ("/metrics", &["get"]),
            ("/v1.0/healthz", &["get"]),
            ("/v1.0/healthz/outbound", &["get"]),
            ("/v1.0/metadata", &["get"]),
            ("/v1.0/state/{store}", &["post"]),
            ("/v1.0/state/{store}/{key}", &["get", "delete"]),
            ("/v1.0/state/{store}/bulk", &["post", "put"]),
            ("/v1.0/state/{store}/transaction", &["post", "put"]),
            ("/v1.0-alpha1/lock/{store}", &["post"]),
            ("/v1.0-alpha1/unlock/{store}", &["post"]),
            ("/v1.0/metadata/{name}", &["put"]),
            ("/v1.0-alpha1/state/{store}/query", &["post", "put"]),
            ("/v1.0/configuration/{store}", &["get"]),
            ("/v1.0/configuration/{store}/subscribe", &["get"]),
            ("/v1.0/configuration/{store}/{id}/unsubscribe", &["get"]),
        ];
        assert_eq!(paths.len(), expected.len(), "{:?}", paths.keys());
        for (path, methods) in expected {
            let item = &paths[path];
            for method in methods {
                let operation = &item[*method];
                assert!(operation.is_object(), "{method} {path}");
                let responses = operation["responses"].as_object().expect("responses");
                assert!(!responses.is_empty(), "{method} {path}");
            }
        }
    }

    #[test]
    fn every_reference_resolves() {
        fn walk(value: &Value, document: &Value) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(reference)) = map.get("$ref") {
                        let pointer = reference.trim_start_matches('#');
                        assert!(
                            document.pointer(pointer).is_some(),
                            "dangling reference {reference}"
                        );
                    }
                    map.values().for_each(|v| walk(v, document));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, document)),
                _ => {}
            }
        }
        let document = document();
        walk(&document, &document);
    }
}
