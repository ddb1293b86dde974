//! The code generated from `proto/dapr/`, in Dapr's package layout (which
//! the generated code's paths rely on).

#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// `dapr.proto.common.v1`.
pub mod common {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("dapr.proto.common.v1");
    }
}
/// `dapr.proto.runtime.v1`.
pub mod runtime {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("dapr.proto.runtime.v1");
    }
}
