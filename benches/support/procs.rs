//! The processes a run starts (mosquitto, the emulator, the gateway, redis,
//! webdis and nginx with nchan) and their resident memory and CPU time (as
//! `proc_fs` reads them), so the gateway's footprint is its own and nobody
//! else's.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::proc_fs::{cpu_ns, cpu_ticks, kib_field, status_field, tree};

/// A child process with its log file, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `command` with stdout and stderr going to `<dir>/<name>.log`.
    pub fn spawn(name: &str, dir: &Path, command: &mut Command) -> Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({command:?})"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the end of the log when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}); {}", self.name, self.log_tail());
        }
        Ok(())
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        format!("last lines of {}:\n{tail}", self.log.display())
    }

    /// Resident set size now, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        status_field(self.pid(), "VmRSS:")
    }

    /// Proportional set size of the process and its children (nginx's
    /// workers), in KiB: pages they share (the master's, a shared memory
    /// zone) count once in all, not once per process as summed RSS would.
    pub fn tree_pss_kib(&self) -> Result<u64> {
        tree(self.pid())
            .into_iter()
            .map(|pid| kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:"))
            .sum()
    }

    /// Resident set size of the process and its children, summed, in KiB.
    pub fn tree_rss_kib(&self) -> Result<u64> {
        tree(self.pid())
            .into_iter()
            .map(|pid| status_field(pid, "VmRSS:"))
            .sum()
    }

    /// User plus system CPU time so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        cpu_ticks(&format!("/proc/{}/stat", self.pid()))
    }

    /// [`cpu_ns`] of the process and its live children.
    pub fn tree_cpu_ns(&self) -> Result<u64> {
        tree(self.pid()).into_iter().map(cpu_ns).sum()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // nginx's workers outlive a killed master: they are killed too,
        // after it (a live master would start new ones).
        let children: Vec<String> = tree(self.pid())[1..].iter().map(u32::to_string).collect();
        let _ = self.child.kill();
        if !children.is_empty() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(&children)
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.wait();
    }
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on `port`.
pub fn wait_for_port(proc: &mut Proc, port: u16, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        proc.check_alive()?;
        if Instant::now() > deadline {
            bail!("{} does not listen on {port} after {within:?}", proc.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The first of `names` found on the PATH or in the sbin directories
/// (mosquitto and redis live there on Debian).
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    names.iter().find_map(|name| {
        dirs.iter()
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// The first line a program prints for its version flag (stdout or stderr).
pub fn version_line(program: &Path, flag: &str) -> String {
    Command::new(program)
        .arg(flag)
        .output()
        .ok()
        .map(|out| {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|| "unknown".into())
}

/// mosquitto on a free port, with `set_tcp_nodelay true` (without it every
/// round trip waits for the delayed ACK) and no limits on in-flight or
/// queued messages, so the broker is not what throttles the pool.
pub fn start_mosquitto(program: &Path, dir: &Path) -> Result<(Proc, u16)> {
    let port = free_port()?;
    let config = dir.join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n\
             persistence false\nmax_inflight_messages 0\nmax_queued_messages 100000\n\
             log_dest stderr\nlog_type error\nlog_type warning\n"
        ),
    )?;
    let mut proc = Proc::spawn(
        "mosquitto",
        dir,
        Command::new(program).arg("-c").arg(&config),
    )?;
    wait_for_port(&mut proc, port, Duration::from_secs(10))?;
    Ok((proc, port))
}

/// The emulator serving the broker on `broker_port`, once it answers a
/// GET: it subscribes to its request topic a moment after it starts, and a
/// gateway asked before that answers 503.
pub async fn start_emulator(binary: &Path, dir: &Path, broker_port: u16) -> Result<Proc> {
    let proc = Proc::spawn(
        "emulator",
        dir,
        Command::new(binary)
            .arg("emulator")
            .arg("--broker")
            .arg(format!("127.0.0.1:{broker_port}"))
            .arg("--client-id")
            .arg("bench-emulator")
            .env("RUST_LOG", "warn"),
    )?;
    // The direct pool is ready once the emulator answers it.
    super::direct::start_pool(broker_port, 1)
        .await
        .with_context(|| format!("the emulator: {}", proc.log_tail()))?
        .shutdown()
        .await;
    Ok(proc)
}

/// redis-server without persistence on a free port.
pub fn start_redis(program: &Path, dir: &Path) -> Result<(Proc, u16)> {
    let port = free_port()?;
    let mut proc = Proc::spawn(
        "redis",
        dir,
        Command::new(program)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--loglevel", "warning", "--dir"])
            .arg(dir),
    )?;
    wait_for_port(&mut proc, port, Duration::from_secs(10))?;
    Ok((proc, port))
}

/// webdis in front of redis, one worker thread per core.
pub fn start_webdis(program: &Path, dir: &Path, redis_port: u16) -> Result<(Proc, u16)> {
    let port = free_port()?;
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let config = dir.join("webdis.json");
    let json = serde_json::json!({
        "redis_host": "127.0.0.1",
        "redis_port": redis_port,
        "redis_auth": null,
        "http_host": "127.0.0.1",
        "http_port": port,
        "threads": threads,
        "pool_size": 16,
        "daemonize": false,
        "database": 0,
        "verbosity": 1,
        "logfile": dir.join("webdis-internal.log"),
    });
    std::fs::write(&config, serde_json::to_vec_pretty(&json)?)?;
    let mut proc = Proc::spawn("webdis", dir, Command::new(program).arg(&config))?;
    wait_for_port(&mut proc, port, Duration::from_secs(10))?;
    Ok((proc, port))
}

/// Where Debian's `libnginx-mod-nchan` puts the module.
pub const NCHAN_MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";

/// nginx with nchan on a free port, two workers: EventSource subscribers
/// on `/sub/<channel>`, publishers on `/pub/<channel>` (a POST publishes
/// its body; a GET with `Accept: text/json` tells the channel's
/// subscribers). New subscribers get only messages published after they
/// joined, as the gateway's watchers do.
pub fn start_nchan(nginx: &Path, dir: &Path, connections: usize) -> Result<(Proc, u16)> {
    let port = free_port()?;
    let root = dir.join("nchan");
    std::fs::create_dir_all(root.join("tmp"))?;
    let config = root.join("nginx.conf");
    std::fs::write(
        &config,
        format!(
            "load_module {NCHAN_MODULE};\n\
             worker_processes 2;\n\
             worker_rlimit_nofile {files};\n\
             pid nginx.pid;\n\
             error_log error.log warn;\n\
             events {{ worker_connections {connections}; }}\n\
             http {{\n\
               access_log off;\n\
               client_body_temp_path tmp;\n\
               server {{\n\
                 listen 127.0.0.1:{port} backlog=1024;\n\
                 location ~ ^/sub/(.+)$ {{\n\
                   nchan_subscriber eventsource;\n\
                   nchan_channel_id $1;\n\
                   nchan_subscriber_first_message newest;\n\
                   nchan_eventsource_ping_interval {ping};\n\
                 }}\n\
                 location ~ ^/pub/(.+)$ {{ nchan_publisher; nchan_channel_id $1; }}\n\
               }}\n\
             }}\n",
            files = connections * 2,
            // As often as the gateway's keep-alive, so that both servers
            // keep idle streams open through proxies alike.
            ping = statestore_gateway::settings::DEFAULT_WATCH_KEEPALIVE.as_secs(),
        ),
    )?;
    let mut proc = Proc::spawn(
        "nchan",
        dir,
        Command::new(nginx)
            .arg("-p")
            .arg(&root)
            .arg("-c")
            .arg(&config)
            .args(["-g", "daemon off;"]),
    )?;
    wait_for_port(&mut proc, port, Duration::from_secs(10))?;
    Ok((proc, port))
}
