//! A DNS server guard: one `dnsmasq` (Debian's `dnsmasq-base`) answering
//! only the records a test gives it, on a loopback port, in the
//! foreground.
//!
//! Owns: the command line (no upstream servers, no hosts file, no
//! resolv.conf; the test's `--host-record`, `--ptr-record`, `--address`
//! lines; names under `.test` (and the test's `--local` zones) answered
//! locally, so a name it does
//! not know is NXDOMAIN or NODATA rather than REFUSED, as a real zone
//! answers), waiting for the port, queries logged to stderr.
//!
//! Does not: resolve anything outside its records, or run as a daemon.
//!
//! ```ignore
//! let dns = Dnsmasq::start(&["--host-record=crawl-1.googlebot.test,127.0.0.10"]).await?;
//! // dns.addr(): 127.0.0.1:PORT, UDP and TCP
//! ```

use std::net::SocketAddr;
use std::process::Command;

use super::ports::{PORT_ATTEMPTS, find_program, free_addrs, is_port_taken};
use super::process::{FixtureError, START_DEADLINE, ServerProcess, temp_dir};

/// A running dnsmasq; stopped and reaped on drop.
pub struct Dnsmasq {
    process: ServerProcess,
    addr: SocketAddr,
    // Last: the dir must outlive the process.
    _dir: tempfile::TempDir,
}

impl Dnsmasq {
    /// Starts dnsmasq with `records` (dnsmasq options; a reverse zone is
    /// answered locally with `--local=/2.0.192.in-addr.arpa/`), answering
    /// names under `.test` locally.
    pub async fn start(records: &[&str]) -> Result<Dnsmasq, FixtureError> {
        let program = find_program("dnsmasq")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir("dnsmasq")?;
            let addr = free_addrs("dnsmasq", 1)?[0];
            let mut command = Command::new(&program);
            command
                .args([
                    "--keep-in-foreground",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    "--no-poll",
                    "--listen-address=127.0.0.1",
                    "--bind-interfaces",
                    "--user=root",
                    "--group=root",
                    "--log-queries",
                    "--log-facility=-",
                    "--local=/test/",
                ])
                .arg(format!("--port={}", addr.port()))
                .arg(format!(
                    "--pid-file={}",
                    dir.path().join("dnsmasq.pid").display()
                ))
                .args(records);
            let mut process = ServerProcess::spawn("dnsmasq", command, dir.path(), Vec::new())?;
            // It listens on TCP too, on the same port.
            match process.wait_accepting(&[addr], START_DEADLINE).await {
                Ok(()) => {
                    return Ok(Dnsmasq {
                        process,
                        addr,
                        _dir: dir,
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && is_port_taken(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its log: every query it answered, and how.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// How many queries it has answered so far.
    pub fn queries(&self) -> usize {
        self.logs().matches(": query[").count()
    }
}
