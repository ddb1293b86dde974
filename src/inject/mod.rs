//! The sidecar without a Helm chart of one's own: `inject` adds it to
//! Kubernetes YAML, `injector` is a mutating admission webhook that adds it
//! to pods annotated `statestore-gateway/inject: enabled`. Both build the
//! container, volumes and pod settings that the chart's named templates
//! render, from the chart's values.
//!
//! - [`values`]: the chart's values (compiled-in defaults, values files,
//!   `--set`, annotations) and their checks.
//! - [`pod`]: the sidecar added to one pod spec.
//! - [`values::secrets`]: the files the sidecar reads from volumes, one table.
//! - [`manifest`]: YAML streams, `List`s and the workload kinds.
//! - [`yaml`]: YAML read and written as kubectl reads it (YAML 1.1), every
//!   unchanged scalar as the input wrote it.
//! - [`webhook`]: AdmissionReview over TLS, answered with a JSON Patch.

pub mod manifest;
pub mod pod;
pub mod values;
pub mod webhook;
pub mod yaml;
