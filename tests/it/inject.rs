//! `statestore-gateway inject` and `injector` as processes, the webhook
//! over real TLS with AdmissionReview bodies as the API server sends them,
//! and the Grafana dashboard against a real gateway's `/metrics`.
//! (scripts/validate-deploy checks the same samples against the Kubernetes
//! schemas and the chart's rendering.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::gateway::Stack;
use crate::support::{TestPki, free_port, sse, terminate_and_wait, wait_for_listener};

const BINARY: &str = env!("CARGO_BIN_EXE_statestore-gateway");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `statestore-gateway inject ARGS` on `input`; (exit code, stdout, stderr).
fn inject(args: &[&str], input: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(BINARY)
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).unwrap()
}

/// The pods the sample workloads would make: each pod template as a Pod,
/// annotated for the webhook.
fn sample_pods() -> Vec<Value> {
    let text = std::fs::read_to_string(repo("tests/inject-samples/workloads.yaml")).unwrap();
    let mut pods = Vec::new();
    for doc in documents(&text) {
        let template = match doc["kind"].as_str().unwrap() {
            "Pod" => doc.clone(),
            "CronJob" => doc
                .pointer("/spec/jobTemplate/spec/template")
                .unwrap()
                .clone(),
            "ConfigMap" | "Service" => continue,
            _ => doc.pointer("/spec/template").unwrap().clone(),
        };
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"].clone(), "spec": template["spec"]});
        let name = format!("{}-abcde", doc["metadata"]["name"].as_str().unwrap());
        pod["metadata"]["name"] = name.into();
        pod["metadata"]["annotations"]["statestore-gateway/inject"] = "enabled".into();
        pods.push(pod);
    }
    pods
}

/// An AdmissionReview v1 as the API server sends it for a pod CREATE.
fn review(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "9c1e8f0e-1111-2222-3333-444455556666",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    })
}

/// A running `injector` on a free port, with the PKI it serves.
struct Injector {
    child: Child,
    port: u16,
    client: reqwest::Client,
    pki: TestPki,
    _dir: tempfile::TempDir,
}

