//! Loopback ports for servers that cannot report an OS-chosen port (nginx,
//! HAProxy, Redis), and lookup of their executables.
//!
//! Owns: asking the OS for free 127.0.0.1 ports, telling "port taken" start
//! failures apart so a fixture can retry with fresh ports, and finding server
//! binaries in PATH or the sbin directories Debian installs them to.
//!
//! Does not: reserve ports. Between our probe and the server's bind another
//! process may take the port; fixtures retry a few times instead.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;

use super::process::FixtureError;

/// How many times a fixture tries fresh ports when a start fails because a
/// port was taken between our probe and the server's bind.
pub const PORT_ATTEMPTS: usize = 3;

/// `n` distinct free ports on 127.0.0.1, chosen by the OS. All probes are held
/// open together so the OS cannot return the same port twice.
pub fn free_addrs(server: &str, n: usize) -> Result<Vec<SocketAddr>, FixtureError> {
    let probes = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .and_then(|probes| probes.iter().map(TcpListener::local_addr).collect())
        .map_err(|source| FixtureError::Setup {
            server: server.to_owned(),
            what: "free loopback port".to_owned(),
            source,
        })?;
    Ok(probes)
}

/// True when a failed start looks like a lost race for a port, worth a retry.
pub fn is_port_taken(error: &FixtureError) -> bool {
    match error {
        FixtureError::ExitedEarly { logs, .. } | FixtureError::NotReady { logs, .. } => {
            logs.contains("Address already in use") || logs.contains("Address in use")
        }
        _ => false,
    }
}

/// Finds a server executable: `$WEIR_TEST_<NAME>` (upper case, `-` as `_`)
/// if set, else PATH, else the sbin directories (which a non-root PATH lacks).
pub fn find_program(name: &str) -> Result<PathBuf, FixtureError> {
    let env_key = format!("WEIR_TEST_{}", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&env_key) {
        return Ok(PathBuf::from(path));
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let sbin = ["/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin"].map(PathBuf::from);
    path_dirs
        .into_iter()
        .chain(sbin)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| FixtureError::Setup {
            server: name.to_owned(),
            what: format!(
                "executable (not in PATH or sbin; run scripts/install-test-deps.sh or set {env_key})"
            ),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
}
