//! Signed tokens for tests: keys generated per test (RSA, EC, Ed25519), a
//! JWKS of their public halves written to a file (or served), and JWTs
//! signed with chosen claims, `kid` and `alg`, refused kinds included
//! (`none`, HMAC).
//!
//! ```ignore
//! let key = SigningKey::rsa("k1");
//! write_jwks(&path, &[&key]);
//! let settings = jwt_settings(&path);          // ISSUER, AUDIENCE
//! let token = key.sign(&claims("alice"));       // RS256, kid k1, exp in 10 min
//! let expired = key.sign(&claims_with("alice", json!({"exp": now() - 3600})));
//! ```

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use statestore_gateway::access::jwt::{JwtSettings, KeySource};

/// The issuer test tokens carry and test gateways require.
pub const ISSUER: &str = "https://issuer.test.invalid";
/// The audience test tokens carry and test gateways require.
pub const AUDIENCE: &str = "statestore-gateway-tests";

/// A private key that signs tokens, and its public JWK.
#[derive(Clone)]
pub struct SigningKey {
    /// The `kid` of its JWK and of the tokens it signs.
    pub kid: String,
    /// The algorithm its tokens name.
    pub alg: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, {:?})", self.kid, self.alg)
    }
}

impl SigningKey {
    /// A new RSA 2048 key signing RS256.
    pub fn rsa(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
        let key = EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes()).unwrap();
        Self::new(kid, Algorithm::RS256, key)
    }

    /// A new P-256 key signing ES256.
    pub fn ec(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Self::new(
            kid,
            Algorithm::ES256,
            EncodingKey::from_ec_der(pair.serialized_der()),
        )
    }

    /// A new P-384 key signing ES384.
    pub fn ec384(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        Self::new(
            kid,
            Algorithm::ES384,
            EncodingKey::from_ec_der(pair.serialized_der()),
        )
    }

    /// A new Ed25519 key signing EdDSA.
    pub fn ed25519(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        // The crate makes Ed25519 JWKs only from PKCS #8 v1 keys; this one
        // is v2 (it holds the public key): the JWK is written out.
        let jwk = json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(pair.public_key_raw()),
        });
        Self {
            kid: kid.to_owned(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(pair.serialized_der()),
            jwk,
        }
    }

    /// The same key signing with another algorithm of its family (an RSA
    /// key: RS384, PS256, ...). Its JWK names no `alg`, so any of them passes.
    pub fn with_alg(mut self, alg: Algorithm) -> Self {
        self.alg = alg;
        self
    }

    fn new(kid: &str, alg: Algorithm, key: EncodingKey) -> Self {
        let mut jwk = Jwk::from_encoding_key(&key, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        // Any algorithm of the key type: `with_alg` may change it.
        jwk.common.key_algorithm = None;
        Self {
            kid: kid.to_owned(),
            alg,
            key,
            jwk: serde_json::to_value(&jwk).unwrap(),
        }
    }

    /// Its public JWK (`kid` set, no `alg`).
    pub fn jwk(&self) -> Value {
        self.jwk.clone()
    }

    /// A token of these claims, with `alg` and `kid` in its header.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        self.sign_with(header, claims)
    }

    /// A token of these claims with this header (no `kid`, another `kid`).
    pub fn sign_with(&self, header: Header, claims: &Value) -> String {
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Valid claims for `sub`: [`ISSUER`], [`AUDIENCE`], issued now,
/// expiring in ten minutes.
pub fn claims(sub: &str) -> Value {
    let now = now();
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600})
}

/// [`claims`] with some members replaced or added (`null` removes one).
pub fn claims_with(sub: &str, changes: Value) -> Value {
    let mut claims = claims(sub);
    let (Some(map), Value::Object(changes)) = (claims.as_object_mut(), changes) else {
        panic!("claims and changes are objects");
    };
    for (name, value) in changes {
        if value.is_null() {
            map.remove(&name);
        } else {
            map.insert(name, value);
        }
    }
    claims
}

/// The claims of a projected Kubernetes service-account token for
/// `namespace`/`name`: `sub` `system:serviceaccount:<ns>:<name>`, `aud` a
/// list holding [`AUDIENCE`], and the `kubernetes.io` claim.
pub fn service_account_claims(namespace: &str, name: &str) -> Value {
    claims_with(
        &format!("system:serviceaccount:{namespace}:{name}"),
        json!({
            "aud": ["https://kubernetes.default.svc", AUDIENCE],
            "nbf": now(),
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": "5a1e0d6c-0000-4000-8000-000000000001"},
                "pod": {"name": format!("{name}-0"), "uid": "5a1e0d6c-0000-4000-8000-000000000002"},
            },
        }),
    )
}

