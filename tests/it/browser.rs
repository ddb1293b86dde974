//! The `/ui/` dashboard in a real headless Chromium, driven by
//! `tests/browser/ui.mjs` (Node + playwright-core) against a running gateway.
//!
//! Needs Chromium, Node.js 20+ and the script's npm packages:
//! `scripts/install-browser-deps` installs them (`scripts/test` calls it).
//! When they are missing these tests fail and say so; they never skip.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use azure_iot_operations_services::state_store::SetOptions;
use statestore_gateway::watch::WatchSettings;

use crate::support::fault_proxy::FaultProxy;
use crate::support::gateway::{GatewayOptions, Stack};
use crate::support::sdk::{Calls, SdkClient};
use crate::support::wait_until;

/// The whole browser run: Chromium start, page load, its bounded waits
/// (the script gives up after 60 s on its own).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(75);

/// The load run: thousands of writes on a busy machine (the script gives
/// up after 150 s on its own).
const LOAD_SCRIPT_TIMEOUT: Duration = Duration::from_secs(170);

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

fn chromium_path() -> PathBuf {
    std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// Panics, naming what is missing and how to install it, unless Chromium,
/// Node.js 20+ and the script's npm packages are there.
pub fn require_browser_tools() {
    let mut missing = Vec::new();
    if !chromium_path().is_file() {
        missing.push(format!("Chromium ({})", chromium_path().display()));
    }
    match std::process::Command::new("node")
        .args(["-p", "process.versions.node"])
        .output()
    {
        Ok(out) if out.status.success() => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let major: u32 = version
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major < 20 {
                missing.push(format!("Node.js 20 or later (found {version})"));
            }
        }
        _ => missing.push("Node.js (`node` on PATH)".to_owned()),
    }
    if !browser_dir()
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        missing.push("the npm packages of tests/browser (playwright-core)".to_owned());
    }
    assert!(
        missing.is_empty(),
        "the browser test cannot run: missing {}. Run scripts/install-browser-deps",
        missing.join(", ")
    );
}

/// Runs `tests/browser/ui.mjs <base_url>` to completion (bounded), and
/// returns its output; the caller asserts on the exit status.
pub async fn run_ui_script(base_url: &str, api_token: Option<&str>) -> Output {
    run_ui_script_with(base_url, api_token, None).await
}

/// [`run_ui_script`], writing a screenshot of the page (key browser,
/// watched keys, a sparkline) to `screenshot` when given.
pub async fn run_ui_script_with(
    base_url: &str,
    api_token: Option<&str>,
    screenshot: Option<&Path>,
) -> Output {
    run_node(
        base_url,
        &[
            ("API_TOKEN", OsStr::new(api_token.unwrap_or_default())),
            (
                "SCREENSHOT",
                screenshot.unwrap_or(Path::new("")).as_os_str(),
            ),
        ],
        SCRIPT_TIMEOUT,
    )
    .await
}

/// Runs the script's load test: `keys` keys followed by the page, a burst
/// of changes to all of them, then their deletion.
pub async fn run_ui_load_script(base_url: &str, keys: usize) -> Output {
    run_node(
        base_url,
        &[("LOAD_KEYS", OsStr::new(&keys.to_string()))],
        LOAD_SCRIPT_TIMEOUT,
    )
    .await
}

async fn run_node(base_url: &str, env: &[(&str, &OsStr)], timeout: Duration) -> Output {
    let child = spawn_node(base_url, env);
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(output) => output.expect("the output of node"),
        Err(_) => panic!("tests/browser/ui.mjs did not finish within {timeout:?}"),
    };
    // Its steps, for `cargo test -- --nocapture`.
    print!("{}", String::from_utf8_lossy(&output.stdout));
    output
}

/// Starts `tests/browser/ui.mjs <base_url>` with its output piped (killed
/// when dropped).
fn spawn_node(base_url: &str, env: &[(&str, &OsStr)]) -> tokio::process::Child {
    node_command(base_url, env)
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("node starts")
}

/// `node tests/browser/ui.mjs <base_url>` with `env`, its output piped.
fn node_command(base_url: &str, env: &[(&str, &OsStr)]) -> tokio::process::Command {
    require_browser_tools();
    let mut command = tokio::process::Command::new("node");
    command
        .arg(browser_dir().join("ui.mjs"))
        .arg(base_url)
        .env("CHROMIUM", chromium_path())
        // Where the script writes a screenshot is the caller's choice only.
        .env_remove("SCREENSHOT")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Reads the script's stdout (bounded) until the line `wanted`, keeping
/// what it printed in `printed`.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    wanted: &str,
    printed: &mut String,
) {
    assert!(
        read_until_line(lines, wanted, printed).await,
        "the script did not print {wanted:?}:\n{printed}"
    );
}

