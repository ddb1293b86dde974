//! Errors of the protocol layer: the store's `-ERR` strings and codec failures.

use thiserror::Error;

/// An error string the state store sends as `-ERR <message>`.
///
/// The twelve documented strings get a variant each; anything else is kept
/// verbatim in [`StoreError::Unknown`] because the service may add strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreError {
    /// The request's `__ts` is more than a minute ahead of the store's clock.
    TimestampSkew,
    /// The key carries a fencing token and the request has none.
    FencingTokenRequired,
    /// The request's `__ft` is more than a minute ahead of the store's clock.
    FencingTokenSkew,
    /// The request's `__ft` is older than the key's fencing token.
    FencingTokenLowerVersion,
    /// The store is full.
    QuotaExceeded,
    /// The payload is not a well-formed request.
    SyntaxError,
    /// The client may not read or write this key.
    NotAuthorized,
    /// The verb is not one the store knows.
    UnknownCommand,
    /// The verb got too many or too few arguments.
    WrongNumberOfArguments,
    /// A SET came without `__ts`.
    MissingTimestamp,
    /// `__ts` or `__ft` is not a valid HLC.
    MalformedTimestamp,
    /// The key is empty.
    KeyLengthZero,
    /// A string this version does not know.
    Unknown(String),
}

impl StoreError {
    /// Every documented error, for tests and exhaustive tables.
    pub const KNOWN: [StoreError; 12] = [
        StoreError::TimestampSkew,
        StoreError::FencingTokenRequired,
        StoreError::FencingTokenSkew,
        StoreError::FencingTokenLowerVersion,
        StoreError::QuotaExceeded,
        StoreError::SyntaxError,
        StoreError::NotAuthorized,
        StoreError::UnknownCommand,
        StoreError::WrongNumberOfArguments,
        StoreError::MissingTimestamp,
        StoreError::MalformedTimestamp,
        StoreError::KeyLengthZero,
    ];

    /// The exact text the real service sends.
    pub fn message(&self) -> &str {
        match self {
            Self::TimestampSkew => {
                "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            Self::FencingTokenRequired => "a fencing token is required for this request",
            Self::FencingTokenSkew => {
                "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            Self::FencingTokenLowerVersion => {
                "the request fencing token is a lower version than the fencing token protecting the resource"
            }
            Self::QuotaExceeded => "the quota has been exceeded",
            Self::SyntaxError => "syntax error",
            Self::NotAuthorized => "not authorized",
            Self::UnknownCommand => "unknown command",
            Self::WrongNumberOfArguments => "wrong number of arguments",
            Self::MissingTimestamp => "missing timestamp",
            Self::MalformedTimestamp => "malformed timestamp",
            Self::KeyLengthZero => "the key length is zero",
            Self::Unknown(message) => message,
        }
    }

    /// Classifies an error text; the published document's misspelling
    /// ("a lower version that the ...") maps to the same variant.
    pub fn from_message(message: &str) -> Self {
        const MISSPELLED_LOWER_VERSION: &str = "the request fencing token is a lower version that the fencing token protecting the resource";
        if message == MISSPELLED_LOWER_VERSION {
            return Self::FencingTokenLowerVersion;
        }
        Self::KNOWN
            .into_iter()
            .find(|known| known.message() == message)
            .unwrap_or_else(|| Self::Unknown(message.to_owned()))
    }

    /// A short stable name, used as a metric label and in problem types.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::TimestampSkew => "timestamp_skew",
            Self::FencingTokenRequired => "fencing_token_required",
            Self::FencingTokenSkew => "fencing_token_skew",
            Self::FencingTokenLowerVersion => "fencing_token_lower_version",
            Self::QuotaExceeded => "quota_exceeded",
            Self::SyntaxError => "syntax_error",
            Self::NotAuthorized => "not_authorized",
            Self::UnknownCommand => "unknown_command",
            Self::WrongNumberOfArguments => "wrong_number_of_arguments",
            Self::MissingTimestamp => "missing_timestamp",
            Self::MalformedTimestamp => "malformed_timestamp",
            Self::KeyLengthZero => "key_length_zero",
            Self::Unknown(_) => "unknown",
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for StoreError {}

/// Why a payload could not be decoded.
///
/// MQTT delivers whole messages, so [`DecodeError::Incomplete`] means the
/// payload was cut short; it is cheap because it is routine for fuzzed input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The payload ended inside a frame.
    #[error("payload ends before the frame does")]
    Incomplete,
    /// A frame began with a byte that starts no frame type this protocol uses.
    #[error("unexpected frame type byte 0x{0:02x}")]
    UnexpectedType(u8),
    /// A length or integer field is not a decimal number in range.
    #[error("invalid number in a length or integer field")]
    InvalidNumber,
    /// A declared length exceeds the bytes that arrived.
    #[error("declared length {declared} exceeds the {available} bytes that arrived")]
    LengthExceedsPayload {
        /// What the frame declared.
        declared: usize,
        /// What was left in the payload.
        available: usize,
    },
    /// A bulk string was not followed by CRLF.
    #[error("bulk string is not terminated by CRLF")]
    MissingTerminator,
    /// Bytes remain after the frame.
    #[error("{0} unexpected bytes after the frame")]
    TrailingBytes(usize),
    /// The frame is well formed but not a shape this message can take.
    #[error("unexpected frame shape: {0}")]
    UnexpectedShape(&'static str),
    /// An error reply whose text is not UTF-8.
    #[error("error text is not UTF-8")]
    NotUtf8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_message_round_trips() {
        for error in StoreError::KNOWN {
            assert_eq!(StoreError::from_message(error.message()), error);
        }
    }

    #[test]
    fn documents_misspelling_is_accepted() {
        assert_eq!(
            StoreError::from_message(
                "the request fencing token is a lower version that the fencing token protecting the resource"
            ),
            StoreError::FencingTokenLowerVersion
        );
    }

    #[test]
    fn unknown_message_is_kept() {
        assert_eq!(
            StoreError::from_message("a brand new failure"),
            StoreError::Unknown("a brand new failure".into())
        );
    }
}
