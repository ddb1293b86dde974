//! How a pool member proves who it is: TLS (server CA, client certificate),
//! `K8S-SAT` enhanced authentication, username and password.
//!
//! Every file is read anew for every connection attempt, because Kubernetes
//! rotates projected tokens, mounted secrets and trust bundles in place; a
//! bad file at start fails [`check`] with an error naming the setting.
//!
//! TLS uses a rustls `ClientConfig` built here rather than rumqttc's
//! `TlsConfiguration::Simple`: that variant calls `ClientConfig::builder()`,
//! which panics when more than one rustls crypto provider is compiled in (as
//! it is in the test build), and it only reports unusable PEM files at
//! connect time. We pin the aws-lc-rs provider that rumqttc's `use-rustls`
//! feature brings and parse the files up front.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rumqttc::tokio_rustls::rustls::{
    self, ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
};
use rumqttc::v5::MqttOptions;
use rumqttc::{TlsConfiguration, Transport};

#[cfg(test)]
use super::options::REQUEST_CHANNEL_CAPACITY;
use super::options::base_options;
use super::settings::{BrokerSettings, fits_mqtt};
use crate::settings::{self, Setting, SettingError};

/// The enhanced authentication method of the AIO broker's service-account
/// token authentication.
pub const SAT_METHOD: &str = "K8S-SAT";

/// Where the system's CA bundle lives when `AIO_TLS_CA_FILE` is not given
/// (the paths OpenSSL's probe looks at first; `SSL_CERT_FILE` wins).
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
];

/// The options of one connection attempt, and the token it authenticates
/// with (to tell when the token file has moved on).
#[derive(Debug)]
pub(crate) struct ConnectOptions {
    /// Ready for `AsyncClient::new`.
    pub options: MqttOptions,
    /// The `K8S-SAT` token sent, if any.
    pub sat_token: Option<Bytes>,
}

/// Reads every file once as a connection would, so that `Pool::start`
/// fails with a clear error instead of members retrying forever.
pub(crate) fn check(broker: &BrokerSettings) -> Result<(), SettingError> {
    connect_options(broker, "check").map(drop)
}

/// Builds the options for one connection attempt of `client_id`, reading
/// the token, password and TLS files now. The settings themselves were
/// checked once, by [`BrokerSettings::check`].
pub(crate) fn connect_options(
    broker: &BrokerSettings,
    client_id: &str,
) -> Result<ConnectOptions, SettingError> {
    let mut options = base_options(client_id, &broker.host, broker.port, broker.keep_alive);
    // We re-subscribe and re-register after every connect, so an old
    // session is of no use; a clean start also drops QoS 1 replies queued
    // for a previous connection.
    options.set_clean_start(true);
    let session_expiry = u32::try_from(broker.session_expiry.as_secs()).unwrap_or(u32::MAX);
    options.set_session_expiry_interval(Some(session_expiry));

    if broker.use_tls {
        let config = tls_config(broker)?;
        options.set_transport(Transport::Tls(TlsConfiguration::Rustls(config)));
    }

    let password = match &broker.password_file {
        Some(path) => Some(read_password(path)?),
        None => None,
    };
    fits_mqtt(
        &settings::MQTT_PASSWORD_FILE,
        password.as_ref().map_or(0, String::len),
    )?;
    if broker.username.is_some() || password.is_some() {
        // rumqttc leaves an empty user name or password out of CONNECT.
        options.set_credentials(
            broker.username.clone().unwrap_or_default(),
            password.unwrap_or_default(),
        );
    }

    let sat_token = match &broker.sat_file {
        Some(path) => {
            let token = read_sat(path)?;
            fits_mqtt(&settings::SAT_FILE, token.len())?;
            options
                .set_authentication_method(Some(SAT_METHOD.to_owned()))
                .set_authentication_data(Some(token.clone()));
            Some(token)
        }
        None => None,
    };
    Ok(ConnectOptions { options, sat_token })
}