/// Whether the script printed `wanted` (bounded), before it ended.
async fn read_until_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    wanted: &str,
    printed: &mut String,
) -> bool {
    let found = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("the script's stdout") {
            printed.push_str(&line);
            printed.push('\n');
            if line == wanted {
                return true;
            }
        }
        false
    })
    .await;
    matches!(found, Ok(true))
}

/// Asserts that the script passed, showing everything it printed if not.
pub fn assert_passed(output: &Output) {
    assert!(
        output.status.success(),
        "the browser test failed\n{}",
        describe(output)
    );
}

fn describe(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn chromium_node_and_playwright_are_installed() {
    require_browser_tools();
}

/// The whole dashboard against mosquitto + emulator + gateway: a key added
/// in the page follows a PUT and a DELETE made with plain HTTP, a value set
/// in the page's form lands in the store, the key browser lists keys by
/// glob, pages, watches a clicked key and draws its numeric values, and a
/// followed pattern shows keys created and deleted with plain HTTP arrive
/// and leave by themselves, with a chart of a selected key. Takes a
/// screenshot of the page into a temporary directory, and copies it over
/// the README's docs/dashboard.png only when asked ([`UPDATE_SCREENSHOT`]):
/// a test run leaves the tree as it found it.
#[tokio::test]
async fn dashboard_follows_curl_changes_live_and_sets_values_through_its_form() {
    require_browser_tools();
    let stack = Stack::start().await;
    let base = format!("http://{}", stack.gateway.api);
    let dir = tempfile::tempdir().unwrap();
    let screenshot = dir.path().join("dashboard.png");
    let output = run_ui_script_with(&base, None, Some(&screenshot)).await;
    assert_passed(&output);
    let png = std::fs::read(&screenshot).expect("the script wrote its screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "the screenshot is not a PNG"
    );
    if update_screenshot() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png");
        std::fs::write(&docs, &png).unwrap();
        println!("wrote {}", docs.display());
    }
    stack.gateway.shutdown().await;
}

/// The variable that asks the dashboard test to rewrite docs/dashboard.png
/// (`scripts/refresh-screenshot` sets it).
const UPDATE_SCREENSHOT: &str = "UPDATE_SCREENSHOT";

/// Whether the user started the tests with [`UPDATE_SCREENSHOT`] set (and
/// not empty or `0`). Read from the environment the run started with; no
/// test sets it.
fn update_screenshot() -> bool {
    std::env::var_os(UPDATE_SCREENSHOT).is_some_and(|value| !value.is_empty() && value != "0")
}

/// The same behind `--api-token-file`: the page asks for the token, and
/// once given, its stream (which cannot send a header) and its requests
/// pass.
#[tokio::test]
async fn dashboard_works_behind_an_api_token_once_given() {
    require_browser_tools();
    let token = "dash-t0ken/+&=";
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            api_token: Some(token.into()),
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let base = format!("http://{}", stack.gateway.api);
    let output = run_ui_script(&base, Some(token)).await;
    assert_passed(&output);
    stack.gateway.shutdown().await;
}

/// 1,000 keys followed on one stream keep up with a burst of 3,000 changes:
/// the page shows every final value within seconds of the last write,
/// touches only the rows that changed, never blocks its main thread for
/// long, and lets every row go when the keys are deleted (bounds in
/// `tests/browser/ui.mjs`, which prints what it measured).
#[tokio::test]
async fn dashboard_follows_1000_keys_through_a_burst_of_changes() {
    require_browser_tools();
    let stack = Stack::start().await;
    let base = format!("http://{}", stack.gateway.api);
    let output = run_ui_load_script(&base, 1000).await;
    assert_passed(&output);
    stack.gateway.shutdown().await;
}

/// Keys written by the official SDK client, which the gateway never sees,
/// reach a followed pattern too: a key it creates appears in the page
/// (found by the pattern's rescan, every 500 ms here), and leaves once it
/// deletes the key.
#[tokio::test]
async fn dashboard_follows_keys_the_official_sdk_creates_and_deletes() {
    use tokio::io::AsyncBufReadExt;

    require_browser_tools();
    let stack = Stack::builder()
        .gateway(GatewayOptions {
            watch: WatchSettings {
                rescan_interval: Duration::from_millis(500),
                ..WatchSettings::default()
            },
            ..GatewayOptions::default()
        })
        .start()
        .await;
    let base = format!("http://{}", stack.gateway.api);
    let mut child = spawn_node(&base, &[("SDK_PEER", OsStr::new("1"))]);
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut printed = String::new();
    wait_for_line(&mut lines, "ui test: SDK_READY", &mut printed).await;

    let sdk = SdkClient::connect(stack.broker.port(), "ui-sdk-peer");
    let key = b"ui-sdk/from-sdk";
    let set = sdk
        .set_ok(key, b"written by the SDK", SetOptions::default())
        .await;
    assert!(set.response);
    wait_for_line(&mut lines, "ui test: SDK_SEEN", &mut printed).await;
    assert_eq!(sdk.del_ok(key).await.response, 1);

    let rest = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            printed.push_str(&line);
            printed.push('\n');
        }
        child.wait_with_output().await.expect("the output of node")
    })
    .await;
    let Ok(output) = rest else {
        panic!("tests/browser/ui.mjs did not finish within {SCRIPT_TIMEOUT:?}:\n{printed}");
    };
    print!("{printed}");
    assert!(
        output.status.success(),
        "the browser test failed ({})\n--- stdout ---\n{printed}--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    sdk.close().await;
    stack.gateway.shutdown().await;
}

