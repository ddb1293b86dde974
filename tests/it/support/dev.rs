//! The real `statestore-gateway dev` binary on free ports.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::free_port;

/// A `dev` process whose banner has been printed (it is ready).
#[derive(Debug)]
pub struct DevProcess {
    child: Child,
    /// Key API address.
    pub api: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    /// Embedded broker address.
    pub broker: SocketAddr,
    /// Everything it printed on stdout up to and including the banner.
    pub banner: String,
}

/// The banner's last line: printed once everything serves.
const BANNER_END: &str = "Ctrl-C stops everything.";

impl DevProcess {
    /// Starts `dev` with a flag for every port and waits (up to 60 s) for
    /// its banner.
    pub async fn start(extra_args: &[&str]) -> Self {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let (api, admin, broker) = (
            loopback(free_port()),
            loopback(free_port()),
            loopback(free_port()),
        );
        let stderr = if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_statestore-gateway"))
            .arg("dev")
            .args(["--listen", &api.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--broker-listen", &broker.to_string()])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start the dev binary");
        let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().unwrap()).unwrap();
        let mut process = Self {
            child,
            api,
            admin,
            broker,
            banner: String::new(),
        };
        let mut lines = BufReader::new(stdout).lines();
        let read_banner = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                process.banner.push_str(&line);
                process.banner.push('\n');
                if line == BANNER_END {
                    return true;
                }
            }
            false
        };
        let printed = tokio::time::timeout(Duration::from_secs(60), read_banner).await;
        assert!(
            matches!(printed, Ok(true)),
            "no banner from dev within 60 s (exit: {:?}); got:\n{}",
            process.child.try_wait(),
            process.banner
        );
        // Keep reading stdout so a later print never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        process
    }

    /// `http://<api>/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.api, path.trim_start_matches('/'))
    }

    /// Asks it to stop (SIGTERM) and waits (up to 15 s) for its exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        super::terminate_and_wait(&mut self.child, Duration::from_secs(15))
    }
}

/// A test that ends (or panics) must not leave the binary running.
impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
