//! A JWKS as the verifier uses it: each usable public key with the
//! algorithms it may verify. Symmetric (`oct`) keys, encryption keys and
//! key types or curves the crate does not verify are left out, so no
//! token can ever be checked against them.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::error::JwksError;

/// Every algorithm a token may be signed with: asymmetric ones only, the
/// RSA ones first.
pub(super) const ACCEPTED: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// The RSA signature algorithms (PKCS #1 v1.5 and PSS): the first six
/// accepted.
const RSA: &[Algorithm] = ACCEPTED.split_at(6).0;

/// One public key of the set.
pub(super) struct Key {
    kid: Option<String>,
    /// Ready to verify with.
    pub(super) decoding: DecodingKey,
    /// The checks with this key: the algorithms it may verify (the JWK's
    /// `alg` if it names one, else every algorithm of its key type and
    /// curve; the crate wants one family per check).
    pub(super) validation: Validation,
}

/// The usable keys of one JWKS document.
pub(super) struct KeySet {
    keys: Vec<Key>,
    /// Which installed set this is: cached tokens verified with an older
    /// one are dropped.
    pub(super) generation: u64,
    /// The document's digest, to tell a changed document from the same one.
    pub(super) fingerprint: [u8; 32],
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field(
                "kids",
                &self.keys.iter().map(|key| &key.kid).collect::<Vec<_>>(),
            )
            .field("generation", &self.generation)
            .finish()
    }
}

#[derive(Deserialize)]
struct Document {
    keys: Vec<serde_json::Value>,
}

impl KeySet {
    /// No keys (a JWKS URL not fetched yet): every token's key is unknown.
    pub(super) fn empty() -> Self {
        Self {
            keys: Vec::new(),
            generation: 0,
            fingerprint: [0; 32],
        }
    }

    /// The usable keys of a JWKS document, each checking tokens as
    /// `validation` says with its own algorithms; the keys left out are
    /// logged. A document that is not a JWKS, or has no usable key, is an
    /// error.
    pub(super) fn parse(
        document: &[u8],
        generation: u64,
        validation: &Validation,
    ) -> Result<Self, JwksError> {
        let parsed: Document = serde_json::from_slice(document)
            .map_err(|error| JwksError::Invalid(format!("not a JWKS document: {error}")))?;
        let mut keys = Vec::with_capacity(parsed.keys.len());
        for (index, value) in parsed.keys.into_iter().enumerate() {
            match serde_json::from_value::<Jwk>(value)
                .map_err(|error| error.to_string())
                .and_then(|jwk| usable(&jwk, validation))
            {
                Ok(key) => keys.push(key),
                Err(why) => tracing::info!(index, why, "JWKS key left out"),
            }
        }
        if keys.is_empty() {
            return Err(JwksError::Invalid(
                "no usable public key (RSA, EC P-256/P-384 or Ed25519, for signatures)".into(),
            ));
        }
        Ok(Self {
            keys,
            generation,
            fingerprint: Sha256::digest(document).into(),
        })
    }

    /// The key a token's `kid` names; without a `kid`, the set's only key.
    pub(super) fn find(&self, kid: Option<&str>) -> Option<&Key> {
        match kid {
            Some(kid) => self.keys.iter().find(|key| key.kid.as_deref() == Some(kid)),
            None => match self.keys.as_slice() {
                [only] => Some(only),
                _ => None,
            },
        }
    }

    /// How many keys it holds.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// The key a JWK makes, or why it is left out.
fn usable(jwk: &Jwk, validation: &Validation) -> Result<Key, String> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Err("an encryption key (use: enc)".into());
    }
    let by_type: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => RSA.to_vec(),
        AlgorithmParameters::EllipticCurve(params) => match params.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Err(format!("curve {:?} is not supported", params.curve)),
        },
        AlgorithmParameters::OctetKeyPair(params) => match params.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return Err(format!("curve {:?} is not supported", params.curve)),
        },
        AlgorithmParameters::OctetKey(_) => {
            return Err("a symmetric key: only asymmetric signatures are accepted".into());
        }
        _ => return Err("an unsupported key type".into()),
    };
    let algorithms = match jwk.common.key_algorithm {
        None => by_type,
        Some(named) => {
            let algorithm = algorithm_of(named)
                .filter(|algorithm| by_type.contains(algorithm))
                .ok_or_else(|| format!("alg {named} does not fit its key type"))?;
            vec![algorithm]
        }
    };
    let decoding = DecodingKey::from_jwk(jwk).map_err(|error| error.to_string())?;
    let mut validation = validation.clone();
    validation.algorithms = algorithms;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        decoding,
        validation,
    })
}

