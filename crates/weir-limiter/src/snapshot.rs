//! Limiter state on disk, so a restart or replacement keeps blocking whom the
//! old process was blocking (incident 2: the new server started from zero
//! because state was written under one path and read under another).
//!
//! One [`Snapshot`] type both writes ([`Snapshot::write_to`]) and reads
//! ([`Snapshot::read_from`]) the file, from the same path argument, and a test
//! round-trips it through a real file. The file is replaced atomically
//! (temporary file in the same directory, fsync, rename, fsync of the
//! directory), so a crash leaves the old snapshot or the new one, never half.
//!
//! Format, version 1: little-endian `u64` words, so every offset is a multiple
//! of 8.
//!
//! ```text
//! magic "WEIRLIMS" | version | generation | written_at (Unix ns, wall clock)
//! | section count
//! | per rule: fingerprint | entry count | (key, remaining ns) x count
//! | checksum of every word before it
//! ```
//!
//! TATs are monotonic-clock times, meaningless to another process, so each is
//! written as `remaining = tat - now` beside the wall-clock time of writing.
//! On restore, the wall-clock time elapsed since then is subtracted, the rest
//! is added to the new process's `now`, and keys with nothing left are skipped
//! (they would decide exactly like absent keys). If the wall clock went
//! backwards, elapsed counts as zero: the restored limits are then stricter
//! than exact, never looser.
//!
//! Sections are keyed by [`RuleFingerprint`], so only rules whose definition is
//! unchanged get state back; the [`RestoreReport`] says per rule how many keys
//! came back, so that a zero is logged and exported instead of silent.
//!
//! This module does not schedule snapshots or choose the path (the runtime
//! does), and it holds the whole snapshot in memory (16 bytes a live key)
//! while writing or reading.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::gcra::{MAX_TOLERANCE, MonoTime};
use super::store::{RuleFingerprint, RuleStores};

const MAGIC: u64 = u64::from_le_bytes(*b"WEIRLIMS");
/// Bump when the layout changes; old files are then refused by name.
pub const VERSION: u64 = 1;

/// A snapshot file that cannot be written or read; always names the file, and
/// for bad contents the byte offset.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: cannot {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    #[error("snapshot {path}: not a weir limiter snapshot (magic {found:#018x} at offset 0)")]
    BadMagic { path: PathBuf, found: u64 },
    #[error(
        "snapshot {path}: version {found} at offset 8 is not supported (this weir reads {VERSION})"
    )]
    UnsupportedVersion { path: PathBuf, found: u64 },
    #[error("snapshot {path}: truncated at offset {offset} while reading {field}")]
    Truncated {
        path: PathBuf,
        offset: u64,
        field: &'static str,
    },
    #[error("snapshot {path}: corrupt at offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// One key's state: `remaining` nanoseconds until its TAT at writing time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub key: u64,
    pub remaining_ns: u64,
}

/// The live keys of one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSection {
    pub fingerprint: RuleFingerprint,
    pub entries: Vec<SnapshotEntry>,
}

/// The limiter state of every rule at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Caller-chosen id (for example a counter or the config generation),
    /// logged on restore so operators can tell which snapshot came back.
    pub generation: u64,
    /// Wall-clock time of capture, to the nanosecond.
    pub written_at: SystemTime,
    pub sections: Vec<RuleSection>,
}

/// What a restore did for one configured rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleRestore {
    pub fingerprint: RuleFingerprint,
    /// False when the file had no section for this rule (new or changed rule).
    pub section_found: bool,
    /// Entries in the file for this rule.
    pub in_file: usize,
    /// Keys put back into the store.
    pub restored: usize,
    /// Entries whose TAT passed while weir was down: nothing to restore.
    pub expired: usize,
}

/// What a restore did, rule by rule. Log it and export it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    pub generation: u64,
    /// Wall-clock time between writing and restoring (zero if the clock went back).
    pub elapsed: Duration,
    /// One line per configured rule, in rule-id order.
    pub rules: Vec<RuleRestore>,
    /// Sections of rules no longer configured (fingerprint, entries dropped).
    pub discarded: Vec<(RuleFingerprint, usize)>,
}

impl RestoreReport {
    pub fn restored(&self) -> usize {
        self.rules.iter().map(|r| r.restored).sum()
    }
}

