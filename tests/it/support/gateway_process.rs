//! The `statestore-gateway serve` binary as a child process, for what only
//! a real process shows: its memory (VmRSS), its exit on SIGTERM.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::free_port;
use super::gateway::{encode, http_client};

/// A running gateway binary; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct GatewayProcess {
    child: Child,
    /// Key API address.
    pub api: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    /// A client with a timeout.
    pub http: reqwest::Client,
    /// What it wrote to stderr, when started to keep it.
    stderr: Option<StderrLines>,
}

/// Where the child's stderr goes.
enum Stderr {
    /// Nowhere, or the test's own with `TEST_LOG` set.
    Default,
    /// Into [`StderrLines`], line by line as it is written.
    Kept,
}

/// The MQTT client id a gateway is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientId {
    /// `--client-id gwp-<random>` (unless the test gives its own): no two
    /// tests' gateways share one.
    Random,
    /// None given: the gateway's own default.
    Default,
}

/// The lines a gateway wrote to stderr so far, read by a thread as it
/// writes them.
#[derive(Debug, Clone, Default)]
pub struct StderrLines(Arc<Mutex<Vec<String>>>);

impl StderrLines {
    fn read_from(pipe: impl std::io::Read + Send + 'static) -> Self {
        let lines = Self::default();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                kept.0.lock().unwrap().push(line);
            }
        });
        lines
    }

    /// The lines so far once `done` holds for them, or after `within`
    /// (for the caller's assertion to show what was there).
    pub async fn until(&self, done: impl Fn(&[String]) -> bool, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let lines = self.0.lock().unwrap().clone();
            if done(&lines) || Instant::now() >= deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl GatewayProcess {
    /// Starts `serve` against the plain-TCP broker on `broker_port` with a
    /// pool of 2 and a client id of its own, then `args` (a flag may be
    /// given once: a `--client-id` among them replaces the random one), and
    /// waits until `/readyz` is 200.
    pub async fn start(broker_port: u16, args: &[&str]) -> Self {
        Self::start_with_open_file_limit(broker_port, args, None).await
    }

    /// As [`start`](Self::start), with the soft limit on open files set to
    /// `soft_limit` (by the shell that then execs the binary, as a container
    /// runtime would start it).
    pub async fn start_with_open_file_limit(
        broker_port: u16,
        args: &[&str],
        soft_limit: Option<u64>,
    ) -> Self {
        Self::spawn(
            broker_port,
            args,
            soft_limit,
            &[],
            Stderr::Default,
            ClientId::Random,
        )
        .await
    }

    /// As [`start`](Self::start), with these environment variables (the
    /// `OTEL_*` ones of span export, which have no flags).
    pub async fn start_with_env(broker_port: u16, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(
            broker_port,
            args,
            None,
            env,
            Stderr::Default,
            ClientId::Random,
        )
        .await
    }

    /// As [`start`](Self::start), without `--client-id`: the gateway
    /// derives its own, as it does when nobody sets one.
    pub async fn start_with_default_client_id(broker_port: u16, args: &[&str]) -> Self {
        Self::spawn(
            broker_port,
            args,
            None,
            &[],
            Stderr::Default,
            ClientId::Default,
        )
        .await
    }

    /// As [`start_with_env`](Self::start_with_env), keeping what it writes
    /// to stderr ([`stderr`](Self::stderr)).
    pub async fn start_keeping_stderr(
        broker_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(broker_port, args, None, env, Stderr::Kept, ClientId::Random).await
    }

    async fn spawn(
        broker_port: u16,
        args: &[&str],
        soft_limit: Option<u64>,
        env: &[(&str, &str)],
        keep: Stderr,
        client_id: ClientId,
    ) -> Self {
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let binary = env!("CARGO_BIN_EXE_statestore-gateway");
        let mut command = match soft_limit {
            None => binary_command(),
            Some(limit) => {
                let mut shell = without_runner_settings(Command::new("sh"));
                shell
                    .arg("-c")
                    .arg(format!("ulimit -Sn {limit} && exec \"$0\" \"$@\""))
                    .arg(binary);
                shell
            }
        };
        let stderr = match keep {
            Stderr::Kept => Stdio::piped(),
            Stderr::Default if std::env::var_os("TEST_LOG").is_some() => Stdio::inherit(),
            Stderr::Default => Stdio::null(),
        };
        command.arg("serve");
        // A flag may not be given twice: a test's own id replaces ours.
        if client_id == ClientId::Random && !args.contains(&"--client-id") {
            command.args(["--client-id", &format!("gwp-{:08x}", rand::random::<u32>())]);
        }
        let mut child = command
            .args(["--listen", &api.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--broker-host", "127.0.0.1"])
            .args(["--broker-port", &broker_port.to_string()])
            .args(["--use-tls", "false"])
            .args(["--pool-size", "2"])
            .args(args)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the gateway binary");
        let stderr = child.stderr.take().map(StderrLines::read_from);
        let gateway = Self {
            child,
            api,
            admin,
            http: http_client(),
            stderr,
        };
        gateway.wait_readyz(200, Duration::from_secs(20)).await;
        gateway
    }

    /// What it wrote to stderr; panics unless started by
    /// [`start_keeping_stderr`](Self::start_keeping_stderr).
    pub fn stderr(&self) -> &StderrLines {
        self.stderr
            .as_ref()
            .expect("started with start_keeping_stderr")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its (soft, hard) limits on open files, from `/proc/<pid>/limits`.
    pub fn open_file_limits(&self) -> (u64, u64) {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.pid()))
            .expect("read /proc/<pid>/limits");
        let line = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .expect("a Max open files line");
        let mut numbers = line
            .split_whitespace()
            .map(|n| n.parse().expect("a number"));
        (numbers.next().expect("soft"), numbers.next().expect("hard"))
    }

    /// Resident memory now, in KiB (`VmRSS` in `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a VmRSS line")
    }

    /// Peak resident memory since start or the last
    /// [`reset_peak_rss`](Self::reset_peak_rss), in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a VmHWM line")
    }

    /// Sets the peak resident memory back to the current one (writing `5`
    /// to `/proc/<pid>/clear_refs`), to measure the peak of what follows.
    pub fn reset_peak_rss(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5")
            .expect("write /proc/<pid>/clear_refs");
    }

    /// CPU time used so far (user + system), from `/proc/<pid>/stat`.
    pub fn cpu_time(&self) -> Duration {
        cpu_time(&format!("/proc/{}/stat", self.pid()))
    }

    /// The URL of a key, every byte but letters and digits percent-encoded.
    pub fn key(&self, key: &[u8]) -> String {
        format!("http://{}/keys/{}", self.api, encode(key))
    }

    /// A URL on the key API listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    /// `/readyz`'s status; 0 when it does not answer.
    pub async fn readyz(&self) -> u16 {
        match self
            .http
            .get(format!("http://{}/readyz", self.admin))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        }
    }

    /// Waits until `/readyz` answers `status`.
    pub async fn wait_readyz(&self, status: u16, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.readyz().await;
            if now == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz of the gateway binary is {now}, not {status}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The sum of every sample of metric `name` (all label sets); panics if
    /// there is none, so a renamed metric cannot read as 0.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await
            .expect("scrape /metrics")
            .text()
            .await
            .expect("read /metrics");
        let samples: Vec<f64> = text
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .collect();
        assert!(!samples.is_empty(), "no {name} samples in /metrics");
        samples.iter().sum()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        super::send_signal(self.pid(), "TERM");
    }

    /// Waits for the process to exit; `None` if it is still running after
    /// `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the child") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// User + system CPU time of the process whose `stat` file is at `path`
/// (`/proc/self/stat` for the test itself).
pub fn cpu_time(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).expect("read a /proc stat file");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Linux reports in USER_HZ, 100 on every platform we run on.
    Duration::from_millis(ticks * 10)
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary, with none of the settings of the test runner's environment
/// (`STATESTORE_GATEWAY_*`, `AIO_*`, `OTEL_*`): a test's own flags and
/// variables are all that configure it.
pub fn binary_command() -> Command {
    without_runner_settings(Command::new(env!("CARGO_BIN_EXE_statestore-gateway")))
}

fn without_runner_settings(mut command: Command) -> Command {
    for (name, _) in std::env::vars() {
        if name.starts_with("STATESTORE_GATEWAY_")
            || name.starts_with("AIO_")
            || name.starts_with("OTEL_")
        {
            command.env_remove(name);
        }
    }
    command
}
