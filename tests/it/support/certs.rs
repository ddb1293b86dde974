//! Test PKI: a CA, a server certificate for `localhost`/127.0.0.1 and a
//! client certificate, written as PEM files.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// PEM files of one test PKI.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The server certificate (SAN localhost, 127.0.0.1).
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl TestPki {
    /// Generates the PKI into `dir`, file names prefixed with `name`.
    pub fn generate(dir: &Path, name: &str) -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = server_params.signed_by(&server_key, &*ca).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(vec!["gateway".to_owned()]).unwrap();
        client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = client_params.signed_by(&client_key, &*ca).unwrap();

        let write = |file: &str, pem: String| {
            let path = dir.join(format!("{name}-{file}"));
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: write("ca.crt", ca.pem()),
            server_cert: write("server.crt", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.crt", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
        }
    }
}