impl Snapshot {
    /// Captures every rule's live keys at `now` (monotonic) / `wall` (the
    /// same moment on the wall clock).
    pub fn capture(
        generation: u64,
        rules: &RuleStores,
        now: MonoTime,
        wall: SystemTime,
    ) -> Snapshot {
        let sections = rules
            .partitions()
            .iter()
            .map(|p| {
                let mut entries = Vec::with_capacity(p.store.len());
                p.store.for_each_live(now, |key, tat| {
                    let remaining_ns = tat.as_nanos() - now.as_nanos();
                    entries.push(SnapshotEntry { key, remaining_ns });
                });
                RuleSection {
                    fingerprint: p.fingerprint,
                    entries,
                }
            })
            .collect();
        Snapshot {
            generation,
            written_at: wall,
            sections,
        }
    }

    /// Puts the state back into the stores of rules with the same
    /// fingerprint, rebased to `now` (monotonic) / `wall` (wall clock).
    pub fn restore_into(
        &self,
        rules: &RuleStores,
        now: MonoTime,
        wall: SystemTime,
    ) -> RestoreReport {
        let elapsed = wall
            .duration_since(self.written_at)
            .unwrap_or(Duration::ZERO);
        let elapsed_ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let mut report = RestoreReport {
            generation: self.generation,
            elapsed,
            rules: Vec::with_capacity(rules.partitions().len()),
            discarded: Vec::new(),
        };
        for p in rules.partitions() {
            let section = self
                .sections
                .iter()
                .find(|s| s.fingerprint == p.fingerprint);
            let mut line = RuleRestore {
                fingerprint: p.fingerprint,
                section_found: section.is_some(),
                in_file: section.map_or(0, |s| s.entries.len()),
                restored: 0,
                expired: 0,
            };
            for entry in section.map_or(&[][..], |s| &s.entries) {
                let left = entry.remaining_ns.saturating_sub(elapsed_ns);
                let tat = MonoTime::from_nanos(now.as_nanos().saturating_add(left));
                if left > 0 && p.store.restore(entry.key, tat, now) {
                    line.restored += 1;
                } else {
                    line.expired += 1;
                }
            }
            report.rules.push(line);
        }
        for s in &self.sections {
            if rules.by_fingerprint(s.fingerprint).is_none() {
                report.discarded.push((s.fingerprint, s.entries.len()));
            }
        }
        report
    }

