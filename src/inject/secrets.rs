//! The files the sidecar reads from volumes (tokens, CA bundles, keys), in
//! one table: each row's condition decides at once whether the pod gets
//! the volume, the container its mount, and the settings their paths.

use serde_json::{Map, Value, json};

use super::values::Sidecar;
use crate::settings::{self as env, Setting};

/// Where the gateway's secrets and tokens are mounted.
pub const SECRETS_DIR: &str = "/var/run/secrets/statestore-gateway";

/// One volume of the sidecar and the files the gateway reads from it.
#[derive(Debug)]
pub struct SecretVolume {
    /// The volume's name, which its mount uses too.
    pub volume: &'static str,
    /// The directory under [`SECRETS_DIR`] it is mounted at.
    pub dir: &'static str,
    /// Each file in it, and the setting given its path.
    pub files: &'static [(&'static str, &'static Setting)],
    /// Whether the sidecar has it.
    pub mounted: fn(&Sidecar) -> bool,
    /// The volume's source (`configMap`, `secret`, `projected`); the
    /// second argument is the first of `files`.
    pub source: fn(&Sidecar, &str) -> Value,
}

/// Every volume the sidecar may have, in the order of the chart's
/// `statestore-gateway.sidecar.volumes` and of the container's mounts.
pub const SECRET_VOLUMES: &[SecretVolume] = &[
    SecretVolume {
        volume: "statestore-gateway-sat",
        dir: "sat",
        files: &[("token", &env::SAT_FILE)],
        mounted: |s| s.broker.sat.enabled,
        source: |s, file| {
            let sat = &s.broker.sat;
            service_account_token(Some(&sat.audience), sat.expiration_seconds, file)
        },
    },
    SecretVolume {
        volume: "statestore-gateway-ca",
        dir: "ca",
        files: &[("ca.crt", &env::TLS_CA_FILE)],
        mounted: |s| s.broker.tls.enabled,
        source: |s, file| config_map(&s.broker.tls.ca_config_map, &s.broker.tls.ca_key, file),
    },
    SecretVolume {
        volume: "statestore-gateway-client-cert",
        dir: "client-cert",
        files: &[
            ("tls.crt", &env::TLS_CERT_FILE),
            ("tls.key", &env::TLS_KEY_FILE),
        ],
        mounted: |s| s.broker.tls.enabled && !s.broker.tls.client_cert_secret.is_empty(),
        source: |s, _| json!({"secret": {"secretName": s.broker.tls.client_cert_secret}}),
    },
    SecretVolume {
        volume: "statestore-gateway-mqtt-password",
        dir: "mqtt-password",
        files: &[("password", &env::MQTT_PASSWORD_FILE)],
        mounted: |s| !s.broker.password_secret.name.is_empty(),
        source: |s, file| {
            secret(
                &s.broker.password_secret.name,
                &s.broker.password_secret.key,
                file,
            )
        },
    },
    SecretVolume {
        volume: "statestore-gateway-api-token",
        dir: "api-token",
        files: &[("token", &env::API_TOKEN_FILE)],
        mounted: |s| !s.gateway.api_token.name.is_empty(),
        source: |s, file| secret(&s.gateway.api_token.name, &s.gateway.api_token.key, file),
    },
    SecretVolume {
        volume: "statestore-gateway-jwks",
        dir: "jwks",
        files: &[("jwks.json", &env::JWT_JWKS_FILE)],
        mounted: |s| !s.gateway.jwt.jwks_config_map.is_empty(),
        source: |s, file| {
            config_map(
                &s.gateway.jwt.jwks_config_map,
                &s.gateway.jwt.jwks_key,
                file,
            )
        },
    },
    // The CA bundle and the token are for fetching a JWKS URL: without
    // one the gateway has no use for them.
    SecretVolume {
        volume: "statestore-gateway-jwks-ca",
        dir: "jwks-ca",
        files: &[("ca.crt", &env::JWT_JWKS_CA_FILE)],
        mounted: |s| {
            let jwt = &s.gateway.jwt;
            !jwt.jwks_url.is_empty() && !jwt.jwks_ca_config_map.is_empty()
        },
        source: |s, file| config_map(&s.gateway.jwt.jwks_ca_config_map, "ca.crt", file),
    },
    SecretVolume {
        volume: "statestore-gateway-jwks-token",
        dir: "jwks-token",
        files: &[("token", &env::JWT_JWKS_TOKEN_FILE)],
        mounted: |s| {
            let jwt = &s.gateway.jwt;
            !jwt.jwks_url.is_empty() && jwt.jwks_service_account_token
        },
        source: |_, file| service_account_token(None, 3600, file),
    },
];

fn config_map(name: &str, key: &str, file: &str) -> Value {
    json!({"configMap": {"name": name, "items": [{"key": key, "path": file}]}})
}

fn secret(name: &str, key: &str, file: &str) -> Value {
    json!({"secret": {"secretName": name, "items": [{"key": key, "path": file}]}})
}

