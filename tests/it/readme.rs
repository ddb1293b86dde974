//! The README's curl tour, run line by line against a real gateway with the
//! real `curl`, checking the status each line's comment promises.

use std::process::Command;
use std::time::Duration;

use crate::support::gateway::Stack;

const README: &str = include_str!("../../README.md");

/// The first ```sh block after the tour heading.
fn tour() -> &'static str {
    let section = README
        .split_once("## A tour with curl")
        .expect("the README has a curl tour")
        .1;
    let block = section
        .split_once("```sh\n")
        .expect("the tour has a sh block")
        .1;
    block.split_once("```").expect("the block ends").0
}

/// Turns the tour into a script: `cmd  # → 200` becomes `expect 200 cmd`,
/// `# → sse` checks that the stream starts with a sync event, `# → sse
/// subscribed` with a subscribed event (`/subscribe`).
fn script(tour: &str, api: &str, admin: &str) -> String {
    let mut script = String::from(
        r#"set -u
fail=0
expect() {
  want=$1; shift
  got=$("$@" --silent --show-error --output /dev/null --write-out '%{http_code}')
  if [ "$got" != "$want" ]; then echo "FAIL: expected $want, got $got: $*"; fail=1; fi
}
expect_sse() {
  event=$1; shift
  out=$("$@" --silent --max-time 2)
  case "$out" in *"event: $event"*) ;; *) echo "FAIL: no $event event from: $*"; fail=1 ;; esac
}
"#,
    );
    for line in tour.lines() {
        let line = line
            .replace("localhost:8080", api)
            .replace("localhost:8081", admin);
        let trimmed = line.trim_start();
        if let Some((command, expected)) = line.split_once("# → ") {
            let command = command.trim_end();
            match expected.trim() {
                "sse" => script.push_str(&format!("expect_sse sync {command}\n")),
                "sse subscribed" => {
                    script.push_str(&format!("expect_sse subscribed {command}\n"));
                }
                status => {
                    assert!(
                        status.len() == 3 && status.bytes().all(|b| b.is_ascii_digit()),
                        "bad annotation in {line:?}"
                    );
                    script.push_str(&format!("expect {status} {command}\n"));
                }
            }
        } else {
            assert!(
                !trimmed.starts_with("curl"),
                "every curl example states the status it gets: {line:?}"
            );
            script.push_str(&line);
            script.push('\n');
        }
    }
    script.push_str("exit $fail\n");
    script
}

#[tokio::test]
async fn tour_runs_as_documented() {
    let stack = Stack::start().await;
    let api = stack
        .gateway
        .url("")
        .trim_start_matches("http://")
        .to_owned();
    let admin = stack
        .gateway
        .admin_url("")
        .trim_start_matches("http://")
        .to_owned();
    let script = script(tour(), &api, &admin);
    assert!(script.matches("expect ").count() >= 15, "{script}");
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .arg("-c")
                .arg(&script)
                .output()
                .expect("bash and curl are installed (scripts/test installs curl)")
        }),
    )
    .await
    .expect("the tour finishes within 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the README tour failed:\n{stdout}\n{stderr}"
    );
}
