//! Secret files (tokens, passwords), read by one rule: a token's trailing
//! line breaks are dropped (editors and `kubectl create secret --from-file`
//! leave one) and an empty token is refused. The named exception is what
//! the gateway and the emulator send to the MQTT broker (the password and
//! the service-account token): byte for byte, as the AIO SDK sends them,
//! so a trailing newline there is part of the credential.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// A secret file that cannot be used.
#[derive(Debug, Error)]
pub enum SecretFileError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds nothing usable (nothing, or only line breaks).
    #[error("{} holds an empty token", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// A token file's token: trailing `\n` and `\r` dropped, empty refused.
pub fn read_token(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    let mut token = read(path)?;
    while token
        .last()
        .is_some_and(|byte| matches!(byte, b'\n' | b'\r'))
    {
        token.pop();
    }
    if token.is_empty() {
        return Err(SecretFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(token)
}

/// An MQTT credential file (password, service-account token), byte for
/// byte as the AIO SDK sends it: the exception to [`read_token`]'s rule.
pub fn read_mqtt_credential(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    read(path)
}

fn read(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    std::fs::read(path).map_err(|source| SecretFileError::Read {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_drops_its_trailing_line_breaks_and_a_credential_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cret \r\n\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), b"s3cret ");
        assert_eq!(read_mqtt_credential(&path).unwrap(), b"s3cret \r\n\n");

        std::fs::write(&path, "\r\n").unwrap();
        let error = read_token(&path).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{} holds an empty token", path.display())
        );
        let missing = dir.path().join("missing");
        assert!(
            read_token(&missing)
                .unwrap_err()
                .to_string()
                .starts_with(&format!("cannot read {}: ", missing.display()))
        );
    }
}
