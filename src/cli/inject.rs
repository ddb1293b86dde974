//! `inject` and `injector`: their arguments and the sidecar values they make.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::parse::LogFormat;
use crate::inject::values::SidecarValues;
use crate::settings::{self, SettingError};

/// The sidecar's settings, in the Helm chart's terms, for `inject` and
/// `injector`: the chart's defaults, then values files, then `--set`.
#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    /// A values file of the Helm chart (only image, gateway, broker,
    /// sidecar, probes, resources, securityContext and podSecurityContext
    /// are read); repeatable, later files win.
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// One chart value, `PATH=VALUE` (`gateway.port=9080`,
    /// `sidecar.native=true`); repeatable, wins over the files.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
}

impl SidecarArgs {
    /// The chart's values with the files and `--set` applied, checked as
    /// the sidecar they make.
    pub fn settings(&self) -> Result<SidecarValues, SettingError> {
        let values = SidecarValues::from_sources(&self.values, &self.set)?
            .checked_by(super::serve::check_environment);
        values.sidecar()?;
        Ok(values)
    }
}

/// Settings of `inject`.
#[derive(Debug, Clone, Args)]
pub struct InjectArgs {
    /// Kubernetes YAML (several documents, `List`s); standard input when
    /// absent or `-`.
    pub file: Option<PathBuf>,
    /// The sidecar.
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}

/// Settings of `injector`.
#[derive(Debug, Clone, Args)]
pub struct InjectorArgs {
    /// Address of the HTTPS listener (`POST /mutate`, `GET /livez`).
    #[arg(long, env = settings::INJECTOR_LISTEN.env, default_value = settings::INJECTOR_LISTEN.default)]
    pub listen: SocketAddr,
    /// PEM certificate chain served; read again when it changes.
    #[arg(long, env = settings::INJECTOR_TLS_CERT_FILE.env)]
    pub tls_cert_file: PathBuf,
    /// PEM private key of that certificate.
    #[arg(long, env = settings::INJECTOR_TLS_KEY_FILE.env)]
    pub tls_key_file: PathBuf,
    /// Log line format.
    #[arg(long, env = settings::INJECTOR_LOG_FORMAT.env, value_enum, default_value = settings::INJECTOR_LOG_FORMAT.default)]
    pub log_format: LogFormat,
    /// The sidecar (pods' annotations may override single values).
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}
