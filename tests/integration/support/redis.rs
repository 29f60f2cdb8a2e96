//! A Redis process guard: one `redis-server` on a loopback port with no
//! persistence, in a fresh temp dir.
//!
//! Owns: the config (bind 127.0.0.1, own port, pid file and dir, `save ""`,
//! no AOF, log to stdout) plus any extra lines a test adds, and waiting for
//! the port.
//!
//! Does not: speak RESP; tests use raw RESP over a TcpStream or weir's client.
//!
//! ```ignore
//! let redis = Redis::builder().start().await?;
//! let mut s = TcpStream::connect(redis.addr()).await?;
//! s.write_all(b"*1\r\n$4\r\nPING\r\n").await?; // reads "+PONG\r\n"
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::ports::{find_program, free_addrs, start_on_loopback};
use super::process::{FixtureError, ServerProcess, Signal, write_file};

/// Builds a [`Redis`].
pub struct RedisBuilder {
    extra: String,
    addr: Option<SocketAddr>,
    tls: bool,
    sentinel: bool,
}

impl RedisBuilder {
    /// Extra `redis.conf` lines (e.g. `maxmemory 10mb`).
    pub fn config(mut self, lines: impl Into<String>) -> Self {
        self.extra = lines.into();
        self
    }

    /// Speak only TLS on the port, with a server certificate for 127.0.0.1
    /// from a CA of its own ([`Redis::ca_file`]); clients need no certificate.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Run as a Sentinel (`redis-server CONF --sentinel`); its `sentinel
    /// monitor ...` lines go in [`Self::config`]. Sentinel rewrites its
    /// config file, which lives in the fixture's own dir.
    pub fn sentinel(mut self) -> Self {
        self.sentinel = true;
        self
    }

    /// Listen on this address (to restart a killed Redis where clients expect it).
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    pub async fn start(self) -> Result<Redis, FixtureError> {
        let program = find_program("redis-server")?;
        let (process, addrs, dir) = start_on_loopback(
            "redis",
            &[],
            || match self.addr {
                Some(a) => Ok(vec![a]),
                None => free_addrs("redis", 1),
            },
            |dir, addrs| {
                if self.tls {
                    write_certificates(dir)?;
                }
                let conf = dir.join("redis.conf");
                write_file("redis", &conf, &self.render(dir, addrs[0]))?;
                let mut command = Command::new(&program);
                command.arg(&conf);
                if self.sentinel {
                    command.arg("--sentinel");
                }
                Ok(command)
            },
        )
        .await?;
        Ok(Redis {
            process,
            addr: addrs[0],
            dir,
        })
    }

    fn render(&self, dir: &Path, addr: SocketAddr) -> String {
        let port = if self.tls {
            format!(
                "port 0\ntls-port {port}\ntls-cert-file {d}/server.pem\n\
                 tls-key-file {d}/server.key\ntls-ca-cert-file {d}/ca.pem\ntls-auth-clients no",
                port = addr.port(),
                d = dir.display()
            )
        } else {
            format!("port {}", addr.port())
        };
        format!(
            "bind 127.0.0.1\n\
             {port}\n\
             dir {d}\n\
             pidfile {d}/redis.pid\n\
             logfile \"\"\n\
             daemonize no\n\
             save \"\"\n\
             appendonly no\n\
             {extra}\n",
            d = dir.display(),
            extra = self.extra,
        )
    }
}

/// A running Redis; stopped and reaped on drop.
pub struct Redis {
    process: ServerProcess,
    addr: SocketAddr,
    // Last: the dir must outlive the process.
    dir: tempfile::TempDir,
}

impl Redis {
    pub fn builder() -> RedisBuilder {
        RedisBuilder {
            extra: String::new(),
            addr: None,
            tls: false,
            sentinel: false,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA that signed a TLS Redis's certificate (PEM).
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }

    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        self.process.signal(signal)
    }
}

/// A CA and a server certificate for 127.0.0.1 signed by it, as PEM files
/// in `dir`: `ca.pem`, `server.pem`, `server.key`.
fn write_certificates(dir: &Path) -> Result<(), FixtureError> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let fail = |e: rcgen::Error| FixtureError::Setup {
        server: "redis".to_owned(),
        what: "TLS certificates".to_owned(),
        source: std::io::Error::other(e.to_string()),
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(fail)?)
        .map_err(fail)?;
    let key = KeyPair::generate().map_err(fail)?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .map_err(fail)?
        .signed_by(&key, &ca)
        .map_err(fail)?;
    write_file("redis", &dir.join("ca.pem"), &ca.pem())?;
    write_file("redis", &dir.join("server.pem"), &server.pem())?;
    write_file("redis", &dir.join("server.key"), &key.serialize_pem())?;
    Ok(())
}
