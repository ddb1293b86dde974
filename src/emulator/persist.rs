//! Durability for keys SET with `aio-persistence: true`: an append-only log
//! in the data directory, replayed at start-up.
//!
//! Each record is `[len u32 LE][crc32 u32 LE][body]`. A crash can leave the
//! last records half written; replay cuts off a tail that no valid record
//! follows (a tail of zeros, which a file system may leave after a crash,
//! counts as torn). That loses nothing acknowledged, because the emulator
//! only replies once a record is written and `fsync`ed. Bytes that fail
//! their checksum *before* a valid record are damage, not a crash: replay
//! skips them and keeps every later record, keeps a copy of the damaged
//! file beside the log (`statestore.log.damaged-<unix ms>`), logs an error
//! and rewrites the log without them. After replay, and whenever
//! the appended records outgrow both 64 MiB and the last rewrite, the log is
//! rewritten to the live keys alone (write, fsync, rename), so its size stays
//! within a small multiple of the data.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;

use super::entry::Entry;
use crate::protocol::Hlc;

/// The log's file name in the data directory.
pub const LOG_FILE: &str = "statestore.log";
/// Held locked while an emulator uses the directory.
const LOCK_FILE: &str = "statestore.lock";
/// The store's id in decimal: SCAN tokens issued before a restart stay valid.
pub const ID_FILE: &str = "statestore.id";
/// The first bytes of a log: a format name and version.
const MAGIC: &[u8; 8] = b"SSEAOF01";
/// No record is larger (values are bounded by the MQTT packet size).
const MAX_RECORD: usize = 1 << 30;
/// Appended bytes that never by themselves trigger a rewrite.
const COMPACT_AFTER: u64 = 64 << 20;

/// Why the log could not be used.
#[derive(Debug, Error)]
pub enum PersistError {
    /// Reading, writing or syncing failed.
    #[error("persistence log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Another emulator uses the directory.
    #[error("data directory {0} is in use by another emulator")]
    Locked(PathBuf),
    /// The file is not a log of this format.
    #[error("{0} is not a statestore emulator log")]
    NotALog(PathBuf),
    /// A record passed its checksum but does not decode: a bug, not a crash.
    #[error("persistence log {path}: undecodable record at byte {offset}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: usize,
    },
}

/// A change to a persisted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The key now holds this entry.
    Set {
        /// The key.
        key: Bytes,
        /// Value, version, token and expiry.
        entry: Entry,
    },
    /// The key is gone (deleted, expired, or no longer persisted).
    Delete {
        /// The key.
        key: Bytes,
    },
}