/// The page follows an MQTT topic filter with a wildcard (`ui-topic/+/#`):
/// a message published through the Dapr publish route and one published by
/// a plain MQTT client (`mosquitto_pub`, MQTT5) both show in its topic
/// table, newest first, with their topics and content types.
#[tokio::test]
async fn dashboard_follows_a_topic_published_over_dapr_and_plain_mqtt() {
    use tokio::io::AsyncBufReadExt;

    require_browser_tools();
    let stack = Stack::start().await;
    let base = format!("http://{}", stack.gateway.api);
    let mut child = spawn_node(&base, &[("TOPIC_PEER", OsStr::new("1"))]);
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut printed = String::new();
    wait_for_line(&mut lines, "ui test: TOPIC_READY", &mut printed).await;
    // The gateway's broker subscription is up: the page showed a message.
    crate::pubsub::mosquitto_pub(
        stack.broker.addr,
        "ui-topic/sensors/t1",
        "from an MQTT client",
        "text/plain",
    );
    let rest = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            printed.push_str(&line);
            printed.push('\n');
        }
        child.wait_with_output().await.expect("the output of node")
    })
    .await;
    let Ok(output) = rest else {
        panic!("tests/browser/ui.mjs did not finish within {SCRIPT_TIMEOUT:?}:\n{printed}");
    };
    print!("{printed}");
    assert!(
        output.status.success(),
        "the browser test failed ({})\n--- stdout ---\n{printed}--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stack.gateway.shutdown().await;
}

/// Tabs of one browser opened at once: twice as many as the six
/// connections a browser allows an origin over HTTP/1.1 (with a stream or
/// two per tab, the fourth tab would hang).
const TABS: usize = 12;

/// The open watch streams, as the gateway counts them.
const WATCHERS: &str = "statestore_gateway_watchers";

/// `tests/browser/ui.mjs` in a stepped mode (`TABS`, `RECONNECT`): it
/// prints a line at each step and waits for an answer on stdin, while the
/// test reads the gateway or injects a fault.
struct SteppedScript {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    stdin: tokio::process::ChildStdin,
    printed: String,
}

impl SteppedScript {
    fn start(base_url: &str, mode: &str, value: &str) -> Self {
        let mut child = node_command(base_url, &[(mode, OsStr::new(value))])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("node starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Self {
            child,
            lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
            stdin,
            printed: String::new(),
        }
    }

    /// Waits for `ui test: <step>`; panics with all the script said if it
    /// ends or stalls first.
    async fn reached(&mut self, step: &str) {
        let wanted = format!("ui test: {step}");
        if !read_until_line(&mut self.lines, &wanted, &mut self.printed).await {
            panic!("the script did not print {wanted:?}\n{}", self.said().await);
        }
    }

    /// Lets the script go on to its next step.
    async fn go_on(&mut self) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(b"next\n")
            .await
            .expect("the script reads stdin");
    }

    /// Everything the script printed, once it has ended (it ends by itself
    /// when it fails; one that stalls is stopped).
    async fn said(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        let bound = Duration::from_secs(10);
        if tokio::time::timeout(bound, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = tokio::time::timeout(bound, pipe.read_to_string(&mut stderr)).await;
        }
        format!("--- stdout ---\n{}--- stderr ---\n{stderr}", self.printed)
    }

    /// Reads the script to its end and asserts that it passed.
    async fn passed(mut self) {
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(SCRIPT_TIMEOUT, self.lines.next_line()).await
        {
            self.printed.push_str(&line);
            self.printed.push('\n');
        }
        let said = self.said().await;
        let status = self.child.try_wait();
        print!("{said}");
        assert!(
            matches!(status, Ok(Some(status)) if status.success()),
            "the browser test failed ({status:?})\n{said}"
        );
    }
}

