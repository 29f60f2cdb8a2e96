//! An HAProxy process guard: one foreground HAProxy (`-db`) started from a
//! config body in a fresh temp dir.
//!
//! Owns: the `global` section (own pid file, `nbthread 1` unless overridden,
//! extra global lines such as `maxconn 10000` + `no strict-limits`),
//! OS-chosen loopback ports handed to the config closure, waiting for them.
//!
//! Does not: run master-worker mode or seamless reload (that needs `-W`,
//! `expose-fd listeners` and a stats socket; add it when a test needs it).
//!
//! ```ignore
//! let haproxy = Haproxy::builder()
//!     .config(move |addrs| format!(
//!         "defaults\n mode tcp\n timeout connect 5s\n timeout client 30s\n timeout server 30s\n\
//!          listen l\n bind {}\n server s1 {} send-proxy-v2\n", addrs[0], upstream))
//!     .start()
//!     .await?;
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::ports::{find_program, free_addrs, start_on_loopback};
use super::process::{ConfigBody, ConfigFn, FixtureError, ServerProcess, Signal, write_file};

/// Builds a [`Haproxy`]. The config closure returns everything after
/// `global` (defaults, frontends, backends) for the allocated addresses.
pub struct HaproxyBuilder {
    ports: usize,
    global: String,
    config: Option<ConfigBody>,
}

impl HaproxyBuilder {
    /// How many listen addresses to allocate (default 1).
    pub fn ports(mut self, n: usize) -> Self {
        self.ports = n;
        self
    }

    /// Extra lines for the `global` section. An `nbthread` line here replaces
    /// the default `nbthread 1`.
    pub fn global(mut self, lines: impl Into<String>) -> Self {
        self.global = lines.into();
        self
    }

    /// Everything after `global`.
    pub fn config(mut self, body: impl ConfigFn) -> Self {
        self.config = Some(Box::new(body));
        self
    }

    pub async fn start(self) -> Result<Haproxy, FixtureError> {
        let program = find_program("haproxy")?;
        let (process, addrs, dir) = start_on_loopback(
            "haproxy",
            &[],
            || free_addrs("haproxy", self.ports),
            |dir, addrs| {
                let cfg = dir.join("haproxy.cfg");
                write_file("haproxy", &cfg, &self.render(dir, addrs))?;
                let mut command = Command::new(&program);
                command.arg("-db").arg("-f").arg(&cfg);
                Ok(command)
            },
        )
        .await?;
        Ok(Haproxy {
            process,
            addrs,
            dir,
        })
    }

    fn render(&self, dir: &Path, addrs: &[SocketAddr]) -> String {
        let threads = if self.global.contains("nbthread") {
            ""
        } else {
            "    nbthread 1\n"
        };
        let body = self.config.as_ref().map(|f| f(addrs)).unwrap_or_default();
        format!(
            "global\n    pidfile {pid}\n{threads}{extra}\n\n{body}\n",
            pid = dir.join("haproxy.pid").display(),
            extra = self
                .global
                .lines()
                .map(|l| format!("    {}\n", l.trim()))
                .collect::<String>(),
        )
    }
}

/// A running HAProxy; stopped and reaped on drop.
pub struct Haproxy {
    process: ServerProcess,
    addrs: Vec<SocketAddr>,
    // Last: the dir must outlive the process.
    dir: tempfile::TempDir,
}

impl Haproxy {
    pub fn builder() -> HaproxyBuilder {
        HaproxyBuilder {
            ports: 1,
            global: String::new(),
            config: None,
        }
    }

    /// The `i`th allocated listen address (panics if out of range: a test bug).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.addrs[i]
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// stdout + stderr (HAProxy's warnings and `log stderr` lines).
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        self.process.signal(signal)
    }
}