impl Record {
    /// Appends the framed record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 8]);
        match self {
            Self::Set { key, entry } => {
                out.push(1);
                put_bytes(out, key);
                put_bytes(out, &entry.value);
                put_hlc(out, &entry.version);
                match entry.expires_at_ms {
                    Some(at) => {
                        out.push(1);
                        out.extend_from_slice(&at.to_le_bytes());
                    }
                    None => out.push(0),
                }
                match &entry.fencing_token {
                    Some(token) => {
                        out.push(1);
                        put_hlc(out, token);
                    }
                    None => out.push(0),
                }
            }
            Self::Delete { key } => {
                out.push(2);
                put_bytes(out, key);
            }
        }
        let body = &out[start + 8..];
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let crc = crc32(body);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn decode(body: &[u8]) -> Option<Record> {
        let mut reader = Reader(body);
        let record = match reader.u8()? {
            1 => {
                let key = reader.bytes()?;
                let value = reader.bytes()?;
                let version = reader.hlc()?;
                let expires_at_ms = match reader.u8()? {
                    0 => None,
                    1 => Some(reader.u64()?),
                    _ => return None,
                };
                let fencing_token = match reader.u8()? {
                    0 => None,
                    1 => Some(reader.hlc()?),
                    _ => return None,
                };
                Record::Set {
                    key,
                    entry: Entry {
                        value,
                        version,
                        fencing_token,
                        expires_at_ms,
                        persistent: true,
                    },
                }
            }
            2 => Record::Delete {
                key: reader.bytes()?,
            },
            _ => return None,
        };
        reader.0.is_empty().then_some(record)
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_hlc(out: &mut Vec<u8>, hlc: &Hlc) {
    out.extend_from_slice(&hlc.wall_ms.to_le_bytes());
    out.extend_from_slice(&hlc.counter.to_le_bytes());
    put_bytes(out, hlc.node.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }

    fn bytes(&mut self) -> Option<Bytes> {
        let len = usize::try_from(self.u32()?).ok()?;
        self.take(len).map(Bytes::copy_from_slice)
    }

    fn hlc(&mut self) -> Option<Hlc> {
        let wall_ms = self.u64()?;
        let counter = self.u64()?;
        let node = std::str::from_utf8(&self.bytes()?).ok()?.into();
        Some(Hlc {
            wall_ms,
            counter,
            node,
        })
    }
}

/// What replaying a log image found.
#[derive(Debug)]
struct Parsed {
    /// The valid records, in order.
    records: Vec<Record>,
    /// Byte ranges that hold no valid record but that valid records follow.
    damaged: Vec<std::ops::Range<usize>>,
    /// Where the last valid record ends: what follows is a torn tail.
    end: usize,
}

/// The records of a log image, the damaged ranges between them, and where
/// a torn tail starts.
fn parse(image: &[u8], path: &Path) -> Result<Parsed, PersistError> {
    let mut parsed = Parsed {
        records: Vec::new(),
        damaged: Vec::new(),
        end: MAGIC.len(),
    };
    let mut pos = MAGIC.len();
    while pos < image.len() {
        match record_at(image, pos) {
            Some(Ok((record, next))) => {
                parsed.records.push(record);
                pos = next;
                parsed.end = next;
            }
            Some(Err(())) => {
                return Err(PersistError::Corrupt {
                    path: path.to_owned(),
                    offset: pos,
                });
            }
            // Damage if a valid record follows; otherwise a torn tail.
            None => match next_record(image, pos) {
                Some(next) => {
                    parsed.damaged.push(pos..next);
                    pos = next;
                }
                None => break,
            },
        }
    }
    Ok(parsed)
}

/// The record starting at `pos` and where the next one starts; `None`
/// when there is no whole record with a matching checksum there, `Err`
/// when one passes its checksum but does not decode (a bug, not damage).
fn record_at(image: &[u8], pos: usize) -> Option<Result<(Record, usize), ()>> {
    let rest = image.get(pos..)?;
    let header = rest.get(..8)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    // Every record has a tag byte, so length 0 (with the CRC-32 of
    // nothing, which is 0) is zero-filled space, not a record.
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let body = rest.get(8..8 + len)?;
    // The tag first: scanning damaged bytes checksums few candidates.
    if !matches!(body[0], 1 | 2) || crc32(body) != crc {
        return None;
    }
    Some(
        Record::decode(body)
            .map(|record| (record, pos + 8 + len))
            .ok_or(()),
    )
}

/// Where the first valid record after the invalid bytes at `pos` starts:
/// where the damaged record's own length says the next one is (a flipped
/// bit in its body), else the first offset where one decodes (a damaged
/// length, a lost sector). `None`: nothing valid follows.
fn next_record(image: &[u8], pos: usize) -> Option<usize> {
    let is_record = |at: usize| matches!(record_at(image, at), Some(Ok(_)));
    let declared = image
        .get(pos..pos + 4)
        .map(|len| u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize)
        .and_then(|len| pos.checked_add(8 + len))
        .filter(|&next| next < image.len() && is_record(next));
    declared.or_else(|| (pos + 1..image.len()).find(|&at| is_record(at)))
}

/// The open log of a data directory.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    path: PathBuf,
    file: Arc<File>,
    _lock: File,
    /// Bytes appended since the last rewrite.
    appended: u64,
    /// Size of the last rewrite (or of the log found at start).
    rewritten: u64,
    compact_after: u64,
}

impl Log {
    /// Opens (or creates) the log in `dir` and returns the records to
    /// replay; a torn tail is cut off with a warning.
    pub fn open(dir: &Path) -> Result<(Log, Vec<Record>), PersistError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| PersistError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(PersistError::Locked(dir.to_owned()));
        }
        let path = dir.join(LOG_FILE);
        let mut image = Vec::new();
        match File::open(&path) {
            Ok(mut file) => {
                file.read_to_end(&mut image).map_err(io(&path))?;
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io(&path)(error)),
        }
        // A crash while the file was created leaves a short header: start over.
        if image.len() < MAGIC.len() && MAGIC.starts_with(&image) {
            let log = Log {
                dir: dir.to_owned(),
                file: Arc::new(create(&path, dir, &[])?),
                path,
                _lock: lock,
                appended: 0,
                rewritten: 0,
                compact_after: COMPACT_AFTER,
            };
            return Ok((log, Vec::new()));
        }
        if !image.starts_with(MAGIC) {
            return Err(PersistError::NotALog(path));
        }
        let Parsed {
            records,
            damaged,
            end,
        } = parse(&image, &path)?;
        let torn = image.len() - end;
        if torn > 0 {
            tracing::warn!(
                path = %path.display(),
                torn_bytes = torn,
                "persistence log ends in an incomplete record (a crash during a write); \
                 it was never acknowledged and is dropped"
            );
        }
        let (file, size) = if damaged.is_empty() {
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            if torn > 0 {
                // Cut it off so that appends follow the last whole record.
                file.set_len(end as u64)
                    .and_then(|()| file.sync_all())
                    .map_err(io(&path))?;
            }
            (file, end as u64)
        } else {
            let copy = keep_damaged_copy(dir, &image)?;
            let lost: usize = damaged.iter().map(|range| range.len()).sum();
            let ranges: Vec<String> = damaged
                .iter()
                .map(|range| format!("{}..{}", range.start, range.end))
                .collect();
            tracing::error!(
                path = %path.display(),
                copy = %copy.display(),
                damaged_bytes = lost,
                ranges = %ranges.join(", "),
                kept_records = records.len(),
                "persistence log is damaged (checksum failures before valid records, \
                 not a crash during a write): the damaged records are lost, every other \
                 record is kept, and the damaged file is kept as the copy named here"
            );
            // Appends must not follow the damage: the log is the valid records alone.
            rewrite(dir, &path, &records)?
        };
        let log = Log {
            dir: dir.to_owned(),
            file: Arc::new(file),
            path,
            _lock: lock,
            appended: 0,
            rewritten: size,
            compact_after: COMPACT_AFTER,
        };
        Ok((log, records))
    }

    /// The store id kept in the directory, or `fresh` written there
    /// (atomically) when it has none yet.
    pub fn store_id(&self, fresh: u64) -> Result<u64, PersistError> {
        let path = self.dir.join(ID_FILE);
        let io = |source| PersistError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| {
                io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a decimal store id",
                ))
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let tmp = self.dir.join(format!("{ID_FILE}.tmp"));
                let mut file = File::create(&tmp).map_err(io)?;
                file.write_all(format!("{fresh}\n").as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(io)?;
                std::fs::rename(&tmp, &path).map_err(io)?;
                sync_dir(&self.dir)?;
                Ok(fresh)
            }
            Err(error) => Err(io(error)),
        }
    }

    /// Writes `records` to a fresh file and atomically puts it in place of
    /// the log, which from then on appends to it.
    pub fn compact(&mut self, records: &[Record]) -> Result<(), PersistError> {
        let (file, size) = rewrite(&self.dir, &self.path, records)?;
        self.replaced(file, size);
        Ok(())
    }

    /// Whether the appended records outgrew both [`COMPACT_AFTER`] and the
    /// last rewrite, so that [`Log::compact_async`] is worth its cost.
    pub fn needs_compaction(&self) -> bool {
        self.appended > self.compact_after.max(self.rewritten)
    }

    /// [`Log::compact`] off the async threads.
    pub async fn compact_async(&mut self, records: Vec<Record>) -> Result<(), PersistError> {
        let (dir, path) = (self.dir.clone(), self.path.clone());
        let rewritten = tokio::task::spawn_blocking(move || rewrite(&dir, &path, &records))
            .await
            .map_err(|error| PersistError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(error),
            })?;
        let (file, size) = rewritten?;
        self.replaced(file, size);
        Ok(())
    }

    fn replaced(&mut self, file: File, size: u64) {
        self.file = Arc::new(file);
        self.appended = 0;
        self.rewritten = size;
    }

    /// Appends encoded records and waits until they are on disk (the
    /// blocking write runs off the async threads). One call per batch of
    /// requests is the group commit.
    pub async fn append(&mut self, encoded: Vec<u8>) -> Result<(), PersistError> {
        self.appended += encoded.len() as u64;
        let file = Arc::clone(&self.file);
        let path = self.path.clone();
        let io = move |source| PersistError::Io { path, source };
        let written = tokio::task::spawn_blocking(move || {
            (&*file).write_all(&encoded)?;
            file.sync_data()
        })
        .await
        .map_err(std::io::Error::other);
        written.and_then(|result| result).map_err(io)
    }
}