fn service_account_token(audience: Option<&str>, expiration_seconds: u64, file: &str) -> Value {
    let mut token = Map::new();
    if let Some(audience) = audience {
        token.insert("audience".into(), audience.into());
    }
    token.insert("expirationSeconds".into(), expiration_seconds.into());
    token.insert("path".into(), file.into());
    json!({"projected": {"sources": [{"serviceAccountToken": token}]}})
}

/// Whether `name` is one of the sidecar's volumes.
pub fn is_sidecar_volume(name: &str) -> bool {
    SECRET_VOLUMES.iter().any(|volume| volume.volume == name)
}

fn mounted(sidecar: &Sidecar) -> impl Iterator<Item = &'static SecretVolume> + '_ {
    SECRET_VOLUMES
        .iter()
        .filter(move |volume| (volume.mounted)(sidecar))
}

/// The container's `volumeMounts`.
pub fn mounts(sidecar: &Sidecar) -> Vec<Value> {
    mounted(sidecar)
        .map(|volume| {
            json!({
                "name": volume.volume,
                "mountPath": format!("{SECRETS_DIR}/{}", volume.dir),
                "readOnly": true,
            })
        })
        .collect()
}

/// The pod's `volumes` the sidecar adds.
pub fn volumes(sidecar: &Sidecar) -> Vec<Value> {
    mounted(sidecar)
        .map(|volume| {
            let first = volume.files.first().map_or("", |(file, _)| *file);
            let mut item = Map::new();
            item.insert("name".into(), volume.volume.into());
            if let Value::Object(source) = (volume.source)(sidecar, first) {
                item.extend(source);
            }
            Value::Object(item)
        })
        .collect()
}

/// The path `setting` is given: its file, when the sidecar has its volume.
pub fn path(setting: &Setting, sidecar: &Sidecar) -> Option<String> {
    mounted(sidecar).find_map(|volume| {
        volume
            .files
            .iter()
            .find(|(_, row)| *row == setting)
            .map(|(file, _)| format!("{SECRETS_DIR}/{}/{file}", volume.dir))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::values::container_env;

    fn sidecar(sets: &[&str]) -> Sidecar {
        Sidecar::with_sets(sets)
    }

    /// For any values, a volume, its mount and its files' variables come
    /// and go together.
    #[test]
    fn each_volume_its_mount_and_its_variables_come_together() {
        for sets in [
            &[][..],
            &["broker.sat.enabled=false", "broker.tls.enabled=false"][..],
            &[
                "broker.tls.clientCertSecret=cc",
                "broker.sat.enabled=false",
                "broker.passwordSecret.name=pw",
                "gateway.apiToken.secretName=t",
            ][..],
            &[
                "gateway.jwt.jwksConfigMap=keys",
                "gateway.jwt.jwksCaConfigMap=ca",
                "gateway.jwt.jwksServiceAccountToken=true",
                "gateway.jwt.issuer=i",
                "gateway.jwt.audience=a",
            ][..],
            &[
                "gateway.jwt.jwksUrl=https://issuer/jwks",
                "gateway.jwt.jwksCaConfigMap=ca",
                "gateway.jwt.jwksServiceAccountToken=true",
                "gateway.jwt.issuer=i",
                "gateway.jwt.audience=a",
            ][..],
        ] {
            let sidecar = sidecar(sets);
            let names = |list: Vec<Value>| -> Vec<String> {
                list.iter().map(|item| item["name"].to_string()).collect()
            };
            let volumes = names(volumes(&sidecar));
            assert_eq!(volumes, names(mounts(&sidecar)), "{sets:?}");
            let env = container_env(&sidecar);
            for volume in SECRET_VOLUMES {
                let has = volumes.contains(&format!("{:?}", volume.volume));
                for (file, row) in volume.files {
                    let var = env.iter().find(|var| var["name"] == row.env);
                    let want = format!("{SECRETS_DIR}/{}/{file}", volume.dir);
                    match var {
                        Some(var) => assert!(has && var["value"] == want, "{sets:?} {var}"),
                        None => assert!(!has, "{sets:?}: {} has no {}", volume.volume, row.env),
                    }
                }
            }
        }
    }

    #[test]
    fn a_jwks_urls_ca_and_token_are_mounted_only_with_the_url() {
        let without = sidecar(&[
            "gateway.jwt.jwksConfigMap=keys",
            "gateway.jwt.jwksCaConfigMap=ca",
            "gateway.jwt.jwksServiceAccountToken=true",
            "gateway.jwt.issuer=i",
            "gateway.jwt.audience=a",
        ]);
        let names: Vec<Value> = volumes(&without)
            .iter()
            .map(|v| v["name"].clone())
            .collect();
        assert_eq!(
            names,
            [
                "statestore-gateway-sat",
                "statestore-gateway-ca",
                "statestore-gateway-jwks"
            ]
        );
    }

    #[test]
    fn every_file_setting_is_a_row_of_the_settings_table_once() {
        let mut seen = Vec::new();
        for volume in SECRET_VOLUMES {
            assert!(volume.volume.ends_with(volume.dir), "{}", volume.volume);
            for (_, row) in volume.files {
                assert!(crate::settings::SERVE.contains(row), "{}", row.env);
                assert!(!seen.contains(&row.env), "{} twice", row.env);
                seen.push(row.env);
            }
        }
    }
}