    /// Writes the snapshot to `path`, atomically replacing any old one.
    pub fn write_to(&self, path: &Path) -> Result<(), SnapshotError> {
        let tmp = temp_path(path);
        let io_err = |action: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| SnapshotError::Io {
                path: p,
                action,
                source,
            }
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err("create temporary file", &tmp))?;
        let mut out = WordWriter {
            out: BufWriter::with_capacity(1 << 16, file),
            checksum: Checksum::default(),
        };
        self.encode(&mut out).map_err(io_err("write", &tmp))?;
        let sum = out.checksum.0;
        out.out
            .write_all(&sum.to_le_bytes())
            .map_err(io_err("write", &tmp))?;
        let file = out
            .out
            .into_inner()
            .map_err(|e| io_err("write", &tmp)(e.into_error()))?;
        file.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(file);
        fs::rename(&tmp, path).map_err(io_err("rename temporary file onto", path))?;
        // The rename itself is durable only once the directory is synced.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err("fsync directory of", path))?;
        }
        Ok(())
    }

    /// Reads a snapshot written by [`Snapshot::write_to`] at the same `path`.
    pub fn read_from(path: &Path) -> Result<Snapshot, SnapshotError> {
        let file = File::open(path).map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            action: "open",
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| SnapshotError::Io {
                path: path.to_path_buf(),
                action: "stat",
                source,
            })?
            .len();
        Snapshot::read_input(path, &mut BufReader::with_capacity(1 << 16, file), len)
    }

    /// [`Snapshot::read_from`] for a file's contents already in memory
    /// (`path` only names it in errors). For the fuzz target and tests.
    pub fn read_bytes(path: &Path, bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        Snapshot::read_input(path, &mut &bytes[..], bytes.len() as u64)
    }

    fn read_input(path: &Path, source: &mut dyn Read, len: u64) -> Result<Snapshot, SnapshotError> {
        let mut input = WordReader {
            path,
            input: source,
            offset: 0,
            len,
            checksum: Checksum::default(),
        };
        let snapshot = Snapshot::decode(&mut input)?;
        let computed = input.checksum.0;
        let at = input.offset;
        let stored = input.word("checksum")?;
        if stored != computed {
            return Err(input.corrupt(
                at,
                format!("checksum {stored:#018x} does not match contents ({computed:#018x})"),
            ));
        }
        if input.offset != len {
            return Err(input.corrupt(
                input.offset,
                format!("{} bytes after the checksum", len - input.offset),
            ));
        }
        Ok(snapshot)
    }

    /// The layout, written. [`Snapshot::decode`] mirrors it line for line.
    fn encode(&self, out: &mut WordWriter) -> io::Result<()> {
        out.word(MAGIC)?;
        out.word(VERSION)?;
        out.word(self.generation)?;
        out.word(unix_nanos(self.written_at))?;
        out.word(self.sections.len() as u64)?;
        for section in &self.sections {
            out.word(section.fingerprint.0)?;
            out.word(section.entries.len() as u64)?;
            for e in &section.entries {
                out.word(e.key)?;
                out.word(e.remaining_ns)?;
            }
        }
        Ok(())
    }

    fn decode(input: &mut WordReader) -> Result<Snapshot, SnapshotError> {
        let (generation, written_at) = Self::decode_header(input)?;
        let at = input.offset;
        let count = input.word("section count")?;
        // Each section needs at least 16 bytes; refuse counts the file cannot hold
        // before allocating for them.
        if count > input.left() / 16 {
            return Err(input.corrupt(at, format!("{count} sections cannot fit in the file")));
        }
        let mut sections: Vec<RuleSection> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let section = Self::decode_section(input, &sections)?;
            sections.push(section);
        }
        Ok(Snapshot {
            generation,
            written_at,
            sections,
        })
    }

    /// Reads and checks the file's magic and version; returns its
    /// generation and when it was written.
    fn decode_header(input: &mut WordReader) -> Result<(u64, SystemTime), SnapshotError> {
        let magic = input.word("magic")?;
        if magic != MAGIC {
            return Err(SnapshotError::BadMagic {
                path: input.path.to_path_buf(),
                found: magic,
            });
        }
        let version = input.word("version")?;
        if version != VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                path: input.path.to_path_buf(),
                found: version,
            });
        }
        let generation = input.word("generation")?;
        let written_at = UNIX_EPOCH + Duration::from_nanos(input.word("written_at")?);
        Ok((generation, written_at))
    }

    /// Reads one rule's section, refusing a rule already among the `earlier`
    /// sections and an entry count the rest of the file cannot hold.
    fn decode_section(
        input: &mut WordReader,
        earlier: &[RuleSection],
    ) -> Result<RuleSection, SnapshotError> {
        let at = input.offset;
        let fingerprint = RuleFingerprint(input.word("rule fingerprint")?);
        if earlier.iter().any(|s| s.fingerprint == fingerprint) {
            return Err(input.corrupt(at, format!("rule {:#018x} appears twice", fingerprint.0)));
        }
        let at = input.offset;
        let entries = input.word("entry count")?;
        if entries > input.left() / 16 {
            return Err(input.corrupt(
                at,
                format!(
                    "rule {:#018x} claims {entries} entries but only {} bytes remain",
                    fingerprint.0,
                    input.left()
                ),
            ));
        }
        let mut list = Vec::with_capacity(entries as usize);
        for _ in 0..entries {
            list.push(Self::decode_entry(input)?);
        }
        Ok(RuleSection {
            fingerprint,
            entries: list,
        })
    }

    /// Reads one key's entry, refusing a remaining time longer than any
    /// quota allows.
    fn decode_entry(input: &mut WordReader) -> Result<SnapshotEntry, SnapshotError> {
        let key = input.word("entry key")?;
        let at = input.offset;
        let remaining_ns = input.word("entry remaining time")?;
        if remaining_ns > MAX_TOLERANCE.as_nanos() as u64 {
            return Err(input.corrupt(
                at,
                format!("remaining time {remaining_ns} ns is longer than any quota allows"),
            ));
        }
        Ok(SnapshotEntry { key, remaining_ns })
    }
}

/// `<file>.tmp` beside the target, so the rename never crosses file systems.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    // The pid keeps two processes writing at once (the old and new one
    // during an upgrade) from sharing a temporary file, the counter two
    // writes of one process (a periodic one and a drain's); the rename is
    // atomic, so the last one renamed wins whole.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    name.push(format!(".tmp.{}.{n}", std::process::id()));
    path.with_file_name(name)
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Word-at-a-time checksum: each step is a bijection of both the running
/// value and the word, so any single changed word changes the result.
#[derive(Debug)]
struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct WordWriter {
    out: BufWriter<File>,
    checksum: Checksum,
}

impl WordWriter {
    fn word(&mut self, w: u64) -> io::Result<()> {
        self.checksum.add(w);
        self.out.write_all(&w.to_le_bytes())
    }
}

