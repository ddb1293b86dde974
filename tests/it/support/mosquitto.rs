//! A real mosquitto broker on a free loopback port, for one test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_for_listener};

/// A running mosquitto; killed when dropped.
#[derive(Debug)]
pub struct Mosquitto {
    child: Option<Child>,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// Extra lines for the config file (TLS listeners, password files, ...).
#[derive(Debug, Default, Clone)]
pub struct MosquittoConfig {
    /// Appended verbatim after the default listener settings.
    pub extra: String,
    /// Whether the default listener refuses anonymous clients.
    pub deny_anonymous: bool,
}

fn binary() -> PathBuf {
    for candidate in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    panic!("mosquitto is not installed: run scripts/test, which installs it");
}

impl Mosquitto {
    /// Starts a broker with the default test config.
    pub async fn start() -> Self {
        Self::start_with(MosquittoConfig::default()).await
    }

    /// Starts a broker with extra config lines.
    pub async fn start_with(config: MosquittoConfig) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let config_path = dir.path().join("mosquitto.conf");
        let text = format!(
            "listener {port} 127.0.0.1\n\
             allow_anonymous {}\n\
             set_tcp_nodelay true\n\
             persistence false\n\
             max_inflight_messages 0\n\
             max_queued_messages 100000\n\
             log_dest stderr\n\
             log_type error\n\
             log_type warning\n\
             {}\n",
            !config.deny_anonymous, config.extra
        );
        std::fs::write(&config_path, text).expect("write mosquitto.conf");
        let mut broker = Self {
            child: None,
            dir,
            config: config_path,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        broker.spawn().await;
        broker
    }

    async fn spawn(&mut self) {
        let stderr = if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = Command::new(binary())
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        wait_for_listener(self.addr, Duration::from_secs(10)).await;
    }

    /// The directory holding the config, for certificate and password files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The port, for MQTT clients.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Kills the broker (SIGKILL): every connection drops at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker again on the same port after [`Mosquitto::kill`].
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Freezes the broker (SIGSTOP) and returns once it is stopped:
    /// connections stay open, nothing moves.
    pub fn pause(&self) {
        super::freeze(self.pid());
    }

    /// Thaws a paused broker (SIGCONT).
    pub fn resume(&self) {
        super::thaw(self.pid());
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("broker is running").id()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
    }
}
