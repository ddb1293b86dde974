//! The command line: one subcommand each, and each subcommand's arguments
//! beside the conversion into the typed settings its code runs with
//! (`settings()`, which validates what parsing alone cannot).
//!
//! Every flag's environment fallback and default come from the table in
//! [`crate::settings`], so the Helm chart, the manifests and
//! docs/configuration.md can name them exactly (and tests check that they do).

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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;
    use crate::settings::{self, Setting};

    /// Every flag with an environment variable is a row of the settings
    /// table, with the row's variable and default, and every row a flag:
    /// a setting added to one and not the other fails here.
    #[test]
    fn every_flag_is_a_row_of_the_settings_table() {
        let cli = Cli::command();
        for (name, rows) in [
            ("serve", settings::SERVE),
            ("emulator", settings::EMULATOR),
            ("dev", settings::DEV),
            ("injector", settings::INJECTOR),
        ] {
            let command = cli.find_subcommand(name).expect("the subcommand");
            let flags: Vec<&clap::Arg> = command
                .get_arguments()
                .filter(|arg| arg.get_env().is_some())
                .collect();
            for arg in &flags {
                let flag = format!("--{}", arg.get_long().expect("a long flag"));
                let row: &Setting = rows
                    .iter()
                    .find(|row| row.flag == flag)
                    .unwrap_or_else(|| panic!("{name} {flag} has no row in settings::{name}"));
                assert_eq!(
                    arg.get_env().and_then(|e| e.to_str()),
                    Some(row.env),
                    "{name} {flag}"
                );
                let default: Vec<&str> = arg
                    .get_default_values()
                    .iter()
                    .filter_map(|value| value.to_str())
                    .collect();
                assert_eq!(default.join(","), row.default, "{name} {flag}: default");
            }
            for row in rows {
                assert!(
                    flags.iter().any(|arg| arg
                        .get_long()
                        .is_some_and(|long| format!("--{long}") == row.flag)),
                    "{name}: the row {} has no flag",
                    row.flag
                );
            }
        }
    }
}