/// A copy of a damaged log `image` beside the log, synced; returns its path.
fn keep_damaged_copy(dir: &Path, image: &[u8]) -> Result<PathBuf, PersistError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let copy = dir.join(format!("{LOG_FILE}.damaged-{now_ms}"));
    let io = |source| PersistError::Io {
        path: copy.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&copy)
        .map_err(io)?;
    file.write_all(image)
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    sync_dir(dir)?;
    Ok(copy)
}

/// The log's image for `records` written next to it, synced, and renamed
/// over it; returns the new file (open for appends) and its size.
fn rewrite(dir: &Path, path: &Path, records: &[Record]) -> Result<(File, u64), PersistError> {
    let mut image = Vec::new();
    for record in records {
        record.encode(&mut image);
    }
    let tmp = dir.join(format!("{LOG_FILE}.tmp"));
    let file = create(&tmp, dir, &image)?;
    std::fs::rename(&tmp, path).map_err(|source| PersistError::Io {
        path: path.to_owned(),
        source,
    })?;
    sync_dir(dir)?;
    Ok((file, (MAGIC.len() + image.len()) as u64))
}

/// A new file at `path` holding the header and `body`, synced.
fn create(path: &Path, dir: &Path, body: &[u8]) -> Result<File, PersistError> {
    let io = |source| PersistError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    file.write_all(MAGIC).map_err(io)?;
    file.write_all(body).map_err(io)?;
    file.sync_all().map_err(io)?;
    sync_dir(dir)?;
    Ok(file)
}