/// The service-account token, byte for byte (the SDK sends the file as is).
pub(crate) fn read_sat(path: &Path) -> Result<Bytes, SettingError> {
    let token = read_mqtt_credential(&settings::SAT_FILE, path)?;
    if token.is_empty() {
        return Err(unusable(&settings::SAT_FILE, path, "is empty"));
    }
    Ok(Bytes::from(token))
}

/// The password, verbatim as the SDK reads it (a trailing newline is part
/// of the password).
fn read_password(path: &Path) -> Result<String, SettingError> {
    let setting = &settings::MQTT_PASSWORD_FILE;
    let bytes = read_mqtt_credential(setting, path)?;
    String::from_utf8(bytes).map_err(|_| unusable(setting, path, "is not UTF-8 text"))
}

fn tls_config(broker: &BrokerSettings) -> Result<Arc<ClientConfig>, SettingError> {
    ServerName::try_from(broker.host.as_str()).map_err(|_| {
        SettingError::new(
            &settings::BROKER_HOSTNAME,
            format!("{:?} is not a valid TLS server name", broker.host),
        )
    })?;

    let roots = trust_roots(&settings::TLS_CA_FILE, broker.ca_file.as_deref())?;
    let builder = tls_builder(&settings::TLS_CERT_FILE)?.with_root_certificates(roots);
    let config = match (&broker.cert_file, &broker.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let chain = certificates(&settings::TLS_CERT_FILE, cert_path)?;
            let key_setting = &settings::TLS_KEY_FILE;
            let key_pem = read(key_setting, key_path)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|error| unusable(key_setting, key_path, &error.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| SettingError::new(key_setting, error.to_string()))?
        }
        // A half pair is refused by `BrokerSettings::check`.
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A TLS client configuration without a client certificate that trusts
/// the PEM CA bundle `ca_file`, else the system's (as the broker
/// connection does): for the gateway's other outgoing TLS (a JWKS URL).
/// Errors name `setting`.
pub fn tls_client_config(
    setting: &Setting,
    ca_file: Option<&Path>,
) -> Result<Arc<ClientConfig>, SettingError> {
    let roots = trust_roots(setting, ca_file)?;
    Ok(Arc::new(
        tls_builder(setting)?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// The roots a server's certificate must chain to: the PEM CA bundle at
/// `ca_file`, or without one the system bundle.
fn trust_roots(setting: &Setting, ca_file: Option<&Path>) -> Result<RootCertStore, SettingError> {
    let ca_path = match ca_file {
        Some(path) => path.to_owned(),
        None => system_ca_bundle(setting)?,
    };
    let ca_certificates = certificates(setting, &ca_path)?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(ca_certificates);
    if added == 0 {
        return Err(unusable(
            setting,
            &ca_path,
            "holds no usable CA certificate",
        ));
    }
    Ok(roots)
}

/// A client configuration builder on the aws-lc-rs provider rumqttc's
/// `use-rustls` brings (the builder's default panics with two providers).
fn tls_builder(
    setting: &Setting,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, SettingError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| SettingError::new(setting, error.to_string()))
}

/// Every certificate of a PEM file; an error if there is none.
fn certificates(
    setting: &Setting,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, SettingError> {
    let pem = read(setting, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| unusable(setting, path, &format!("is not valid PEM: {error}")))?;
    if certificates.is_empty() {
        return Err(unusable(setting, path, "holds no PEM certificate"));
    }
    Ok(certificates)
}

fn system_ca_bundle(setting: &Setting) -> Result<PathBuf, SettingError> {
    if let Some(path) = std::env::var_os("SSL_CERT_FILE") {
        return Ok(PathBuf::from(path));
    }
    SYSTEM_CA_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .ok_or_else(|| {
            SettingError::new(
                setting,
                "not set, and no system CA bundle was found (set it, or SSL_CERT_FILE)",
            )
        })
}

fn read(setting: &Setting, path: &Path) -> Result<Vec<u8>, SettingError> {
    std::fs::read(path).map_err(|error| {
        SettingError::new(setting, format!("cannot read {}: {error}", path.display()))
    })
}

fn read_mqtt_credential(setting: &Setting, path: &Path) -> Result<Vec<u8>, SettingError> {
    crate::files::secret::read_mqtt_credential(path)
        .map_err(|error| SettingError::new(setting, error.to_string()))
}

fn unusable(setting: &Setting, path: &Path, problem: &str) -> SettingError {
    SettingError::new(setting, format!("{} {problem}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings() -> BrokerSettings {
        BrokerSettings::new("localhost", 1883)
    }

    /// What `Pool::start` checks: the settings' rules, then every file read.
    fn start_check(broker: &BrokerSettings) -> Result<(), SettingError> {
        broker.check()?;
        check(broker)
    }

    /// The flag an error names.
    fn named(result: Result<impl std::fmt::Debug, SettingError>) -> &'static str {
        result.unwrap_err().setting
    }

    fn file(dir: &tempfile::TempDir, name: &str, contents: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn values_longer_than_an_mqtt_string_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(65_536);
        let mut broker = settings();
        broker.username = Some(long.clone());
        let error = start_check(&broker).unwrap_err();
        assert_eq!(error.setting, "--mqtt-username");
        assert!(error.message.starts_with("65536 bytes"), "{error}");
        broker.username = Some(long[1..].to_owned());
        assert!(start_check(&broker).is_ok(), "65,535 bytes fit");
        let mut broker = settings();
        broker.password_file = Some(file(&dir, "password", long.as_bytes()));
        assert_eq!(
            named(connect_options(&broker, "gw-0")),
            "--mqtt-password-file"
        );
        let mut broker = settings();
        broker.sat_file = Some(file(&dir, "token", long.as_bytes()));
        assert_eq!(named(connect_options(&broker, "gw-0")), "--sat-file");
    }

    #[test]
    fn plain_settings_give_clean_start_and_session_expiry() {
        let mut broker = settings();
        broker.session_expiry = Duration::from_secs(3600);
        let built = connect_options(&broker, "gw-0").unwrap();
        assert!(built.options.clean_start());
        assert_eq!(built.options.session_expiry_interval(), Some(3600));
        assert_eq!(
            built.options.max_packet_size(),
            Some(super::super::options::MAX_PACKET_SIZE)
        );
        assert_eq!(built.options.client_id(), "gw-0");
        assert!(built.sat_token.is_none());
        assert!(built.options.credentials().is_none());
    }

    #[test]
    fn outgoing_window_is_small_but_above_the_pools_in_flight_cap() {
        let built = connect_options(&settings(), "gw-0").unwrap();
        let limit = built.options.get_outgoing_inflight_upper_limit().unwrap();
        // rumqttc allocates a slot per packet id up to the limit, at once.
        assert!(limit <= 4096, "{limit}");
        assert!(
            usize::from(limit) >= REQUEST_CHANNEL_CAPACITY / 2,
            "{limit}"
        );
        assert!(built.options.credentials().is_none());
    }

    #[test]
    fn sat_token_is_read_verbatim_as_k8s_sat() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.sat_file = Some(file(&dir, "token", b"eyJhbGciOi.token\n"));
        let built = connect_options(&broker, "gw-0").unwrap();
        assert_eq!(
            built.options.authentication_method().as_deref(),
            Some("K8S-SAT")
        );
        assert_eq!(
            built.options.authentication_data().as_deref(),
            Some(&b"eyJhbGciOi.token\n"[..])
        );
        assert_eq!(built.sat_token.as_deref(), Some(&b"eyJhbGciOi.token\n"[..]));
        // The base options' maximum packet size survives the auth properties.
        assert_eq!(
            built.options.max_packet_size(),
            Some(super::super::options::MAX_PACKET_SIZE)
        );
    }

    #[test]
    fn missing_sat_file_names_the_setting() {
        let mut broker = settings();
        broker.sat_file = Some("/nonexistent/token".into());
        let error = start_check(&broker).unwrap_err().to_string();
        assert!(
            error.starts_with("invalid --sat-file (AIO_SAT_FILE): cannot read /nonexistent/token"),
            "{error}"
        );
    }

    #[test]
    fn empty_sat_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.sat_file = Some(file(&dir, "token", b""));
        let error = start_check(&broker).unwrap_err();
        assert_eq!(error.setting, "--sat-file");
        assert!(error.message.ends_with("is empty"), "{error}");
    }

    #[test]
    fn password_file_is_read_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.username = Some("user".into());
        broker.password_file = Some(file(&dir, "password", b"s3cret"));
        let login = connect_options(&broker, "gw-0")
            .unwrap()
            .options
            .credentials()
            .unwrap();
        assert_eq!(login.username, "user");
        assert_eq!(login.password, "s3cret");
    }

    #[test]
    fn sat_and_password_together_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.sat_file = Some(file(&dir, "token", b"t"));
        broker.password_file = Some(file(&dir, "password", b"p"));
        assert_eq!(named(start_check(&broker)), "--sat-file");
    }

    #[test]
    fn unreadable_ca_file_names_the_setting() {
        let mut broker = settings();
        broker.use_tls = true;
        broker.ca_file = Some("/nonexistent/ca.crt".into());
        let error = start_check(&broker).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("invalid --tls-ca-file (AIO_TLS_CA_FILE): cannot read"),
            "{error}"
        );
    }

    #[test]
    fn ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.use_tls = true;
        broker.ca_file = Some(file(&dir, "ca.crt", b"not a certificate\n"));
        let error = start_check(&broker).unwrap_err().to_string();
        assert!(
            error.contains("AIO_TLS_CA_FILE") && error.contains("no PEM certificate"),
            "{error}"
        );
    }

    #[test]
    fn tls_with_a_ca_file_builds() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.use_tls = true;
        broker.ca_file = Some(file(&dir, "ca.crt", ca_pem().as_bytes()));
        let built = connect_options(&broker, "gw-0").unwrap();
        assert!(matches!(
            built.options.transport(),
            Transport::Tls(TlsConfiguration::Rustls(_))
        ));
    }

    #[test]
    fn tls_without_host_is_refused() {
        let mut broker = settings();
        broker.use_tls = true;
        broker.host = String::new();
        assert_eq!(named(start_check(&broker)), "--broker-host");
        broker.host = "bad host name".into();
        let error = start_check(&broker).unwrap_err();
        assert_eq!(error.setting, "--broker-host");
        assert!(
            error.message.contains("not a valid TLS server name"),
            "{error}"
        );
    }

    #[test]
    fn half_a_client_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.use_tls = true;
        broker.ca_file = Some(file(&dir, "ca.crt", ca_pem().as_bytes()));
        broker.cert_file = Some(file(&dir, "client.crt", ca_pem().as_bytes()));
        assert_eq!(named(start_check(&broker)), "--tls-key-file");
    }

    #[test]
    fn client_key_file_without_a_key_names_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = settings();
        broker.use_tls = true;
        broker.ca_file = Some(file(&dir, "ca.crt", ca_pem().as_bytes()));
        broker.cert_file = Some(file(&dir, "client.crt", ca_pem().as_bytes()));
        broker.key_file = Some(file(&dir, "client.key", ca_pem().as_bytes()));
        let error = start_check(&broker).unwrap_err().to_string();
        assert!(
            error.starts_with("invalid --tls-key-file (AIO_TLS_KEY_FILE)"),
            "{error}"
        );
    }

    #[test]
    fn tls_files_without_tls_are_refused() {
        let mut broker = settings();
        broker.ca_file = Some("/some/ca.crt".into());
        let error = broker.check().unwrap_err();
        assert_eq!(error.setting, "--tls-ca-file");
        assert!(
            error.message.contains("AIO_MQTT_USE_TLS is false"),
            "{error}"
        );
    }
}