/// A token signed with HMAC-SHA256 over `secret` (never accepted).
pub fn hmac_token(secret: &[u8], kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).unwrap()
}

/// An unsigned token (`alg: none`, empty signature; never accepted).
pub fn unsigned_token(kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "none", "typ": "JWT", "kid": kid});
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// A JWKS document of these keys' public halves.
pub fn jwks(keys: &[&SigningKey]) -> Value {
    json!({ "keys": keys.iter().map(|key| key.jwk()).collect::<Vec<_>>() })
}

/// Writes [`jwks`] to `path` as a whole (a temporary file renamed over
/// it, as a ConfigMap update does), so no reader sees half a file.
pub fn write_jwks(path: &Path, keys: &[&SigningKey]) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, jwks(keys).to_string()).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Settings accepting tokens signed by the JWKS file at `path`, issued by
/// [`ISSUER`] for [`AUDIENCE`] (the file is checked every 100 ms).
pub fn jwt_settings(path: &Path) -> JwtSettings {
    let mut settings = JwtSettings::new(KeySource::File(path.to_owned()), ISSUER, AUDIENCE);
    settings.file_check_interval = std::time::Duration::from_millis(100);
    settings
}

/// A JWKS URL served over real HTTP (or HTTPS with a test CA's server
/// certificate): answers every GET with the current document and records
/// each request's `Authorization` header.
#[derive(Debug)]
pub struct JwksServer {
    /// `https://localhost:<port>/openid/v1/jwks` (or `http://`).
    pub url: String,
    state: std::sync::Arc<std::sync::Mutex<JwksServerState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct JwksServerState {
    document: String,
    authorizations: Vec<Option<String>>,
}

impl JwksServer {
    /// Serves `keys` over plain HTTP.
    pub async fn plain(keys: &[&SigningKey]) -> Self {
        Self::start(keys, None).await
    }

    /// Serves `keys` over TLS with `pki`'s server certificate (for
    /// `localhost`); a client trusts it with `pki.ca`.
    pub async fn tls(keys: &[&SigningKey], pki: &super::TestPki) -> Self {
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let chain = CertificateDer::pem_file_iter(&pki.server_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
        let provider =
            std::sync::Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        Self::start(
            keys,
            Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))),
        )
        .await
    }

    async fn start(keys: &[&SigningKey], tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let state = std::sync::Arc::new(std::sync::Mutex::new(JwksServerState {
            document: jwks(keys).to_string(),
            authorizations: Vec::new(),
        }));
        let served = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let state = served.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(&state, &request)) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let io = hyper_util::rt::TokioIo::new(tcp);
                            let _ = builder.serve_connection(io, service).await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                let io = hyper_util::rt::TokioIo::new(stream);
                                let _ = builder.serve_connection(io, service).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            url: format!("{scheme}://localhost:{port}/openid/v1/jwks"),
            state,
            task,
        }
    }

    /// Serves `keys` from now on.
    pub fn set_keys(&self, keys: &[&SigningKey]) {
        self.state.lock().unwrap().document = jwks(keys).to_string();
    }

    /// How many times the document was fetched.
    pub fn fetches(&self) -> usize {
        self.state.lock().unwrap().authorizations.len()
    }

    /// The `Authorization` header of each fetch.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().authorizations.clone()
    }

    /// Settings accepting tokens signed by the served keys, issued by
    /// [`ISSUER`] for [`AUDIENCE`]; `ca`: the test CA for `https`.
    pub fn settings(&self, ca: Option<&Path>) -> JwtSettings {
        let url = statestore_gateway::access::jwt::JwksUrl {
            uri: self.url.parse().unwrap(),
            ca_file: ca.map(Path::to_owned),
            token_file: None,
        };
        JwtSettings::new(KeySource::Url(url), ISSUER, AUDIENCE)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(
    state: &std::sync::Mutex<JwksServerState>,
    request: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let mut state = state.lock().unwrap();
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    state.authorizations.push(authorization);
    hyper::Response::builder()
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            state.document.clone(),
        )))
        .unwrap()
}
