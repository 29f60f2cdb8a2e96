//! The challenge's own key, for a weir nobody gave one (`[challenge]`
//! without `keys`, or no `[challenge]` at all): generated once and kept in
//! weir's state directory, so every process that shares the directory (a
//! restart, an upgrade, the two colours of a blue/green switch on one host)
//! signs and verifies passes alike; without a directory, one per process.
//!
//! Owns: where the key lives, creating it without a race, reading it back.
//! Does not: decide whether a challenge is shown (`proxy::deciding`), or sign
//! anything ([`super::Keyring`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine as _;

/// The key file's name in the state directory.
pub const FILE_NAME: &str = "challenge.key";

/// Random bytes in a generated key (256 bits, as `openssl rand -base64 32`).
const KEY_BYTES: usize = 32;

/// Why the state directory's key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{path}: cannot read the challenge key: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot write the challenge key: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: the challenge key is {len} bytes, too short to sign with (at least 32)")]
    Short { path: PathBuf, len: usize },
}

/// The state directory: `state.dir`, else systemd's `$STATE_DIRECTORY`,
/// else the directory of `state.snapshot_file`; `None` when none is set.
pub fn state_dir(state: &crate::config::StateConfig) -> Option<PathBuf> {
    (state.dir.as_deref().map(PathBuf::from))
        .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from))
        .or_else(|| {
            let file = Path::new(state.snapshot_file.as_deref()?);
            Some(file.parent()?.to_path_buf()).filter(|d| !d.as_os_str().is_empty())
        })
}

/// Whether `config` signs with weir's own key: a challenge that is on, or
/// the visit cookie, and no `challenge.keys` given.
pub fn wanted(config: &crate::config::Config) -> bool {
    let keys_given = config
        .challenge
        .as_ref()
        .is_some_and(|c| !c.keys.is_empty());
    let challenge_on = config.challenge.as_ref().is_none_or(|c| c.enabled);
    !keys_given && (challenge_on || config.visit.enabled)
}

/// Before a gateway is built for `config` by a process that serves it
/// (`weir run`, a reload; never `weir check`, which writes nothing): the
/// state directory's key created if it is wanted and missing, and with a
/// shared Redis, the fleet's key read from it ([`super::fleet_key`]). A
/// failure is logged, and the gateway then signs with this process's own
/// key.
pub fn prepare(config: &crate::config::Config) {
    if !wanted(config) {
        return;
    }
    prepare_state_key(&config.state);
    prepare_fleet_key(&config.state);
}

/// The state directory's key, created if missing.
fn prepare_state_key(state: &crate::config::StateConfig) {
    let Some(dir) = state_dir(state) else {
        return;
    };
    let path = dir.join(FILE_NAME);
    match read_or_create(&path) {
        Ok(_) => {
            if let Some(mode) = loose_mode(&path) {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the challenge key can be read by others than its owner: anyone who \
                     reads it can sign passes; make it 0600 (chmod 600)"
                );
            }
        }
        Err(e) => own_key_warning(&e),
    }
}

/// The permission bits of the key file at `path` when others than its
/// owner may read or write it (anything wider than 0600): whoever reads
/// the key can sign passes for any network.
pub fn loose_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// Reads the fleet's key from the shared Redis, offering this
/// instance's own ([`super::fleet_key`]); a failure is logged, and the
/// instance signs with the fleet's key it read before, if any, else its
/// own.
fn prepare_fleet_key(state: &crate::config::StateConfig) {
    let own = signing_key(state);
    match super::fleet_key::fetch(state, &own) {
        Ok(Some(_)) => tracing::info!("the challenge signs with the fleet's key, kept in Redis"),
        Ok(None) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot read the fleet's challenge key from Redis: this instance signs with \
             its own, and a pass from another instance is not good here (give every \
             instance the same challenge.keys)"
        ),
    }
}

/// The keys a gateway given none signs and verifies with: the fleet's
/// (kept in Redis, [`super::fleet_key`]) first when this process has read
/// one, then [`signing_key`]. The first signs; both verify, so a pass this
/// instance signed before it joined the fleet's key stays good.
pub fn signing_keys(state: &crate::config::StateConfig) -> Vec<String> {
    let own = signing_key(state);
    match super::fleet_key::current().filter(|_| state.shares_through_redis()) {
        Some(fleet) if fleet != own => vec![fleet, own],
        _ => vec![own],
    }
}