struct WordReader<'a> {
    path: &'a Path,
    input: &'a mut dyn Read,
    offset: u64,
    len: u64,
    checksum: Checksum,
}

impl WordReader<'_> {
    fn word(&mut self, field: &'static str) -> Result<u64, SnapshotError> {
        let mut buf = [0u8; 8];
        match self.input.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(SnapshotError::Truncated {
                    path: self.path.to_path_buf(),
                    offset: self.offset,
                    field,
                });
            }
            Err(source) => {
                return Err(SnapshotError::Io {
                    path: self.path.to_path_buf(),
                    action: "read",
                    source,
                });
            }
        }
        self.offset += 8;
        let w = u64::from_le_bytes(buf);
        self.checksum.add(w);
        Ok(w)
    }

    fn left(&self) -> u64 {
        self.len.saturating_sub(self.offset)
    }

    fn corrupt(&self, offset: u64, reason: String) -> SnapshotError {
        SnapshotError::Corrupt {
            path: self.path.to_path_buf(),
            offset,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::Quota;
    use crate::store::{StoreConfig, key};

    const S: Duration = Duration::from_secs(1);

    fn at(d: Duration) -> MonoTime {
        MonoTime::ZERO + d
    }

    fn stores(fingerprints: &[u64]) -> RuleStores {
        let rules: Vec<_> = fingerprints
            .iter()
            .map(|&f| (RuleFingerprint(f), StoreConfig::with_max_keys(10_000)))
            .collect();
        RuleStores::build(&rules, None).unwrap()
    }

    /// A store with one key at its limit (T = 10 s, burst 1, TAT = now + 10 s)
    /// and `n` more keys, written at wall time `wall`.
    fn written(dir: &Path, n: u64, wall: SystemTime) -> (PathBuf, Quota) {
        let q = Quota::new(1, 10 * S, 1).unwrap();
        let rules = stores(&[7, 8]);
        let now = at(1000 * S);
        let store = rules.store(0).unwrap();
        assert!(store.check(key(0, 0, 1), &q, now, 1).is_allowed());
        for k in 0..n {
            store.check(key(0, 0, 100 + k), &q, now, 1);
        }
        rules.store(1).unwrap().check(5, &q, now, 1);
        let path = dir.join("limiter.snap");
        Snapshot::capture(42, &rules, now, wall)
            .write_to(&path)
            .unwrap();
        (path, q)
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let rules = stores(&[1, 2]);
        let q = Quota::new(5, 60 * S, 5).unwrap();
        let now = at(50 * S);
        for k in 0..1000u64 {
            rules
                .store((k % 2) as u32)
                .unwrap()
                .check(k, &q, now, 1 + (k % 3) as u32);
        }
        let snap = Snapshot::capture(9, &rules, now, wall);
        let path = dir.path().join("state").join("limiter.snap");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        snap.write_to(&path).unwrap();
        let files: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, ["limiter.snap"], "temporary file renamed away");
        let read = Snapshot::read_from(&path).unwrap();
        assert_eq!(read, snap);
        assert_eq!(
            read.sections.iter().map(|s| s.entries.len()).sum::<usize>(),
            1000
        );

        // A new process: different monotonic time, same wall time.
        let fresh = stores(&[1, 2]);
        let report = read.restore_into(&fresh, at(5 * S), wall);
        assert_eq!(report.restored(), 1000);
        assert_eq!(report.generation, 9);
        for k in 0..1000u64 {
            let rule = (k % 2) as u32;
            let old = rules.store(rule).unwrap().tat(k).unwrap();
            let new = fresh.store(rule).unwrap().tat(k).unwrap();
            assert_eq!(
                old.saturating_duration_since(now),
                new.saturating_duration_since(at(5 * S))
            );
        }
    }

    #[test]
    fn restore_honours_time_elapsed_while_down() {
        let dir = tempfile::tempdir().unwrap();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (path, q) = written(dir.path(), 0, wall);
        let snap = Snapshot::read_from(&path).unwrap();
        let limited = key(0, 0, 1);
        // (wall time since writing, key restored, next request allowed)
        let cases = [
            (Duration::ZERO, true, false),
            (4 * S, true, false),
            (10 * S - Duration::from_nanos(1), true, false),
            (10 * S, false, true),
            (3600 * S, false, true),
        ];
        for (elapsed, restored, allowed) in cases {
            let fresh = stores(&[7, 8]);
            let now = at(3 * S); // the new process's clock starts elsewhere
            let report = snap.restore_into(&fresh, now, wall + elapsed);
            assert_eq!(report.elapsed, elapsed);
            assert_eq!(
                report.rules[0].restored,
                usize::from(restored),
                "{elapsed:?}"
            );
            assert_eq!(
                report.rules[0].expired,
                usize::from(!restored),
                "{elapsed:?}"
            );
            let store = fresh.store(0).unwrap();
            assert_eq!(
                store.check(limited, &q, now, 1).is_allowed(),
                allowed,
                "{elapsed:?}"
            );
        }
    }

    #[test]
    fn wall_clock_going_back_restores_full_debt() {
        let dir = tempfile::tempdir().unwrap();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (path, _) = written(dir.path(), 0, wall);
        let fresh = stores(&[7, 8]);
        let now = at(S);
        let report = Snapshot::read_from(&path)
            .unwrap()
            .restore_into(&fresh, now, wall - 60 * S);
        assert_eq!(report.elapsed, Duration::ZERO);
        assert_eq!(
            fresh.store(0).unwrap().tat(key(0, 0, 1)),
            Some(now + 10 * S)
        );
    }

    #[test]
    fn only_unchanged_rules_get_state_and_the_report_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (path, _) = written(dir.path(), 99, wall);
        // Rule 8 changed into rule 9; rule 7 is unchanged.
        let fresh = stores(&[9, 7]);
        let report = Snapshot::read_from(&path)
            .unwrap()
            .restore_into(&fresh, at(S), wall);
        let lines: Vec<_> = report
            .rules
            .iter()
            .map(|r| (r.fingerprint.0, r.section_found, r.in_file, r.restored))
            .collect();
        assert_eq!(lines, [(9, false, 0, 0), (7, true, 100, 100)]);
        assert_eq!(report.discarded, [(RuleFingerprint(8), 1)]);
        assert_eq!(fresh.store(1).unwrap().len(), 100);
        assert!(fresh.store(0).unwrap().is_empty());
    }

    #[test]
    fn damaged_files_are_errors_naming_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (path, _) = written(dir.path(), 3, wall);
        let good = fs::read(&path).unwrap();
        // 5 header words, section 7 (2 + 4 x 2 words), section 8 (2 + 2), checksum.
        assert_eq!(good.len(), 8 * (5 + 10 + 4 + 1));
        let set = |offset: usize, word: u64| {
            let mut b = good.clone();
            b[offset..offset + 8].copy_from_slice(&word.to_le_bytes());
            b
        };
        let flip = |offset: usize| {
            let mut b = good.clone();
            b[offset] ^= 0x01;
            b
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "truncated at offset 0 while reading magic"),
            ("magic", set(0, 7), "not a weir limiter snapshot"),
            (
                "version",
                set(8, 2),
                "version 2 at offset 8 is not supported",
            ),
            (
                "header cut",
                good[..20].to_vec(),
                "truncated at offset 16 while reading generation",
            ),
            (
                "entry cut",
                good[..100].to_vec(),
                "claims 4 entries but only 44 bytes remain",
            ),
            (
                "checksum cut",
                good[..good.len() - 8].to_vec(),
                "truncated at offset 152 while reading checksum",
            ),
            (
                "sections",
                set(32, u64::MAX),
                "corrupt at offset 32: 18446744073709551615 sections",
            ),
            (
                "entries",
                set(48, 1 << 40),
                "corrupt at offset 48: rule 0x0000000000000007 claims",
            ),
            ("bit flip", flip(60), "corrupt at offset 152: checksum"),
            (
                "trailing",
                [good.clone(), vec![0; 8]].concat(),
                "corrupt at offset 160: 8 bytes after the checksum",
            ),
            (
                "remaining",
                set(64, u64::MAX),
                "corrupt at offset 64: remaining time",
            ),
            (
                "duplicate",
                set(120, 7),
                "corrupt at offset 120: rule 0x0000000000000007 appears twice",
            ),
        ];
        let bad = dir.path().join("bad.snap");
        for (name, bytes, want) in cases {
            fs::write(&bad, &bytes).unwrap();
            let err = Snapshot::read_from(&bad).unwrap_err().to_string();
            assert!(err.contains("bad.snap"), "{name}: {err}");
            assert!(err.contains(want), "{name}: {err}");
        }
        let missing = Snapshot::read_from(&dir.path().join("missing.snap")).unwrap_err();
        assert!(
            missing.to_string().contains("missing.snap: cannot open"),
            "{missing}"
        );
    }
}
