//! The sidecar's extended metadata: the attributes apps set with
//! `PUT /v1.0/metadata/{name}` (gRPC `SetMetadata`) and read back under
//! `extended` in the metadata. Kept in memory, per gateway process, as
//! daprd keeps them per sidecar; bounded in count and size, since any
//! caller may set them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::error::DaprError;

/// The most attributes kept; setting one that exists always succeeds.
pub const MAX_ENTRIES: usize = 64;

/// The longest attribute name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// The longest attribute value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The attributes set, by name.
#[derive(Debug, Default)]
pub struct ExtendedMetadata(Mutex<BTreeMap<String, String>>);

impl ExtendedMetadata {
    /// Sets `name` to `value`. An empty name does nothing, as in Dapr.
    pub fn set(&self, name: &str, value: String) -> Result<(), DaprError> {
        if name.is_empty() {
            return Ok(());
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(DaprError::MetadataNameTooLong(MAX_NAME_BYTES));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(DaprError::MetadataValueTooLarge(MAX_VALUE_BYTES));
        }
        let mut entries = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !entries.contains_key(name) && entries.len() >= MAX_ENTRIES {
            return Err(DaprError::MetadataFull(MAX_ENTRIES));
        }
        entries.insert(name.to_owned(), value);
        Ok(())
    }

    /// Every attribute, by name.
    pub fn entries(&self) -> BTreeMap<String, String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_bounded_in_count_and_size_and_replaced_in_place() {
        let metadata = ExtendedMetadata::default();
        metadata.set("", "ignored".into()).unwrap();
        assert!(metadata.entries().is_empty());
        for n in 0..MAX_ENTRIES {
            metadata.set(&format!("k{n}"), "v".into()).unwrap();
        }
        assert!(matches!(
            metadata.set("one-more", "v".into()),
            Err(DaprError::MetadataFull(MAX_ENTRIES))
        ));
        metadata.set("k0", "replaced".into()).unwrap();
        assert_eq!(metadata.entries()["k0"], "replaced");
        assert!(matches!(
            metadata.set(&"n".repeat(MAX_NAME_BYTES + 1), String::new()),
            Err(DaprError::MetadataNameTooLong(_))
        ));
        assert!(matches!(
            metadata.set("k1", "v".repeat(MAX_VALUE_BYTES + 1)),
            Err(DaprError::MetadataValueTooLarge(_))
        ));
        assert_eq!(metadata.entries().len(), MAX_ENTRIES);
    }
}
