//! `dev`: its arguments and the [`DevSettings`] they make.

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args};

use super::serve::check_outbox;
use crate::dapr::{DaprSettings, OutboxSettings};
use crate::dev::DevSettings;
use crate::settings::{self, SettingError};

/// The arguments of `dev`. Everything listens on loopback by default: the
/// embedded broker accepts anonymous clients and nothing uses TLS.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Address of the HTTP key and watch API.
    #[arg(long, env = settings::DEV_LISTEN.env, default_value = settings::DEV_LISTEN.default)]
    pub listen: std::net::SocketAddr,
    /// Address of the admin endpoints (/livez, /readyz, /metrics).
    #[arg(long, env = settings::DEV_ADMIN_LISTEN.env, default_value = settings::DEV_ADMIN_LISTEN.default)]
    pub admin_listen: std::net::SocketAddr,
    /// Address of the embedded MQTT broker; other MQTT clients (mosquitto_pub,
    /// the AIO SDKs) can use the emulator through it.
    #[arg(long, env = settings::DEV_BROKER_LISTEN.env, default_value = settings::DEV_BROKER_LISTEN.default)]
    pub broker_listen: std::net::SocketAddr,
    /// Directory where the emulator keeps its data across restarts; without
    /// it the store lives in memory only.
    #[arg(long, env = settings::DEV_DATA_DIR.env)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Dapr transactions (`true`/`false`), as `serve`'s.
    #[arg(long, env = settings::DEV_DAPR_TRANSACTIONS.env, default_value = settings::DEV_DAPR_TRANSACTIONS.default, action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub dapr_transactions: bool,
    /// The Dapr outbox's topic: a committed transaction's upserts are
    /// published there through the pub/sub `pubsub`. Needs
    /// `--dapr-transactions true`.
    #[arg(long, env = settings::DEV_DAPR_OUTBOX_TOPIC.env, default_value = settings::DEV_DAPR_OUTBOX_TOPIC.default)]
    pub dapr_outbox_topic: String,
}

impl DevArgs {
    /// The dev stack's settings; refused when the outbox's topic cannot be
    /// one or transactions are off.
    pub fn settings(&self) -> Result<DevSettings, SettingError> {
        let outbox = if self.dapr_outbox_topic.is_empty() {
            None
        } else {
            check_outbox(
                &self.dapr_outbox_topic,
                &settings::DEV_DAPR_OUTBOX_TOPIC,
                self.dapr_transactions,
                &settings::DEV_DAPR_TRANSACTIONS,
            )?;
            Some(OutboxSettings {
                pubsub: settings::DAPR_PUBSUB.default.to_owned(),
                topic: self.dapr_outbox_topic.clone(),
            })
        };
        Ok(DevSettings {
            listen: self.listen,
            admin_listen: self.admin_listen,
            broker_listen: self.broker_listen,
            data_dir: self.data_dir.clone(),
            dapr: DaprSettings {
                transactions: self.dapr_transactions,
                outbox,
                ..DaprSettings::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Dev {
        #[command(flatten)]
        args: DevArgs,
    }

    fn settings(args: &[&str]) -> Result<DevSettings, SettingError> {
        let mut argv = vec!["dev"];
        argv.extend_from_slice(args);
        Dev::try_parse_from(argv).unwrap().args.settings()
    }

    #[test]
    fn the_outbox_of_dev_goes_through_pubsub_and_needs_transactions() {
        assert_eq!(settings(&[]).unwrap().dapr.outbox, None);
        let refused = settings(&["--dapr-outbox-topic", "done"]).unwrap_err();
        assert!(
            refused.to_string().contains("--dapr-transactions"),
            "{refused}"
        );
        let dapr = settings(&["--dapr-transactions", "true", "--dapr-outbox-topic", "done"])
            .unwrap()
            .dapr;
        assert!(dapr.transactions);
        assert_eq!(
            dapr.outbox,
            Some(OutboxSettings {
                pubsub: "pubsub".into(),
                topic: "done".into()
            })
        );
    }
}