impl Injector {
    async fn start(sets: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::generate(dir.path(), "injector");
        let port = free_port();
        let mut command = Command::new(BINARY);
        command.args([
            "injector",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tls-cert-file",
            pki.server_cert.to_str().unwrap(),
            "--tls-key-file",
            pki.server_key.to_str().unwrap(),
        ]);
        for set in sets {
            command.args(["--set", set]);
        }
        if std::env::var_os("TEST_LOG").is_none() {
            command.stderr(Stdio::null());
        }
        let child = command.spawn().unwrap();
        wait_for_listener(([127, 0, 0, 1], port).into(), Duration::from_secs(10)).await;
        let client = client_trusting(&pki.ca);
        Self {
            child,
            port,
            client,
            pki,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    async fn post(&self, body: impl Into<reqwest::Body>, content_type: &str) -> (u16, String) {
        let response = tokio::time::timeout(
            Duration::from_secs(10),
            self.client
                .post(self.url("/mutate"))
                .header("content-type", content_type)
                .body(body)
                .send(),
        )
        .await
        .expect("the webhook answers within 10 s")
        .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client_trusting(ca: &Path) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_webhooks_patch_gives_each_pod_what_inject_gives_it() {
    let sets = [
        "gateway.port=9080",
        "gateway.adminPort=9081",
        "sidecar.daprPorts=true",
    ];
    let injector = Injector::start(&sets).await;
    let set_args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
    let pods = sample_pods();
    assert_eq!(pods.len(), 7);
    for pod in pods {
        let (status, body) = injector
            .post(
                serde_json::to_vec(&review(&pod)).unwrap(),
                "application/json",
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        let response = &answer["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["allowed"], true, "{body}");
        assert_eq!(response["patchType"], "JSONPatch");
        use base64::Engine as _;
        let patch = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &patch).unwrap();

        let (code, injected, stderr) = inject(&set_args, &serde_json::to_string(&pod).unwrap());
        assert_eq!(code, 0, "{stderr}");
        let injected = documents(&injected);
        assert_eq!(injected.len(), 1);
        assert_eq!(patched, injected[0], "{}", pod["metadata"]["name"]);
        assert_ne!(patched, pod);
        // The app's containers reach the gateway as their Dapr sidecar.
        let app = &patched["spec"]["containers"][0];
        for name in ["DAPR_HTTP_PORT", "DAPR_GRPC_PORT"] {
            let var = app["env"]
                .as_array()
                .and_then(|env| env.iter().find(|v| v["name"] == name));
            assert_eq!(var.map(|v| &v["value"]), Some(&json!("9080")), "{app}");
        }
    }
}

#[tokio::test]
async fn the_webhook_leaves_other_pods_and_refuses_bad_bodies_without_falling_over() {
    let injector = Injector::start(&[]).await;
    // Not annotated, or opted out: allowed, no patch.
    let mut pod = sample_pods().remove(0);
    for annotation in [None, Some("disabled")] {
        match annotation {
            None => pod["metadata"]["annotations"] = json!({}),
            Some(value) => {
                pod["metadata"]["annotations"]["statestore-gateway/inject"] = value.into()
            }
        }
        let (status, body) = injector
            .post(
                serde_json::to_vec(&review(&pod)).unwrap(),
                "application/json",
            )
            .await;
        assert_eq!(status, 200);
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            answer["response"],
            json!({"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true})
        );
    }
    // Asked for with a setting the gateway would refuse: denied, saying why.
    pod["metadata"]["annotations"] = json!({
        "statestore-gateway/inject": "enabled",
        "statestore-gateway/gateway.poolSize": "100",
    });
    let (status, body) = injector
        .post(
            serde_json::to_vec(&review(&pod)).unwrap(),
            "application/json",
        )
        .await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("--pool-size"), "{message}");

    let oversized = vec![b' '; 4 * 1024 * 1024];
    for (body, content_type, expect_status, says) in [
        (b"{not json".to_vec(), "application/json", 400, "parse"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "application/json",
            400,
            "no request",
        ),
        (
            br#"{"apiVersion":"v1","kind":"Pod","request":{}}"#.to_vec(),
            "application/json",
            422,
            "missing field",
        ),
        (b"{}".to_vec(), "text/plain", 415, "application/json"),
        (oversized, "application/json", 413, ""),
    ] {
        let (status, text) = injector.post(body, content_type).await;
        assert_eq!(status, expect_status, "{text}");
        assert!(text.contains(says), "{text}");
    }
    // A body refused before it was read ends its connection, and says so:
    // a client that sent it all must not reuse the connection.
    let refused = injector
        .client
        .post(injector.url("/mutate"))
        .header("content-type", "application/json")
        .body(vec![b' '; 4 * 1024 * 1024])
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 413);
    assert_eq!(
        refused
            .headers()
            .get("connection")
            .map(|value| value.as_bytes()),
        Some(&b"close"[..])
    );
    // Plain HTTP on the TLS port: the handshake fails, the webhook lives.
    let plain = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/mutate", injector.port))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(plain.map(|r| r.status().as_u16() != 200).unwrap_or(true));
    let live = injector
        .client
        .get(injector.url("/livez"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
}

/// A TLS connection to the injector that sends a review's headers and one
/// byte of its body, then nothing: a client too slow (or hostile) to finish.
async fn slow_review(
    port: u16,
    connector: tokio_rustls::TlsConnector,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use tokio::io::AsyncWriteExt as _;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let mut tls = tokio::time::timeout(Duration::from_secs(30), connector.connect(name, tcp))
        .await
        .ok()?
        .ok()?;
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 2000\r\n\r\n{",
    )
    .await
    .ok()?;
    tls.flush().await.ok()?;
    Some(tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_get_408_and_cannot_keep_a_review_from_its_answer() {
    use futures_util::StreamExt as _;
    use tokio::io::AsyncReadExt as _;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    let injector = Injector::start(&[]).await;
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(&injector.pki.ca).unwrap();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));

    // 512 clients hold a connection each with a body that never ends.
    let started = std::time::Instant::now();
    let slow: Vec<_> = futures_util::stream::iter(0..512)
        .map(|_| slow_review(injector.port, connector.clone()))
        .buffer_unordered(64)
        .collect()
        .await;
    let mut slow: Vec<_> = slow.into_iter().flatten().collect();
    eprintln!(
        "{} slow clients connected in {:?}",
        slow.len(),
        started.elapsed()
    );
    assert!(slow.len() >= 500, "only {} slow clients got in", slow.len());

    // A client that never starts its TLS handshake is closed soon.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", injector.port))
        .await
        .unwrap();

    // A valid review is still answered, well within the API server's 10 s.
    let mut pod = sample_pods().remove(0);
    pod["metadata"]["annotations"] = json!({"statestore-gateway/inject": "enabled"});
    let asked = std::time::Instant::now();
    let (status, body) = injector
        .post(
            serde_json::to_vec(&review(&pod)).unwrap(),
            "application/json",
        )
        .await;
    let answered_in = asked.elapsed();
    eprintln!("a valid review answered in {answered_in:?} beside the slow clients");
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    assert!(
        answered_in < Duration::from_secs(6),
        "a valid review took {answered_in:?} beside slow clients"
    );

    // Each slow client is answered 408 and its connection closed, after
    // the body timeout and not much later.
    let reads = slow.iter_mut().map(|tls| async move {
        let mut received = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(15), tls.read_to_end(&mut received)).await;
        String::from_utf8_lossy(&received).into_owned()
    });
    let answers = futures_util::future::join_all(reads).await;
    let cut_off_in = started.elapsed();
    for answer in &answers {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    assert!(
        cut_off_in < Duration::from_secs(20),
        "the slow clients were cut off after {cut_off_in:?}"
    );
    let mut nothing = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(2), silent.read_to_end(&mut nothing)).await;
    assert!(
        closed.is_ok(),
        "a connection without a TLS handshake is still open after {:?}",
        started.elapsed()
    );
}

/// Every kind of scalar kubectl (YAML 1.1) reads differently from YAML
/// 1.2, in the fields Kubernetes users write in octal and elsewhere.
const SCALARS: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # comments are dropped; values are not
  labels: {app: web, tier: "0400", on: yes}
spec:
  replicas: 0x2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
      annotations:
        note: |
          line one
            indented
          last
        folded: >
          a b
          c
    spec:
      terminationGracePeriodSeconds: 1:00
      containers:
      - name: web
        image: nginx
        env:
        - {name: A, value: "yes"}
        - {name: B, value: ~}
        - name: C
          value: '12:30'
        args: [on, off, 1_000, 12:30, 0x1F, .inf, -.inf, .nan, 0o400, 1e3, 1.5e+3, ~, null, "", '']
        volumeMounts:
        - {name: secret, mountPath: /s}
      volumes:
      - name: secret
        secret:
          secretName: s
          defaultMode: 0400
          items:
          - {key: a, path: a, mode: 0644}
          - key: b
            path: b
            mode: 0o600
      - name: cfg
        configMap: {name: c, defaultMode: 420}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
data:
  x: &anchor "1"
  y: *anchor
"#;

/// The documents of `path` as PyYAML (a YAML 1.1 loader, as kubectl's is)
/// reads them, as JSON (a float stays a float: `256.0`, not `256`), with
/// the sidecar's container, volumes and pod security context taken out.
fn read_as_yaml_1_1(path: &Path) -> Value {
    const LOADER: &str = r#"
import json, math, sys, yaml
def plain(x):
    if isinstance(x, float) and not math.isfinite(x): return repr(x)
    if isinstance(x, dict): return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list): return [plain(v) for v in x]
    return x
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for doc in docs:
    spec = doc.get("spec", {}).get("template", {}).get("spec")
    if spec:
        spec["containers"] = [c for c in spec["containers"] if c["name"] != "statestore-gateway"]
        spec["volumes"] = [v for v in spec["volumes"] if not v["name"].startswith("statestore-gateway-")]
        spec.pop("securityContext", None)
print(json.dumps(plain(docs)))
"#;
    let out = Command::new("python3")
        .args(["-c", LOADER])
        .arg(path)
        .output()
        .expect("python3 runs (scripts/test installs PyYAML)");
    assert!(
        out.status.success(),
        "PyYAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn inject_output_means_to_a_yaml_1_1_reader_what_its_input_meant() {
    let (code, injected, stderr) = inject(&[], SCALARS);
    assert_eq!(code, 0, "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.yaml"), dir.path().join("out.yaml"));
    std::fs::write(&input, SCALARS).unwrap();
    std::fs::write(&output, &injected).unwrap();
    let (before, after) = (read_as_yaml_1_1(&input), read_as_yaml_1_1(&output));
    assert_eq!(before, after, "{injected}");
    // The octal modes kubectl sends: 0400 is 256, 0644 is 420; 0o600 is
    // not an integer in YAML 1.1 and stays the string it was.
    let volume = &after[0]["spec"]["template"]["spec"]["volumes"][0]["secret"];
    assert_eq!(volume["defaultMode"], json!(256));
    assert_eq!(volume["items"][0]["mode"], json!(420));
    assert_eq!(volume["items"][1]["mode"], json!("0o600"));
    assert!(injected.contains("defaultMode: 0400"), "{injected}");
    // The sidecar is there, and injecting again changes nothing.
    let output = statestore_gateway::inject::yaml::parse(&injected).unwrap();
    let containers = &output[0].to_json()["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[1]["name"], "statestore-gateway");
    let (code, again, stderr) = inject(&[], &injected);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(again, injected);
}

#[test]
fn the_dapr_ports_annotation_points_the_apps_dapr_sdk_at_the_sidecar() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: orders\n  annotations:\n    \
               statestore-gateway/sidecar.daprPorts: \"true\"\n    \
               statestore-gateway/gateway.port: \"9080\"\n    statestore-gateway/gateway.adminPort: \"9081\"\n\
               spec:\n  containers:\n  - name: app\n    image: app\n    env:\n    \
               - {name: DAPR_HTTP_PORT, value: \"3500\"}\n";
    let (code, out, stderr) = inject(&[], pod);
    assert_eq!(code, 0, "{stderr}");
    let out = documents(&out);
    assert_eq!(
        out[0]["spec"]["containers"][0]["env"],
        json!([
            {"name": "DAPR_HTTP_PORT", "value": "3500"},
            {"name": "DAPR_GRPC_PORT", "value": "9080"},
        ])
    );
    let (code, plain, stderr) = inject(&[], &pod.replace("\"true\"", "\"false\""));
    assert_eq!(code, 0, "{stderr}");
    assert!(!plain.contains("DAPR_GRPC_PORT"), "{plain}");
}

/// What the webhook's patch makes of `pod`.
async fn patched_by(injector: &Injector, pod: &Value) -> Value {
    let (status, body) = injector
        .post(
            serde_json::to_vec(&review(pod)).unwrap(),
            "application/json",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    patched
}

#[tokio::test]
async fn dapr_ports_keep_what_the_app_sets_through_env_from_with_inject_and_the_webhook() {
    let sets = [
        "sidecar.daprPorts=true",
        "gateway.port=9080",
        "gateway.adminPort=9081",
    ];
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orders", "annotations": {"statestore-gateway/inject": "enabled"}},
        "spec": {"containers": [
            {"name": "config-map", "image": "app", "envFrom": [{"configMapRef": {"name": "dapr"}}]},
            {"name": "secret", "image": "app", "envFrom": [{"secretRef": {"name": "dapr"}}]},
            {"name": "prefixed", "image": "app", "envFrom": [{"prefix": "DAPR_", "configMapRef": {"name": "ports"}}]},
            {"name": "other", "image": "app", "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}}]},
            {"name": "own", "image": "app", "env": [{"name": "DAPR_HTTP_PORT", "value": "3500"}]},
        ]},
    });
    let injector = Injector::start(&sets).await;
    let patched = patched_by(&injector, &pod).await;
    let set_args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
    let (code, injected, stderr) = inject(&set_args, &serde_json::to_string(&pod).unwrap());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(documents(&injected), std::slice::from_ref(&patched));
    let containers = patched["spec"]["containers"].as_array().unwrap();
    let env = |index: usize| containers[index].get("env").cloned();
    // The ConfigMap or Secret may hold the variables: the app's value stays theirs.
    for container in &containers[..3] {
        assert_eq!(container.get("env"), None, "{container}");
    }
    assert_eq!(
        env(3),
        Some(json!([
            {"name": "DAPR_HTTP_PORT", "value": "9080"},
            {"name": "DAPR_GRPC_PORT", "value": "9080"},
        ]))
    );
    assert_eq!(
        env(4),
        Some(json!([
            {"name": "DAPR_HTTP_PORT", "value": "3500"},
            {"name": "DAPR_GRPC_PORT", "value": "9080"},
        ]))
    );
}

#[test]
fn inject_refuses_a_pod_whose_own_container_or_volume_has_the_sidecars_name() {
    let pod = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: mine}}\nspec:\n  containers:\n  \
             - {{name: app, image: app}}\n{extra}"
        )
    };
    let own_container = pod("  - {name: statestore-gateway, image: my/own-gateway}\n");
    let own_volume =
        pod("  volumes:\n  - {name: statestore-gateway-ca, configMap: {name: my-ca}}\n");
    for (input, names) in [
        (own_container, "container statestore-gateway"),
        (own_volume, "volume statestore-gateway-ca"),
    ] {
        let (code, out, stderr) = inject(&[], &input);
        assert_eq!(code, 1, "{out}{stderr}");
        assert!(out.is_empty(), "{out}");
        assert!(stderr.contains("document 1, Pod/mine"), "{stderr}");
        assert!(stderr.contains(names), "{stderr}");
        assert!(stderr.contains("rename"), "{stderr}");
    }
    // The sidecar itself (from inject, the webhook or the chart's template)
    // is replaced, as before: injecting twice changes nothing.
    let (code, once, stderr) = inject(&[], &pod(""));
    assert_eq!(code, 0, "{stderr}");
    let (code, twice, stderr) = inject(&[], &once);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(once, twice);
}