/// The shared worker's rule for tabs without a Web Lock (an insecure
/// context), which a real browser would take minutes to show: a tab silent
/// past the limit is dropped (its streams close; it is told to start again
/// when it speaks), and one that pings keeps its stream. Under Node's
/// mocked clock (`tests/browser/stream-worker.test.mjs`).
#[tokio::test]
async fn the_stream_worker_drops_a_silent_tab_and_keeps_one_that_pings() {
    require_browser_tools();
    let run = tokio::process::Command::new("node")
        .arg("--test")
        .arg(browser_dir().join("stream-worker.test.mjs"))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("node --test finishes within 60 s")
        .expect("node runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// [`TABS`] tabs of one browser watching the same key and following the
/// same pattern share two streams through the page's SharedWorker: every
/// tab is live and shows a change made with plain HTTP, while the gateway
/// holds two watch streams, not two per tab. A tab watching a key of its
/// own holds one more stream until it closes: one that cannot hold a Web
/// Lock (it says goodbye on `pagehide`) and one that never says goodbye
/// (the worker learns from its lock). With all tabs but one closed the last
/// stays live on the same two streams; once it closes, none is left.
#[tokio::test]
async fn dashboard_tabs_beyond_the_connection_limit_share_their_streams() {
    let stack = Stack::start().await;
    let gateway = &stack.gateway;
    let watchers = || gateway.metric(WATCHERS).unwrap_or(-1.0);
    let settle = Duration::from_secs(10);
    let tabs = TABS.to_string();
    let mut script = SteppedScript::start(&format!("http://{}", gateway.api), "TABS", &tabs);

    script.reached(&format!("TABS_LIVE {TABS}")).await;
    assert_eq!(watchers(), 2.0, "{TABS} tabs live, two streams");
    script.go_on().await;
    for key in ["ui-tabs/unlocked", "ui-tabs/silent"] {
        script.reached(&format!("TABS_ALONE {key}")).await;
        assert_eq!(watchers(), 3.0, "a tab watches {key} too");
        script.go_on().await;
        script.reached(&format!("TABS_ALONE_CLOSED {key}")).await;
        wait_until(
            settle,
            &format!("the stream of {key} ends with its tab"),
            || watchers() == 2.0,
        )
        .await;
        script.go_on().await;
    }
    script.reached("TABS_ONE_LEFT").await;
    assert_eq!(watchers(), 2.0, "one tab left, live on the same streams");
    script.go_on().await;
    script.reached("TABS_ALL_CLOSED").await;
    wait_until(settle, "no stream left once every tab closed", || {
        watchers() == 0.0
    })
    .await;
    script.go_on().await;
    script.passed().await;
    stack.gateway.shutdown().await;
}

/// Two tabs showing a key through one shared stream, reached through a
/// proxy: when the proxy cuts every connection and refuses new ones, both
/// tabs say they are reconnecting; the key changes meanwhile; once
/// connections pass again, the worker's EventSource reconnects by itself
/// (with `Last-Event-ID`) and both tabs show the change, live, on one
/// stream again.
#[tokio::test]
async fn dashboard_tabs_reconnect_their_shared_stream_and_catch_up() {
    let stack = Stack::start().await;
    let gateway = &stack.gateway;
    let proxy = FaultProxy::start_bytes(gateway.api).await;
    let watchers = || gateway.metric(WATCHERS).unwrap_or(-1.0);
    let mut script = SteppedScript::start(&format!("http://{}", proxy.addr), "RECONNECT", "1");

    script.reached("RECONNECT_LIVE").await;
    assert_eq!(watchers(), 1.0, "two tabs, one stream");
    proxy.set_refuse(true);
    proxy.cut_all();
    let put = gateway
        .http
        .put(gateway.url("/keys/ui-reconnect%2Fkey"))
        .body("changed while cut off")
        .send()
        .await
        .expect("PUT straight to the gateway");
    assert_eq!(put.status(), 200);
    script.go_on().await;
    script.reached("RECONNECT_DOWN").await;
    proxy.set_refuse(false);
    script.go_on().await;
    script.reached("RECONNECT_BACK").await;
    wait_until(Duration::from_secs(10), "one stream again", || {
        watchers() == 1.0
    })
    .await;
    script.go_on().await;
    script.passed().await;
    drop(proxy);
    stack.gateway.shutdown().await;
}

#[tokio::test]
async fn ui_script_fails_with_a_clear_message_when_no_gateway_answers() {
    let port = crate::support::free_port();
    let output = run_ui_script(&format!("http://127.0.0.1:{port}"), None).await;
    assert!(!output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ui test FAILED") && stderr.contains(&format!("127.0.0.1:{port}")),
        "{}",
        describe(&output)
    );
}
