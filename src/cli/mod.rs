//! The command line: one subcommand each, and each subcommand's arguments
//! beside the conversion into the typed settings its code runs with
//! (`settings()`, which validates what parsing alone cannot).
//!
//! Every flag's environment fallback and default come from the table in
//! [`crate::settings`], so the Helm chart, the manifests and the README can
//! name them exactly (and tests check that they do).

use clap::{Parser, Subcommand};

pub mod dev;
pub mod emulator;
pub mod inject;
pub mod parse;
pub mod serve;

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "statestore-gateway", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once at start: boxing the largest variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP key and watch API over a pool of MQTT5 connections.
    Serve(serve::ServeArgs),
    /// Serve the state store protocol as an MQTT5 client of a broker.
    Emulator(emulator::EmulatorArgs),
    /// Embedded broker + emulator + gateway in one process, for laptops.
    Dev(dev::DevArgs),
    /// Add the gateway sidecar to the pods of Kubernetes YAML (stdout).
    Inject(inject::InjectArgs),
    /// Mutating admission webhook adding the sidecar to annotated pods.
    Injector(inject::InjectorArgs),
}
