//! Dapr's API, apart from the gateway's own: the state and lock building
//! blocks over HTTP (`/v1.0/...`) and gRPC (`dapr.proto.runtime.v1.Dapr`)
//! on the key API's listener, so apps written for a Dapr sidecar run
//! unchanged.
//!
//! - `check`: every rule both front ends apply (store names, keys, saves,
//!   lock names, counts, operation names), written once; a broken rule is
//!   a [`Refusal`].
//! - `answer`: one table from a refusal, or a [`crate::dapr::DaprError`]
//!   of the operation it ran, to Dapr's HTTP answer and gRPC code.
//! - `http` and [`grpc`]: the two wire shapes, nothing else; `proto` the
//!   code generated from the vendored protos, `codec` its gRPC codec, which
//!   sizes and counts a request on the wire before prost decodes it.
//!
//! What each operation does in the store is [`crate::dapr`]'s.

mod answer;
pub mod app_callback;
mod check;
mod codec;
pub mod delivery;
pub mod grpc;
mod http;
mod proto;

use axum::Router;

pub use answer::{Failure, Operation};
pub use check::{Counted, LockCall, Refusal};

use super::state::AppState;

/// Dapr's routes that need a caller (behind the guard): HTTP and gRPC.
pub fn routes(state: &AppState) -> Router<AppState> {
    http::routes().merge(grpc::routes(state))
}

/// Dapr's health routes: public, as Dapr's are.
pub fn health_routes() -> Router<AppState> {
    http::health_routes()
}