#[tokio::test]
async fn the_webhook_serves_a_renewed_certificate_without_a_restart() {
    let injector = Injector::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let renewed = TestPki::generate(dir.path(), "renewed");
    // Files are replaced as a Secret mount does: new content, new mtime.
    std::fs::copy(&renewed.server_key, &injector.pki.server_key).unwrap();
    std::fs::copy(&renewed.server_cert, &injector.pki.server_cert).unwrap();
    let client = client_trusting(&renewed.ca);
    // Checked at most once a second; 20 s leaves room for a loaded machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // A fresh client each time: no connection reused from before.
        match client.get(injector.url("/livez")).send().await {
            Ok(response) if response.status() == 200 => break,
            _ => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the renewed certificate is served within 20 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test]
async fn inject_and_injector_refuse_unusable_settings_with_the_usage_code() {
    let (code, _, stderr) = inject(&["--set", "broker.keepAlive=2"], "");
    assert_eq!(code, 2);
    assert!(stderr.contains("--keep-alive"), "{stderr}");
    let (code, _, stderr) = inject(&["--set", "broker.passwordSecret.name=pw"], "");
    assert_eq!(code, 2);
    assert!(stderr.contains("broker.sat.enabled"), "{stderr}");
    let (code, _, stderr) = inject(&[], "kind: [unclosed");
    assert_eq!(code, 1);
    assert!(stderr.contains("not valid YAML"), "{stderr}");

    let mut child = Command::new(BINARY)
        .args([
            "injector",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--tls-cert-file",
            "/nonexistent/tls.crt",
            "--tls-key-file",
            "/nonexistent/tls.key",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = terminate_after(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(2));
}

/// Waits for `child` to exit on its own, up to `within`; then SIGTERM.
fn terminate_after(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    terminate_and_wait(child, Duration::from_secs(5))
}

#[tokio::test]
async fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let text = std::fs::read_to_string(repo(
        "helm/statestore-gateway/dashboards/statestore-gateway.json",
    ))
    .unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queried = std::collections::BTreeSet::new();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("statestore_gateway_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            queried.insert(name);
        }
    }

    // A gateway that has served keys, errors and a watch: every family
    // has a sample then (labelled families appear once used).
    let stack = Stack::builder()
        .emulator(|c| c.max_keys = Some(1))
        .start()
        .await;
    let http = &stack.gateway.http;
    let put = |key: &'static str| {
        let url = stack.gateway.url(&format!("/keys/{key}"));
        async move {
            http.put(url)
                .body("v")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(put("a").await, 200);
    assert!(put("b").await >= 400, "the second key exceeds the quota");
    let mut stream = sse::open(http, &stack.gateway.url("/watch/a"), None)
        .await
        .unwrap();
    stream.expect("sync").await;
    let metrics = http
        .get(stack.gateway.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    for name in &queried {
        assert!(
            exported.contains(name.as_str()),
            "the dashboard queries {name}, which /metrics does not export:\n{metrics}"
        );
    }
}

fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    ("query", Value::Object(query)) => {
                        if let Some(Value::String(q)) = query.get("query") {
                            out.push(q.clone());
                        }
                    }
                    _ => collect_exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, out)),
        _ => {}
    }
}
