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

use super::ports::{find_program, free_addrs, start_on_loopback};
use super::process::{FixtureError, ServerProcess};

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
        // It listens on TCP too, on the same port.
        let (process, addrs, dir) = start_on_loopback(
            "dnsmasq",
            &[],
            || free_addrs("dnsmasq", 1),
            |dir, addrs| {
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
                    .arg(format!("--port={}", addrs[0].port()))
                    .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
                    .args(records);
                Ok(command)
            },
        )
        .await?;
        Ok(Dnsmasq {
            process,
            addr: addrs[0],
            _dir: dir,
        })
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
