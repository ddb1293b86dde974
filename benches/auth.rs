//! The cost of checking a JWT, in one run:
//!
//! 1. **In the process**: `Verifier::verify` on tokens it has not seen
//!    (a signature check: RS256 with a 2048-bit key, ES256) against a
//!    token it has (a SHA-256 and a cache lookup).
//! 2. **Over HTTP**: one-key GETs one after the other on one keep-alive
//!    connection to a gateway without authentication, and to one that
//!    takes JWTs and a shared API token: the API token (a constant-time
//!    comparison: the same process's baseline), the same JWT each time
//!    (cached), and a new JWT each time (RS256, ES256). Reports the median
//!    time per request of the rounds, and each way's rate as a ratio of the
//!    unauthenticated gateway's and of the API token's on the same gateway
//!    (two processes differ by more than a cache lookup on a busy machine).
//!
//! Starts mosquitto, the emulator and two `statestore-gateway serve` (pool
//! of 4) as their own processes; the signing keys are made for the run.
//!
//! `scripts/bench --auth` runs it (release build); `scripts/bench --smoke`
//! runs one small round on the debug build that checks every answer and
//! asserts no timing.

#[allow(dead_code)] // the gateway benchmark's parts; this program uses a few
mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use statestore_gateway::access::jwt::{JwtSettings, KeySource, Verifier};
use statestore_gateway::metrics::Metrics;

use support::gateway::GatewayLaunch;
use support::http::HttpConn;
use support::procs;
use support::stats::median;

const ISSUER: &str = "https://issuer.bench.invalid";
const AUDIENCE: &str = "statestore-gateway-bench";
const API_TOKEN: &str = "bench-shared-token";

struct Options {
    requests: usize,
    rounds: usize,
    smoke: bool,
    report: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Option<Options>> {
        let Some((smoke, args)) = support::requested_args() else {
            return Ok(None);
        };
        let mut options = Options {
            requests: if smoke { 50 } else { 2_000 },
            rounds: if smoke { 1 } else { 7 },
            smoke,
            report: None,
        };
        support::read_number_flags(
            args,
            &mut [
                ("--requests", &mut options.requests),
                ("--rounds", &mut options.rounds),
            ],
            &mut options.report,
        )?;
        if options.requests == 0 || options.rounds == 0 {
            bail!("--requests and --rounds must be positive");
        }
        Ok(Some(options))
    }
}

fn main() -> ExitCode {
    support::main_with("auth", Options::parse, run)
}

/// A signing key and its public JWK.
struct Signer {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
}

impl Signer {
    fn rsa() -> Result<Self> {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?;
        Ok(Self {
            kid: "rsa",
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes())?,
        })
    }

    fn ec() -> Result<Self> {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        Ok(Self {
            kid: "ec",
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(pair.serialized_der()),
        })
    }

    fn jwk(&self) -> Result<serde_json::Value> {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg)?;
        jwk.common.key_id = Some(self.kid.to_owned());
        Ok(serde_json::to_value(jwk)?)
    }

    /// A token for `sub`, unique by `jti`, valid for an hour.
    fn token(&self, sub: &str, jti: usize) -> Result<String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_owned());
        let claims = json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "jti": jti, "iat": now, "exp": now + 3600,
        });
        Ok(jsonwebtoken::encode(&header, &claims, &self.key)?)
    }

    fn tokens(&self, count: usize, first: usize) -> Result<Vec<String>> {
        (first..first + count)
            .map(|jti| self.token("bench", jti))
            .collect()
    }
}

/// Median of a list of seconds.
/// Microseconds per call of `verify` on `tokens`, in order.
async fn verify_each(verifier: &Verifier, tokens: &[String]) -> Result<f64> {
    let started = Instant::now();
    for token in tokens {
        verifier
            .verify(token)
            .await
            .map_err(|error| anyhow::anyhow!("verify: {error}"))?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / tokens.len() as f64)
}

