//! Loopback ports for servers that cannot report an OS-chosen port (nginx,
//! HAProxy, Redis, dnsmasq), lookup of their executables, and the start
//! sequence those fixtures share.
//!
//! Owns: asking the OS for free 127.0.0.1 ports, telling "port taken" start
//! failures apart so a fixture can retry with fresh ports
//! ([`start_on_loopback`] does), and finding server binaries in PATH or the
//! sbin directories Debian installs them to.
//!
//! Does not: reserve ports. Between our probe and the server's bind another
//! process may take the port; fixtures retry a few times instead.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::process::{FixtureError, START_DEADLINE, ServerProcess, temp_dir};

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

/// Starts a server on loopback ports it cannot choose itself (nginx,
/// HAProxy, Redis, dnsmasq): in a fresh temp dir, on the addresses
/// `choose_addrs` gives, `command` writes its config and returns the command
/// that runs it; spawned as a [`ServerProcess`] (whose error messages also
/// carry the `extra_logs` files of the dir), it is waited for until every
/// address accepts. A start that failed because another process took a port
/// between our probe and the server's bind is tried again with a fresh dir
/// and fresh addresses, up to [`PORT_ATTEMPTS`] times. Returns the process,
/// the addresses it accepts on, and the dir it runs in.
pub async fn start_on_loopback(
    server: &str,
    extra_logs: &[&str],
    choose_addrs: impl Fn() -> Result<Vec<SocketAddr>, FixtureError>,
    command: impl Fn(&Path, &[SocketAddr]) -> Result<Command, FixtureError>,
) -> Result<(ServerProcess, Vec<SocketAddr>, tempfile::TempDir), FixtureError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let dir = temp_dir(server)?;
        let addrs = choose_addrs()?;
        let logs = extra_logs
            .iter()
            .map(|name| dir.path().join(name))
            .collect();
        let mut process =
            ServerProcess::spawn(server, command(dir.path(), &addrs)?, dir.path(), logs)?;
        match process.wait_accepting(&addrs, START_DEADLINE).await {
            Ok(()) => {
                return Ok((process, addrs, dir));
            }
            Err(e) if attempt < PORT_ATTEMPTS && is_port_taken(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// An address on loopback that nothing listens on (yet): bound to learn a
/// free port, then closed. On 127.0.0.253, which no other test binds: on
/// 127.0.0.1 the port, once closed, went to another test's listener now
/// and then, and "an app that never comes" answered (a CI run of
/// `readiness_stops_waiting_at_the_timeout`).
pub fn unused_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.253:0").unwrap();
    l.local_addr().unwrap()
}