fn sync_dir(dir: &Path) -> Result<(), PersistError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| PersistError::Io {
            path: dir.to_owned(),
            source,
        })
}

/// CRC-32 (IEEE), enough to tell a torn record from a whole one.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u32;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |crc, &byte| {
        TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, value: &str, token: Option<Hlc>, expires: Option<u64>) -> Record {
        Record::Set {
            key: Bytes::copy_from_slice(key.as_bytes()),
            entry: Entry {
                value: Bytes::copy_from_slice(value.as_bytes()),
                version: Hlc {
                    wall_ms: 1_700_000_000_000,
                    counter: 3,
                    node: "StateStore".into(),
                },
                fencing_token: token,
                expires_at_ms: expires,
                persistent: true,
            },
        }
    }

    fn delete(key: &str) -> Record {
        Record::Delete {
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    #[test]
    fn the_store_id_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path()).unwrap();
        assert_eq!(log.store_id(42).unwrap(), 42);
        assert_eq!(log.store_id(7).unwrap(), 42, "kept, not replaced");
        drop(log);
        let (log, _) = Log::open(dir.path()).unwrap();
        assert_eq!(log.store_id(7).unwrap(), 42, "across a restart");
        std::fs::write(dir.path().join(ID_FILE), "x").unwrap();
        assert!(matches!(log.store_id(7), Err(PersistError::Io { .. })));
    }

    fn sample() -> Vec<Record> {
        vec![
            set("a", "1", None, None),
            set("b", "", Some(Hlc::new(5, "lock")), Some(1_700_000_060_000)),
            delete("a"),
            Record::Set {
                key: Bytes::from_static(&[0, 255, b'\r', b'\n']),
                entry: match set("x", "y", None, None) {
                    Record::Set { entry, .. } => Entry {
                        value: Bytes::from(vec![7u8; 100_000]),
                        ..entry
                    },
                    Record::Delete { .. } => unreachable!(),
                },
            },
        ]
    }

    fn append_blocking(log: &Log, records: &[Record]) {
        let mut encoded = Vec::new();
        for record in records {
            record.encode(&mut encoded);
        }
        (&*log.file).write_all(&encoded).unwrap();
        log.file.sync_data().unwrap();
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn records_round_trip_through_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let (log, replayed) = Log::open(dir.path()).unwrap();
        assert!(replayed.is_empty());
        append_blocking(&log, &sample());
        drop(log);
        let (_log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed, sample());
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path()).unwrap();
        append_blocking(&log, &sample());
        drop(log);
        let path = dir.path().join(LOG_FILE);
        let full = std::fs::read(&path).unwrap();
        let mut last = Vec::new();
        sample()[3].encode(&mut last);
        let last_start = full.len() - last.len();
        // Every cut inside the last record, plus a record whose body is
        // garbage of the right length (a sector that never reached the disk).
        let mut images: Vec<Vec<u8>> = (last_start..full.len())
            .step_by(997)
            .chain([full.len() - 1, last_start + 3])
            .map(|cut| full[..cut].to_vec())
            .collect();
        let mut zeroed = full.clone();
        zeroed[last_start + 20..].fill(0);
        images.push(zeroed);
        for image in images {
            std::fs::write(&path, &image).unwrap();
            let (log, replayed) = Log::open(dir.path()).unwrap();
            assert_eq!(replayed, sample()[..3], "image of {} bytes", image.len());
            // What is appended after the cut is replayed too.
            append_blocking(&log, &[delete("after")]);
            drop(log);
            let (_log, replayed) = Log::open(dir.path()).unwrap();
            assert_eq!(replayed.len(), 4);
            assert_eq!(replayed[3], delete("after"));
        }
    }

    fn damaged_copies(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.to_string_lossy().contains(".damaged-"))
            .collect()
    }

    #[test]
    fn damage_before_valid_records_loses_only_the_damaged_ones_and_keeps_a_copy() {
        let records: Vec<Record> = (0..10)
            .map(|i| set(&format!("k{i}"), &format!("value {i}"), None, None))
            .collect();
        let mut framed = Vec::new();
        let mut starts = Vec::new();
        for record in &records {
            starts.push(MAGIC.len() + framed.len());
            record.encode(&mut framed);
        }
        let whole = [&MAGIC[..], &framed].concat();
        // A bit flipped in a body, in a length, in a checksum; a zeroed
        // stretch over two records; each before valid records.
        let flip = |at: usize| {
            let mut image = whole.clone();
            image[at] ^= 0x10;
            image
        };
        let mut zeroed = whole.clone();
        zeroed[starts[4] + 3..starts[6] + 5].fill(0);
        let cases = [
            (flip(starts[2] + 12), vec![2]),
            (flip(starts[2]), vec![2]),
            (flip(starts[7] + 2), vec![7]),
            (flip(starts[2] + 5), vec![2]),
            (zeroed, vec![4, 5, 6]),
        ];
        for (image, lost) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(LOG_FILE), &image).unwrap();
            let (log, replayed) = Log::open(dir.path()).unwrap();
            let expected: Vec<Record> = (0..10)
                .filter(|i| !lost.contains(i))
                .map(|i| records[i].clone())
                .collect();
            assert_eq!(replayed, expected, "lost {lost:?}");
            let copies = damaged_copies(dir.path());
            assert_eq!(copies.len(), 1);
            assert_eq!(std::fs::read(&copies[0]).unwrap(), image);
            // The log now holds the kept records alone; appends follow them.
            append_blocking(&log, &[delete("after")]);
            drop(log);
            let (_log, again) = Log::open(dir.path()).unwrap();
            assert_eq!(again[..expected.len()], expected[..]);
            assert_eq!(again.last(), Some(&delete("after")));
            assert_eq!(damaged_copies(dir.path()).len(), 1, "no new damage");
        }
    }

    #[test]
    fn a_zero_filled_tail_is_cut_off_and_the_records_kept() {
        // A file system can extend a file with zeros before the data of a
        // crashed write reaches the disk; zeros parse as length 0, CRC 0.
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path()).unwrap();
        append_blocking(&log, &sample());
        drop(log);
        let path = dir.path().join(LOG_FILE);
        let mut image = std::fs::read(&path).unwrap();
        let whole = image.len() as u64;
        image.extend_from_slice(&[0; 4096]);
        std::fs::write(&path, &image).unwrap();
        let (log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed, sample());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        append_blocking(&log, &[delete("after")]);
        drop(log);
        let (_log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed.last(), Some(&delete("after")));
    }

    #[test]
    fn compact_replaces_the_log_and_appends_follow() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path()).unwrap();
        append_blocking(&log, &sample());
        drop(log);
        let (mut log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed, sample());
        log.compact(&replayed[1..2]).unwrap();
        append_blocking(&log, &[delete("zz")]);
        drop(log);
        let (_log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed, vec![sample()[1].clone(), delete("zz")]);
    }

    #[test]
    fn a_directory_is_used_by_one_emulator_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, _) = Log::open(dir.path()).unwrap();
        assert!(matches!(
            Log::open(dir.path()),
            Err(PersistError::Locked(_))
        ));
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOG_FILE), b"hello world, not a log").unwrap();
        assert!(matches!(
            Log::open(dir.path()),
            Err(PersistError::NotALog(_))
        ));
    }

    #[tokio::test]
    async fn the_log_asks_for_a_rewrite_once_appends_outgrow_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path()).unwrap();
        log.compact_after = 1_000;
        let mut encoded = Vec::new();
        for i in 0..50 {
            set(&format!("k{}", i % 2), "value", None, None).encode(&mut encoded);
        }
        assert!(encoded.len() > 1_000);
        log.append(encoded).await.unwrap();
        assert!(log.needs_compaction());
        log.compact_async(vec![
            set("k0", "value", None, None),
            set("k1", "value", None, None),
        ])
        .await
        .unwrap();
        assert!(!log.needs_compaction());
        let size = std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len();
        assert_eq!(size, log.rewritten);
        drop(log);
        let (_log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed.len(), 2);
    }

    #[tokio::test]
    async fn append_is_durable_when_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path()).unwrap();
        let mut encoded = Vec::new();
        sample()[0].encode(&mut encoded);
        log.append(encoded).await.unwrap();
        drop(log);
        let (_log, replayed) = Log::open(dir.path()).unwrap();
        assert_eq!(replayed, sample()[..1]);
    }
}
