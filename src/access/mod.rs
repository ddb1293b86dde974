//! Who may call, and what each caller may do: the shared API token, signed
//! tokens (JWTs) and the per-key rules. The HTTP guard and the API handlers
//! ask these; nothing here knows a route.
//!
//! - [`token`]: the token a request presents, checked into its [`Caller`].
//! - [`jwt`]: signed tokens: key sets, checks, the cache of verified ones.
//! - [`rules`]: the per-key rules of `--authz-file`, read again when the
//!   file changes, and each caller's [`rules::Access`] under them.

pub mod jwt;
pub mod rules;
mod token;

pub use token::{
    ApiToken, AuthFailure, Caller, CallerChecks, DAPR_API_TOKEN, authenticate, presented_token,
};