/// Microseconds per GET of `path`, one after the other, as each token.
async fn gets(
    conn: &mut HttpConn,
    path: &str,
    tokens: Option<&[String]>,
    count: usize,
) -> Result<f64> {
    let started = Instant::now();
    for i in 0..count {
        let response = match tokens {
            None => conn.request("GET", path, b"").await?,
            Some(tokens) => {
                conn.request_as(&tokens[i % tokens.len()], "GET", path, b"")
                    .await?
            }
        };
        if response.status != 200 {
            bail!(
                "GET {path}: {} {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / count as f64)
}

/// The ways over HTTP, in report order.
const WAYS: [&str; 6] = [
    "no authentication (another gateway process)",
    "API token",
    "JWT, same token (cached), RS256",
    "JWT, same token (cached), ES256",
    "JWT, new token each request, RS256",
    "JWT, new token each request, ES256",
];

async fn run(options: Options) -> Result<()> {
    let rsa = Signer::rsa()?;
    let ec = Signer::ec()?;
    let dir = tempfile::Builder::new()
        .prefix("auth-bench-")
        .tempdir()
        .context("a temporary directory")?;
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(
        &jwks_path,
        json!({"keys": [rsa.jwk()?, ec.jwk()?]}).to_string(),
    )?;

    // 1. In the process.
    let verifier = Verifier::start(
        JwtSettings::new(KeySource::File(jwks_path.clone()), ISSUER, AUDIENCE),
        Metrics::new(),
    )?;
    let count = options.requests;
    let mut direct: [Vec<f64>; 3] = Default::default();
    for round in 0..options.rounds {
        let first = (round + 1) * 1_000_000;
        direct[0].push(verify_each(&verifier, &rsa.tokens(count, first)?).await?);
        direct[1].push(verify_each(&verifier, &ec.tokens(count, first)?).await?);
        let same = vec![ec.token("bench", 0)?; count.max(10_000)];
        direct[2].push(verify_each(&verifier, &same).await?);
    }
    let direct = direct.map(|mut samples| median(&mut samples));

    // 2. Over HTTP.
    let mosquitto = procs::find_program(&["mosquitto"])
        .context("mosquitto is needed (scripts/bench installs it)")?;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_statestore-gateway"));
    let (_broker, port) = procs::start_mosquitto(&mosquitto, dir.path())?;
    let _emulator = procs::start_emulator(&binary, dir.path(), port).await?;
    let open_launch = GatewayLaunch {
        binary: &binary,
        dir: dir.path(),
        broker_port: port,
        pool_size: 4,
        max_watchers: 1_000,
        env: &[],
    };
    let open = open_launch.start("open").await?;
    let token_path = dir.path().join("api-token");
    std::fs::write(&token_path, API_TOKEN)?;
    let jwt_env = jwt_env(&jwks_path, &token_path);
    let checked = GatewayLaunch {
        env: &jwt_env,
        ..open_launch
    }
    .start("jwt")
    .await?;
    let path = "/keys/bench%2Fauth";
    let mut conn = HttpConn::connect(open.api).await?;
    if conn.request("PUT", path, b"sixteen bytes ok").await?.status != 200 {
        bail!("PUT {path} failed");
    }
    let mut open_conn = HttpConn::connect(open.api).await?;
    let mut jwt_conn = HttpConn::connect(checked.api).await?;
    // A refused token is refused (the gateway really checks).
    let forged = {
        let mut token = ec.token("bench", 0)?;
        token.truncate(token.len() - 4);
        token.push_str("AAAA");
        token
    };
    let refused = jwt_conn.request_as(&forged, "GET", path, b"").await?;
    if refused.status != 401 {
        bail!("a forged token got {}", refused.status);
    }
    let same_rsa = vec![rsa.token("bench", 0)?];
    let same_ec = vec![ec.token("bench", 0)?];
    // Warm up: connections, allocator, the two cached tokens.
    gets(&mut open_conn, path, None, count.min(200)).await?;
    gets(&mut jwt_conn, path, Some(&same_rsa), 10).await?;
    gets(&mut jwt_conn, path, Some(&same_ec), 10).await?;
    let api_token = vec![API_TOKEN.to_owned()];
    let mut samples: [Vec<f64>; 6] = Default::default();
    for round in 0..options.rounds {
        let first = (round + 1) * 10_000_000;
        let new_rsa = rsa.tokens(count, first)?;
        let new_ec = ec.tokens(count, first)?;
        // Each round starts with another way, so that none always runs
        // first or last in a round (the machine's load drifts).
        for way in (0..WAYS.len()).map(|at| (at + round) % WAYS.len()) {
            let (conn, tokens) = match way {
                0 => (&mut open_conn, None),
                1 => (&mut jwt_conn, Some(api_token.as_slice())),
                2 => (&mut jwt_conn, Some(same_rsa.as_slice())),
                3 => (&mut jwt_conn, Some(same_ec.as_slice())),
                4 => (&mut jwt_conn, Some(new_rsa.as_slice())),
                _ => (&mut jwt_conn, Some(new_ec.as_slice())),
            };
            samples[way].push(gets(conn, path, tokens, count).await?);
        }
    }
    let per_request = samples.map(|mut samples| median(&mut samples));

    let mut report = String::new();
    writeln!(
        report,
        "## The cost of checking a JWT\n\n{} rounds; medians.\n",
        options.rounds
    )?;
    writeln!(
        report,
        "| in the process (`Verifier::verify`) | per call |\n|---|---|"
    )?;
    for (name, us) in [
        (
            "new token, RS256 (2048-bit key): signature check",
            direct[0],
        ),
        ("new token, ES256 (P-256): signature check", direct[1]),
        ("token seen before: SHA-256 + cache lookup", direct[2]),
    ] {
        writeln!(report, "| {name} | {us:.2} us |")?;
    }
    writeln!(
        report,
        "\n| GET over HTTP, one at a time on one connection ({count} per round) | per request | rate / no authentication | rate / API token |\n|---|---|---|---|"
    )?;
    for (name, us) in WAYS.iter().zip(per_request) {
        writeln!(
            report,
            "| {name} | {us:.1} us | {:.2} | {:.2} |",
            per_request[0] / us,
            per_request[1] / us
        )?;
    }
    print!("{report}");
    if let Some(path) = &options.report {
        write_report(path, &report)?;
    }
    if options.smoke {
        println!("auth benchmark smoke run: every answer checked, no timing asserted");
    }
    Ok(())
}

fn jwt_env(jwks: &Path, api_token: &Path) -> Vec<(String, String)> {
    vec![
        (
            "STATESTORE_GATEWAY_API_TOKEN_FILE".into(),
            api_token.display().to_string(),
        ),
        (
            "STATESTORE_GATEWAY_JWT_JWKS_FILE".into(),
            jwks.display().to_string(),
        ),
        ("STATESTORE_GATEWAY_JWT_ISSUER".into(), ISSUER.into()),
        ("STATESTORE_GATEWAY_JWT_AUDIENCE".into(), AUDIENCE.into()),
    ]
}

fn write_report(path: &Path, report: &str) -> Result<()> {
    std::fs::write(path, report).with_context(|| format!("writing {}", path.display()))?;
    println!("report written to {}", path.display());
    Ok(())
}
