//! A listener's TLS: the serving certificate and key from PEM files, read
//! again when either file changes (cert-manager and Kubernetes Secret
//! mounts renew them in place), without a restart. The key API and the
//! admission webhook share it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

use crate::files::reloading::{FileError, Reload, ReloadingFile};
use crate::settings::{Setting, SettingError};

/// How often the files are read again.
const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The ALPN name of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN name of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// A serving certificate's two files and the settings that name them (for
/// the errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// The setting naming `cert_file`.
    pub cert_setting: &'static Setting,
    /// The setting naming `key_file`.
    pub key_setting: &'static Setting,
}

impl CertificateFiles {
    /// Both files, or neither: one alone is a mistake, named by the
    /// setting that is missing.
    pub fn pair(
        cert_file: Option<&Path>,
        key_file: Option<&Path>,
        cert_setting: &'static Setting,
        key_setting: &'static Setting,
    ) -> Result<Option<Self>, SettingError> {
        let missing = |given: &Setting, missing: &Setting| {
            SettingError::new(
                missing,
                format!("{} is set: give both files or neither", given.flag),
            )
        };
        match (cert_file, key_file) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(missing(cert_setting, key_setting)),
            (None, Some(_)) => Err(missing(key_setting, cert_setting)),
            (Some(cert), Some(key)) => Ok(Some(Self {
                cert_file: cert.to_owned(),
                key_file: key.to_owned(),
                cert_setting,
                key_setting,
            })),
        }
    }

    /// A TLS acceptor serving this certificate (TLS 1.2 and 1.3), read
    /// again when its files change, offering `alpn` in order of preference.
    /// The first read is the check at start: unreadable files, no PEM or a
    /// key that does not match the certificate are refused here, named by
    /// their setting. Must run inside a Tokio runtime.
    pub fn acceptor(&self, alpn: &[&[u8]]) -> Result<TlsAcceptor, SettingError> {
        let provider = provider();
        let resolver = Arc::new(self.reloading(provider.clone(), RELOAD_CHECK_INTERVAL)?);
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| SettingError::new(self.cert_setting, error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = alpn.iter().map(|name| name.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The serving certificate, read again when its files change.
#[derive(Debug)]
struct ReloadingCertificate(ReloadingFile<CertificatePair>);

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current()))
    }
}

impl CertificateFiles {
    fn reloading(
        &self,
        provider: Arc<CryptoProvider>,
        interval: Duration,
    ) -> Result<ReloadingCertificate, SettingError> {
        let paths = vec![self.cert_file.clone(), self.key_file.clone()];
        ReloadingFile::load(paths, CertificatePair { provider }, Some(interval))
            .map(ReloadingCertificate)
            .map_err(|error| {
                let setting = if error.file == 0 {
                    self.cert_setting
                } else {
                    self.key_setting
                };
                SettingError::new(setting, error.message)
            })
    }
}

/// How a certificate chain (the first file) and its key (the second)
/// parse into what rustls serves, and what their loads record.
#[derive(Debug)]
struct CertificatePair {
    provider: Arc<CryptoProvider>,
}

impl Reload for CertificatePair {
    type Value = Arc<CertifiedKey>;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<Arc<CertifiedKey>, FileError> {
        let cert_error = |message: String| FileError::new(0, message);
        let key_error = |message: String| FileError::new(1, message);
        let chain = CertificateDer::pem_slice_iter(&contents[0])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| cert_error(format!("is not valid PEM: {e}")))?;
        if chain.is_empty() {
            return Err(cert_error("holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&contents[1])
            .map_err(|e| key_error(format!("holds no usable key: {e}")))?;
        let key = self
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| key_error(e.to_string()))?;
        let certified = CertifiedKey::new(chain, key);
        certified
            .keys_match()
            .map_err(|e| key_error(format!("does not match the certificate: {e}")))?;
        Ok(Arc::new(certified))
    }

    fn installed(&self, paths: &[PathBuf], _key: &Arc<CertifiedKey>, first: bool) {
        if !first {
            tracing::info!(cert_file = %paths[0].display(), "serving certificate reloaded");
        }
    }

    // Half-written during a rotation, perhaps: the pair served stays, and
    // the files are read again at the next check.
    fn kept(&self, _paths: &[PathBuf], error: &str) {
        tracing::warn!(%error, "cannot reload the serving certificate");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings;

    fn pem_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert_file = dir.join(format!("{name}.crt"));
        let key_file = dir.join(format!("{name}.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    fn files(cert: &Path, key: &Path) -> CertificateFiles {
        CertificateFiles::pair(
            Some(cert),
            Some(key),
            &settings::API_TLS_CERT_FILE,
            &settings::API_TLS_KEY_FILE,
        )
        .unwrap()
        .unwrap()
    }

    #[tokio::test]
    async fn a_pair_that_does_not_load_keeps_the_one_served() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair(dir.path(), "first");
        let interval = Duration::from_millis(10);
        let reloading = files(&cert, &key).reloading(provider(), interval).unwrap();
        let served = || reloading.0.current();
        let first = served();
        // Half written: the key file holds no key. Ten checks later the
        // first pair is still the one served.
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
        tokio::time::sleep(interval * 10).await;
        assert!(Arc::ptr_eq(&served(), &first));
        // Whole again (a new pair): served from a later check on.
        let (new_cert, new_key) = pem_pair(dir.path(), "second");
        std::fs::copy(&new_cert, &cert).unwrap();
        std::fs::copy(&new_key, &key).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::ptr_eq(&served(), &first) {
            assert!(
                std::time::Instant::now() < deadline,
                "the new pair was never served"
            );
            tokio::time::sleep(interval).await;
        }
        assert_ne!(served().cert, first.cert);
    }

    #[test]
    fn one_file_of_the_pair_names_the_other() {
        let only_cert = CertificateFiles::pair(
            Some(Path::new("c")),
            None,
            &settings::API_TLS_CERT_FILE,
            &settings::API_TLS_KEY_FILE,
        )
        .unwrap_err();
        assert_eq!(only_cert.setting, settings::API_TLS_KEY_FILE.flag);
        let only_key = CertificateFiles::pair(
            None,
            Some(Path::new("k")),
            &settings::API_TLS_CERT_FILE,
            &settings::API_TLS_KEY_FILE,
        )
        .unwrap_err();
        assert_eq!(only_key.setting, settings::API_TLS_CERT_FILE.flag);
    }

    fn refused(files: CertificateFiles) -> SettingError {
        match files.acceptor(&[]) {
            Ok(_) => panic!("{files:?} accepted"),
            Err(error) => error,
        }
    }

    #[tokio::test]
    async fn unusable_files_name_their_setting() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair(dir.path(), "a");
        let (_, other_key) = pem_pair(dir.path(), "b");
        files(&cert, &key).acceptor(&[]).unwrap();
        let missing = dir.path().join("missing.crt");
        let error = refused(files(&missing, &key));
        assert_eq!(error.setting, settings::API_TLS_CERT_FILE.flag);
        assert!(error.message.contains("cannot read"), "{error}");
        // A certificate where the key should be, and a key of another pair.
        let error = refused(files(&cert, &cert));
        assert_eq!(error.setting, settings::API_TLS_KEY_FILE.flag);
        let error = refused(files(&cert, &other_key));
        assert!(error.message.contains("does not match"), "{error}");
        let error = refused(files(&key, &key));
        assert!(error.message.contains("holds no certificate"), "{error}");
    }
}