/// The key to sign with: the state directory's if it holds one, else this
/// process's own (no directory, or nothing prepared it: `weir check`).
pub fn state_key(dir: Option<&Path>) -> Result<String, KeyFileError> {
    let Some(path) = dir.map(|d| d.join(FILE_NAME)) else {
        return Ok(process_key().to_owned());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => checked(&path, text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(process_key().to_owned()),
        Err(source) => Err(KeyFileError::Read { path, source }),
    }
}

/// The key a gateway signs with when it was given none: [`state_key`] of the
/// state directory, or, when that cannot be read, this process's own
/// (logged: its passes end with the process).
pub fn signing_key(state: &crate::config::StateConfig) -> String {
    let dir = state_dir(state);
    state_key(dir.as_deref()).unwrap_or_else(|e| {
        own_key_warning(&e);
        process_key().to_owned()
    })
}

fn own_key_warning(e: &KeyFileError) {
    tracing::warn!(
        error = %e,
        "the challenge signs with a key of this process's own: its passes end with it"
    );
}

/// This process's key: generated at first use, the same for every reload.
fn process_key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(generate)
}

fn generate() -> String {
    let bytes: [u8; KEY_BYTES] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Reads the key at `path`; creates it first if it does not exist. The new
/// key is written whole to a private temporary file, then linked to `path`,
/// which fails if the name exists: of two processes starting at once one
/// links, the other reads what it linked, and no reader sees half a key.
fn read_or_create(path: &Path) -> Result<String, KeyFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => return checked(path, text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KeyFileError::Read {
                path: path.to_owned(),
                source,
            });
        }
    }
    let write = |source| KeyFileError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(write)?;
    let temp = dir.join(format!(
        ".{FILE_NAME}.{}.{:x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let key = generate();
    let mut file = private_file(&temp).map_err(write)?;
    file.write_all(key.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(write)?;
    // `hard_link` fails if the name exists: the first writer wins, and a
    // process that lost the race reads the winner's key.
    let linked = std::fs::hard_link(&temp, path);
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
                path: path.to_owned(),
                source,
            })?;
            checked(path, text)
        }
        Err(e) => Err(write(e)),
    }
}

/// A new file only its owner may read (the key signs every pass).
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn checked(path: &Path, text: String) -> Result<String, KeyFileError> {
    let key = text.trim().to_owned();
    if key.len() < 32 {
        return Err(KeyFileError::Short {
            path: path.to_owned(),
            len: key.len(),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_and_read_back_by_every_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            state_key(Some(dir.path())).expect("not prepared"),
            state_key(None).expect("the process's"),
            "nothing prepared: the process's own, and nothing written"
        );
        assert!(!dir.path().join(FILE_NAME).exists());
        let first = read_or_create(&dir.path().join(FILE_NAME)).expect("created");
        assert!(first.len() >= 32, "{first}");
        let again = state_key(Some(dir.path())).expect("read");
        assert_eq!(first, again);
        let path = dir.path().join(FILE_NAME);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only weir reads it");
        let other = tempfile::tempdir().expect("tempdir");
        let another = read_or_create(&other.path().join(FILE_NAME)).expect("another");
        assert_ne!(first, another);
    }

    #[test]
    fn processes_starting_at_once_agree_on_one_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| read_or_create(&dir.path().join(FILE_NAME)).expect("key")))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    }

    #[test]
    fn a_short_or_unreadable_key_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE_NAME), "short\n").expect("write");
        let e = state_key(Some(dir.path()))
            .expect_err("too short")
            .to_string();
        assert!(e.contains("challenge.key") && e.contains("5 bytes"), "{e}");
        let not_a_dir = dir.path().join(FILE_NAME);
        let e = read_or_create(&not_a_dir.join(FILE_NAME)).expect_err("a file, not a directory");
        assert!(e.to_string().contains("challenge.key"), "{e}");
    }

    /// Issue 54: an existing key file others may read is warned about.
    #[test]
    fn a_key_file_wider_than_0600_is_noticed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        read_or_create(&path).expect("created");
        assert_eq!(loose_mode(&path), None, "weir writes it 0600");
        for (mode, loose) in [
            (0o644, true),
            (0o640, true),
            (0o606, true),
            (0o400, false),
            (0o600, false),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert_eq!(loose_mode(&path), loose.then_some(mode), "{mode:o}");
        }
    }

    #[test]
    fn without_a_directory_the_process_keeps_one_key() {
        assert_eq!(state_key(None).expect("key"), state_key(None).expect("key"));
    }
}