fn algorithm_of(named: KeyAlgorithm) -> Option<Algorithm> {
    Algorithm::try_from(named)
        .ok()
        .filter(|algorithm| ACCEPTED.contains(algorithm))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw";

    fn rsa(kid: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut key = serde_json::json!({"kty": "RSA", "kid": kid, "n": RSA_N, "e": "AQAB"});
        if let (Some(key), serde_json::Value::Object(extra)) = (key.as_object_mut(), extra) {
            key.extend(extra);
        }
        key
    }

    fn set(keys: &[serde_json::Value]) -> Result<KeySet, JwksError> {
        let document = serde_json::to_vec(&serde_json::json!({ "keys": keys })).unwrap();
        KeySet::parse(&document, 1, &Validation::default())
    }

    fn algorithms(keys: &KeySet, kid: &str) -> Vec<Algorithm> {
        keys.find(Some(kid)).unwrap().validation.algorithms.clone()
    }

    #[test]
    fn the_rsa_algorithms_are_the_rs_and_ps_ones() {
        let names: Vec<String> = RSA.iter().map(|alg| format!("{alg:?}")).collect();
        assert_eq!(
            names,
            ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]
        );
    }

    #[test]
    fn symmetric_encryption_and_unknown_keys_are_left_out() {
        let keys = set(&[
            rsa("sig", serde_json::json!({})),
            serde_json::json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}),
            rsa("enc", serde_json::json!({"use": "enc"})),
            serde_json::json!({"kty": "XYZ", "kid": "odd"}),
            rsa("confused", serde_json::json!({"alg": "HS256"})),
            serde_json::json!({"kty": "EC", "kid": "broken"}),
        ])
        .unwrap();
        assert_eq!(keys.len(), 1);
        assert!(keys.find(Some("sig")).is_some());
        for kid in ["hmac", "enc", "odd", "confused", "broken"] {
            assert!(keys.find(Some(kid)).is_none(), "{kid}");
        }
        // Without a kid: the only key.
        assert!(keys.find(None).is_some());
    }

    #[test]
    fn an_alg_on_the_key_limits_it_to_that_algorithm() {
        let keys = set(&[rsa("ps", serde_json::json!({"alg": "PS256"}))]).unwrap();
        assert_eq!(algorithms(&keys, "ps"), [Algorithm::PS256]);
        let keys = set(&[rsa("any", serde_json::json!({}))]).unwrap();
        assert_eq!(algorithms(&keys, "any"), RSA);
    }

    #[test]
    fn a_document_without_usable_keys_is_refused() {
        assert!(set(&[]).is_err());
        assert!(set(&[serde_json::json!({"kty": "oct", "k": "c2VjcmV0"})]).is_err());
        let validation = Validation::default();
        assert!(KeySet::parse(b"not json", 1, &validation).is_err());
        assert!(KeySet::parse(b"{\"keys\": 3}", 1, &validation).is_err());
    }

    #[test]
    fn without_a_kid_a_set_of_one_has_its_key() {
        let keys = set(&[rsa("only", serde_json::json!({}))]).unwrap();
        assert_eq!(
            keys.find(None).and_then(|key| key.kid.as_deref()),
            Some("only")
        );
    }

    #[test]
    fn without_a_kid_a_set_of_two_has_no_key() {
        let keys = set(&[
            rsa("a", serde_json::json!({})),
            rsa("b", serde_json::json!({})),
        ])
        .unwrap();
        assert!(keys.find(None).is_none());
    }
}
